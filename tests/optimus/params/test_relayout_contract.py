"""The parameter re-layout keeps PyTorch's parameter contract: ``requires_grad``
changes, gradient hooks on the original parameters, ``deepcopy``, ``load_state_dict`` (also with
``assign=True``), ``.to()``, optimizers built before or after, and ``optimize()`` inside
``torch.inference_mode()``. Each test trains the optimized model next to an unfused copy and
compares what a user can observe: outputs, ``.grad`` (presence and values), parameter values."""

from __future__ import annotations

import copy
from collections.abc import Callable

import pytest
import torch
from torch import fx, nn

import optimus
from models.synthetic_towers import Towers
from optimus.params.relayout import PREFIX, RelayoutParams


def group(g: int = 4, k: int = 3, n: int = 5) -> Towers:
    """G independent linears over the G slices of a [G, B, K] input: one batch_linear group (the
    shared synthetic towers model, models/synthetic_towers.py, in that configuration)."""
    return Towers(g, k, n, slices="index", body=("linear", "tanh"))


def config() -> optimus.OptimusConfig:
    return optimus.OptimusConfig(layout=RelayoutParams())


def optimized(model: nn.Module, x: torch.Tensor, capture: str = "export") -> nn.Module:
    """``optimize`` with the re-layout, through Dynamo export (what users call) or an FX trace (the
    parameters then live in submodules of the GraphModule)."""
    source = fx.symbolic_trace(model) if capture == "fx" else model
    gm = optimus.optimize(source, (x,), config=config())
    assert [n for n, _ in gm.named_parameters() if n.startswith(PREFIX)], "nothing was re-laid out"
    return gm


def setup(seed: int = 0, capture: str = "export") -> tuple[Towers, Towers, nn.Module, torch.Tensor]:
    torch.manual_seed(seed)
    model, x = group(), torch.randn(4, 2, 3)
    ref = copy.deepcopy(model)
    return model, ref, optimized(model, x, capture), x


def loss(out: torch.Tensor) -> torch.Tensor:
    return out.pow(2).sum()


# float32's tolerances, also once a model is converted to float64: its values and gradients then
# carry the float32 steps before the conversion, where one batched GEMM and separate GEMMs sum in
# different orders (which order, and so the last bit, depends on the CPU's kernels: on one machine
# float64's own 1e-7 held, on another linears.3.weight.grad was 3e-7 off)
F32_TOL = {"rtol": 1.3e-6, "atol": 1e-5}


def assert_same_params(model: nn.Module, ref: nn.Module) -> None:
    """Values and ``.grad`` (presence and values) of every parameter, by name."""
    got, want = dict(model.named_parameters()), dict(ref.named_parameters())
    assert list(got) == list(want)
    for name in want:
        torch.testing.assert_close(got[name], want[name], msg=name, **F32_TOL)
        g, w = got[name].grad, want[name].grad
        assert (g is None) == (w is None), f"{name}: grad {g is not None} vs unfused {w is not None}"
        if w is not None:
            torch.testing.assert_close(g, w, msg=f"{name}.grad", **F32_TOL)


def train(
    pairs: list[tuple[Callable[[torch.Tensor], torch.Tensor], torch.optim.Optimizer]],
    x: torch.Tensor,
    steps: int,
) -> None:
    """``steps`` of zero_grad/forward/backward/step on every (forward, optimizer) pair."""
    for _ in range(steps):
        for forward, opt in pairs:
            opt.zero_grad()
            loss(forward(x)).backward()
            opt.step()


# --- 8a: requires_grad changed after optimize -------------------------------------------------


@pytest.mark.parametrize("opt_cls", [torch.optim.SGD, torch.optim.Adam])
def test_freezing_a_tower_after_optimize_stops_its_training(opt_cls: type[torch.optim.Optimizer]) -> None:
    model, ref, gm, x = setup(1)
    kw = {"lr": 0.1, "momentum": 0.9} if opt_cls is torch.optim.SGD else {"lr": 0.05}
    opt, opt_ref = opt_cls(model.parameters(), **kw), opt_cls(ref.parameters(), **kw)
    train([(gm, opt), (ref, opt_ref)], x, 1)
    for m in (model, ref):
        m.linears[1].weight.requires_grad_(False)
        m.linears[1].weight.grad = None
    frozen = model.linears[1].weight.detach().clone()
    train([(gm, opt), (ref, opt_ref)], x, 3)
    assert model.linears[1].weight.grad is None
    torch.testing.assert_close(model.linears[1].weight.detach(), frozen)  # not updated
    assert_same_params(model, ref)
    torch.testing.assert_close(gm(x), ref(x))


def test_a_frozen_tower_keeps_the_grad_it_had() -> None:
    model, ref, gm, x = setup(2)
    for forward in (gm, ref):
        loss(forward(x)).backward()
    for m in (model, ref):
        m.linears[0].weight.requires_grad_(False)  # frozen without zero_grad: its .grad stays as is
    for forward in (gm, ref):
        loss(forward(x)).backward()  # accumulates into the others only
    assert_same_params(model, ref)


def test_unfreezing_after_optimize_trains_again_and_all_frozen_needs_no_grad() -> None:
    torch.manual_seed(3)
    model, x = group(), torch.randn(4, 2, 3)
    for p in model.parameters():
        p.requires_grad_(False)  # a frozen model, optimized, then fine-tuned
    ref = copy.deepcopy(model)
    gm = optimized(model, x)
    assert gm(x).requires_grad is ref(x).requires_grad is False  # nothing to differentiate
    for m in (model, ref):
        m.linears[2].weight.requires_grad_(True)
        m.linears[2].bias.requires_grad_(True)
    opt = torch.optim.SGD([p for p in model.parameters() if p.requires_grad], lr=0.1)
    opt_ref = torch.optim.SGD([p for p in ref.parameters() if p.requires_grad], lr=0.1)
    train([(gm, opt), (ref, opt_ref)], x, 2)
    assert model.linears[2].weight.grad is not None
    assert_same_params(model, ref)
    for m in (model, ref):
        for p in m.parameters():
            p.requires_grad_(False)
    assert gm(x).requires_grad is ref(x).requires_grad is False


def test_unfreezing_through_the_optimized_module_trains_a_group_frozen_at_optimize() -> None:
    torch.manual_seed(31)
    model, x = group(), torch.randn(4, 2, 3)
    model.requires_grad_(False)
    ref = copy.deepcopy(model)
    gm = optimized(model, x)
    gm.requires_grad_(True)  # also sets the stacked parameters' flag (they are gm's parameters)
    ref.requires_grad_(True)
    opt, opt_ref = (torch.optim.SGD(m.parameters(), lr=0.1) for m in (model, ref))
    train([(gm, opt), (ref, opt_ref)], x, 2)
    assert_same_params(model, ref)


# --- 8b: gradient hooks on the original parameters --------------------------------------------


def test_tensor_hooks_on_original_parameters_fire_with_the_unfused_gradients() -> None:
    model, ref, gm, x = setup(4)
    seen: dict[str, list[torch.Tensor]] = {"fused": [], "ref": []}
    for key, m in (("fused", model), ("ref", ref)):
        m.linears[1].weight.register_hook(lambda g, key=key: seen[key].append(g.clone()))  # type: ignore[misc]
        m.linears[2].weight.register_hook(lambda g: g * 3)  # a returned tensor replaces the gradient
        m.linears[2].bias.register_hook(lambda g: g.mul_(2))  # so does an in-place change
    for forward in (gm, ref):
        loss(forward(x)).backward()
    assert len(seen["fused"]) == len(seen["ref"]) == 1
    torch.testing.assert_close(seen["fused"][0], seen["ref"][0])
    assert seen["fused"][0].is_contiguous()
    assert_same_params(model, ref)


def test_hooks_registered_before_optimize_fire() -> None:
    torch.manual_seed(41)
    model, x = group(), torch.randn(4, 2, 3)
    ref = copy.deepcopy(model)
    fired: dict[str, int] = {"fused": 0, "ref": 0}
    for key, m in (("fused", model), ("ref", ref)):
        m.linears[0].bias.register_hook(lambda g: g * 2)
        m.linears[1].bias.register_post_accumulate_grad_hook(
            lambda p, key=key: fired.__setitem__(key, fired[key] + 1)
        )
    gm = optimized(model, x)
    for forward in (gm, ref):
        loss(forward(x)).backward()
    assert fired == {"fused": 1, "ref": 1}
    assert_same_params(model, ref)


def test_post_accumulate_grad_hooks_fire_and_can_step_in_backward() -> None:
    model, ref, gm, x = setup(5)
    fired: dict[str, list[str]] = {"fused": [], "ref": []}
    for key, m in (("fused", model), ("ref", ref)):
        for name, p in m.named_parameters():
            # the optimizer-in-backward pattern: step each parameter as soon as its grad is ready
            opt = torch.optim.SGD([p], lr=0.1)

            def step(
                p: torch.Tensor, opt: torch.optim.Optimizer = opt, key: str = key, name: str = name
            ) -> None:
                fired[key].append(name)
                opt.step()
                opt.zero_grad()

            p.register_post_accumulate_grad_hook(step)
    for _ in range(2):
        for forward in (gm, ref):
            loss(forward(x)).backward()
    assert sorted(fired["fused"]) == sorted(fired["ref"])
    assert_same_params(model, ref)
    torch.testing.assert_close(gm(x), ref(x))


# --- 8c: deepcopy, load_state_dict (assign=True), .to(), optimizers ----------------------------


def test_deepcopy_of_the_optimized_module_is_an_independent_working_copy() -> None:
    model, ref, gm, x = setup(6)
    twin = copy.deepcopy(gm)
    ref_twin = copy.deepcopy(ref)
    opt, opt_ref = (torch.optim.SGD(m.parameters(), lr=0.1, momentum=0.9) for m in (twin, ref_twin))
    train([(twin, opt), (ref_twin, opt_ref)], x, 3)
    for (name, p), q in zip(twin.named_parameters(), ref_twin.parameters(), strict=False):
        if not name.startswith(PREFIX):
            assert p.grad is not None, name
            torch.testing.assert_close(p, q)
    torch.testing.assert_close(twin(x), ref_twin(x))
    torch.testing.assert_close(gm(x), ref(x))  # the original is untouched
    assert_same_params(model, ref)
    zeros = {k: torch.zeros_like(v) for k, v in twin.state_dict().items()}
    twin.load_state_dict(zeros)  # a load into the copy is seen by the copy's forward only
    assert twin(x).abs().max() == 0
    torch.testing.assert_close(gm(x), ref(x))


def test_deepcopy_of_the_original_model_is_independent() -> None:
    model, ref, gm, x = setup(7)
    twin, ref_twin = copy.deepcopy(model), copy.deepcopy(ref)
    with torch.no_grad():
        for m in (twin, ref_twin):
            for p in m.parameters():
                p.add_(1.0)
    opt, opt_ref = (torch.optim.SGD(m.parameters(), lr=0.1) for m in (twin, ref_twin))
    train([(twin, opt), (ref_twin, opt_ref)], x, 2)
    assert_same_params(twin, ref_twin)
    torch.testing.assert_close(gm(x), ref(x))
    assert_same_params(model, ref)


@pytest.mark.parametrize("capture", ["export", "fx"])
def test_load_state_dict_assign_is_seen_by_the_forward_and_trains(capture: str) -> None:
    _, _, gm, x = setup(8, capture)
    torch.manual_seed(80)
    other = group()
    state = {k: v.clone() for k, v in other.state_dict().items()}
    gm_state = dict(zip(gm.state_dict(), state.values(), strict=True))  # the GraphModule's keys
    gm.load_state_dict(gm_state, assign=True)
    torch.testing.assert_close(gm(x), other(x))
    opt, opt_ref = (torch.optim.Adam(m.parameters(), lr=0.05) for m in (gm, other))
    train([(gm, opt), (other, opt_ref)], x, 3)
    torch.testing.assert_close(gm(x), other(x))
    for (name, p), q in zip(gm.state_dict().items(), other.state_dict().values(), strict=True):
        torch.testing.assert_close(p, q, msg=name)


@pytest.mark.parametrize("which", ["optimized", "original"])
def test_to_float64_then_load_and_train_like_the_unfused_model(which: str) -> None:
    torch.manual_seed(9)
    model, x = group(), torch.randn(4, 2, 3)
    ref = copy.deepcopy(model)
    # SGD with momentum built BEFORE optimize, Adam after the conversion
    sgd, sgd_ref = (torch.optim.SGD(m.parameters(), lr=0.1, momentum=0.9) for m in (model, ref))
    gm = optimized(model, x)
    train([(gm, sgd), (ref, sgd_ref)], x, 1)  # momentum state exists before the conversion
    (gm if which == "optimized" else model).to(torch.float64)
    ref.to(torch.float64)
    x64 = x.double()
    out = gm(x64)
    assert out.dtype == torch.float64
    torch.testing.assert_close(out, ref(x64), **F32_TOL)
    # the float64 call re-optimized the model through whole-graph export; before, the members'
    # converted .grad (float64 data in views of the float32 gradient buffer) made Dynamo fail and
    # fall back to per-call subgraphs
    (variant,) = gm.optimus_specializations.values()
    assert variant.optimus_report.capture == "export", variant.optimus_report.capture_reason
    assert all(p.grad is None or not p.grad._is_view() for p in model.parameters())
    torch.manual_seed(90)
    state = group().double().state_dict()
    model.load_state_dict(state)  # in place, after the conversion
    ref.load_state_dict(state)
    torch.testing.assert_close(gm(x64), ref(x64))
    adam, adam_ref = (torch.optim.Adam(m.parameters(), lr=0.05) for m in (model, ref))
    train([(gm, sgd), (ref, sgd_ref)], x64, 2)
    train([(gm, adam), (ref, adam_ref)], x64, 2)
    assert_same_params(model, ref)
    torch.testing.assert_close(gm(x64), ref(x64))
    for opt, opt_ref in ((sgd, sgd_ref), (adam, adam_ref)):  # optimizer state tracks the same values
        for p, q in zip(model.parameters(), ref.parameters(), strict=True):
            assert p in opt.state
            for key, value in opt_ref.state[q].items():
                torch.testing.assert_close(opt.state[p][key], value, msg=key)


def test_converting_part_of_a_group_is_a_clear_error_at_the_next_call() -> None:
    model, _, gm, x = setup(10)
    model.linears[1].double()
    with pytest.raises(RuntimeError, match=r"fused parameter .*linears.1.weight is torch.float64"):
        gm(x)


# --- 8d: optimize inside inference_mode -------------------------------------------------------


def test_optimize_inside_inference_mode_leaves_a_trainable_model() -> None:
    torch.manual_seed(11)
    model, x = group(), torch.randn(4, 2, 3)
    ref = copy.deepcopy(model)
    with torch.inference_mode():
        gm = optimized(model, x)
        torch.testing.assert_close(gm(x), ref(x))
    assert not any(p.is_inference() for p in gm.parameters())
    assert not any(p.is_inference() for p in model.parameters())
    sgd, sgd_ref = (torch.optim.SGD(m.parameters(), lr=0.1, momentum=0.9) for m in (model, ref))
    train([(gm, sgd), (ref, sgd_ref)], x, 2)
    assert_same_params(model, ref)
    torch.testing.assert_close(gm(x), ref(x))


# --- under torch.compile ----------------------------------------------------------------------


@pytest.mark.compile
@pytest.mark.parametrize("backend", ["aot_eager", pytest.param("inductor", marks=pytest.mark.slow)])
def test_compiled_optimized_module_honours_freezing_and_hooks(backend: str) -> None:
    """The harness's compile+optimus path (the re-laid-out module under torch.compile): the
    per-call check is traced away, the backward hooks still apply."""
    model, ref, gm, x = setup(12)
    torch._dynamo.reset()
    compiled = torch.compile(gm, backend=backend, fullgraph=True)
    seen: dict[str, list[torch.Tensor]] = {"fused": [], "ref": []}
    for key, m in (("fused", model), ("ref", ref)):
        m.linears[0].weight.requires_grad_(False)
        m.linears[3].weight.register_hook(lambda g, key=key: seen[key].append(g.clone()))  # type: ignore[misc]
    opt, opt_ref = (torch.optim.SGD(m.parameters(), lr=0.1) for m in (model, ref))
    train([(compiled, opt), (ref, opt_ref)], x, 2)
    assert model.linears[0].weight.grad is None
    assert len(seen["fused"]) == len(seen["ref"]) == 2
    torch.testing.assert_close(seen["fused"][1], seen["ref"][1])
    assert_same_params(model, ref)


@pytest.mark.compile
def test_loads_and_conversions_after_compiling_reach_the_compiled_forward() -> None:
    """Under torch.compile the per-call check is traced away; a load (``assign=True`` or in place)
    and a ``.to()`` of the optimized module re-lay out when they happen, so the next compiled call
    (inference or training) reads the new values. Before: the compiled forward kept reading the
    stacked values from before the change, silently, unless ``sync(compiled)`` was called."""
    _, ref, gm, x = setup(15)
    torch._dynamo.reset()
    compiled = torch.compile(gm, backend="aot_eager", fullgraph=True)
    torch.testing.assert_close(compiled(x), ref(x))
    torch.manual_seed(120)
    other = group()
    gm.load_state_dict(dict(zip(gm.state_dict(), other.state_dict().values(), strict=True)), assign=True)
    ref.load_state_dict(other.state_dict())
    with torch.no_grad():
        torch.testing.assert_close(compiled(x), ref(x))  # inference: no backward hook to catch it
    gm.double().float()  # every member's .data replaced: views of the stacked storage cut
    ref.double().float()
    torch.manual_seed(121)
    state = group().state_dict()
    gm.load_state_dict(dict(zip(gm.state_dict(), state.values(), strict=True)))  # in place
    ref.load_state_dict(state)
    with torch.no_grad():
        torch.testing.assert_close(compiled(x), ref(x))
    members = [p for n, p in gm.named_parameters() if not n.startswith(PREFIX)]
    opt, opt_ref = (torch.optim.SGD(ps, lr=0.1) for ps in (members, ref.parameters()))
    train([(compiled, opt), (ref, opt_ref)], x, 2)  # training after the conversion, no sync()
    with torch.no_grad():
        torch.testing.assert_close(compiled(x), ref(x))


def test_steady_state_calls_do_not_re_lay_out() -> None:
    """The per-call check only reads: the same storage serves every step of ordinary training."""
    model, ref, gm, x = setup(14)
    stacked = {n: (p, p.data_ptr()) for n, p in gm.named_parameters() if n.startswith(PREFIX)}
    opt, opt_ref = (torch.optim.SGD(m.parameters(), lr=0.1, momentum=0.9) for m in (model, ref))
    train([(gm, opt), (ref, opt_ref)], x, 3)
    with torch.no_grad():
        gm(x)
    now = {n: p for n, p in gm.named_parameters() if n.startswith(PREFIX)}
    assert {n: (p, p.data_ptr()) for n, p in now.items()} == stacked
    assert_same_params(model, ref)


@pytest.mark.compile
def test_optimus_backend_with_relayout_config_honours_freezing_and_hooks() -> None:
    """Under the optimus backend the re-layout declines (parameters are graph inputs there); the
    contract holds through the per-call stacking layout."""
    torch.manual_seed(13)
    model, x = group(g=16), torch.randn(16, 2, 3)
    ref = copy.deepcopy(model)
    torch._dynamo.reset()
    from torch._dynamo.backends.registry import lookup_backend

    inner = lookup_backend("aot_eager")  # Inductor's C++ compile adds nothing to what is checked here
    chosen = optimus.backend(config(), inner=inner)
    compiled = torch.compile(model, backend=chosen)
    fired: list[int] = []
    for m in (model, ref):
        m.linears[0].weight.requires_grad_(False)
    model.linears[5].weight.register_hook(lambda g: fired.append(1))
    opt, opt_ref = (torch.optim.SGD(m.parameters(), lr=0.1) for m in (model, ref))
    train([(compiled, opt), (ref, opt_ref)], x, 2)
    assert any(r.rules_fired.get("batch_linear") for r in chosen.reports)
    assert fired == [1, 1]
    assert model.linears[0].weight.grad is None
    assert_same_params(model, ref)


# --- random sequences of the operations above, against the unfused model ----------------------

OPS = (
    "train",
    "train",
    "freeze",
    "unfreeze",
    "to",
    "load",
    "zero_none",
    "zero_keep",
    "hook",
    "adam",
    "infer",
)


@pytest.mark.parametrize("seed", range(6))
def test_random_sequences_of_parameter_operations_match_the_unfused_model(seed: int) -> None:
    """Freezing, unfreezing, hooks, ``.to()`` on either module, loads, both zero_grad modes and new
    optimizers, in a random order: after every operation the parameters and their ``.grad``
    (presence and values) match the unfused model's, and so does the output."""
    import random

    rng = random.Random(seed)
    model, ref, gm, x = setup(100 + seed, "fx" if seed % 2 else "export")
    pairs: dict[str, tuple[nn.Module, Callable[[torch.Tensor], torch.Tensor]]] = {
        "fused": (model, gm),
        "ref": (ref, ref),
    }
    opts = {k: torch.optim.SGD(m.parameters(), lr=0.05, momentum=0.9) for k, (m, _) in pairs.items()}
    dtype = torch.float32
    for _ in range(12):
        op, i, which = rng.choice(OPS), rng.randrange(4), rng.choice(["weight", "bias"])
        if op == "train":
            for k, (_, forward) in pairs.items():
                loss(forward(x.to(dtype))).backward()
                opts[k].step()
        elif op == "infer":
            with torch.no_grad():
                torch.testing.assert_close(gm(x.to(dtype)), ref(x.to(dtype)), **F32_TOL)
        elif op in ("freeze", "unfreeze"):
            for m in (model, ref):
                getattr(m.linears[i], which).requires_grad_(op == "unfreeze")
        elif op == "to":
            dtype = torch.float64 if dtype == torch.float32 else torch.float32
            (gm if rng.random() < 0.5 else model).to(dtype)
            ref.to(dtype)
            opts = {
                k: torch.optim.SGD(m.parameters(), lr=0.05) for k, (m, _) in pairs.items()
            }  # state dtypes
        elif op == "load":
            state = {k: torch.randn_like(v) for k, v in ref.state_dict().items()}
            model.load_state_dict(state)
            ref.load_state_dict(state)
        elif op in ("zero_none", "zero_keep"):
            for opt in opts.values():
                opt.zero_grad(set_to_none=op == "zero_none")
        elif op == "hook":
            for m in (model, ref):
                p = getattr(m.linears[i], which)
                if p.requires_grad:
                    p.register_hook(lambda g: g * 0.5)
        elif op == "adam":
            opts = {k: torch.optim.Adam(m.parameters(), lr=0.01) for k, (m, _) in pairs.items()}
        assert_same_params(model, ref)
    torch.testing.assert_close(gm(x.to(dtype)), ref(x.to(dtype)), **F32_TOL)
