"""RelayoutParams: parity (forward+backward), state_dict/checkpoint round trip, optimizer steps equal
to the unfused model's (optimizer built before and after optimize), and the cases where it declines
(falls back to RuntimeStack) or where the cost model declines the fusion."""

from __future__ import annotations

import copy
import io

import pytest
import torch
from torch import fx, nn

import optimus
from models.synthetic_towers import Towers
from optimus.cost.analytic import AnalyticCostModel, DeviceConstants
from optimus.params.relayout import PREFIX, RelayoutParams
from optimus.semantics.meta import record


def group(g: int = 4, k: int = 3, n: int = 5, bias: bool = True) -> Towers:
    """G independent linears over the G slices of a [G, B, K] input (fx-traceable): the shared
    synthetic towers model, models/synthetic_towers.py, in that configuration."""
    return Towers(g, k, n, bias=bias, slices="index", body=("linear", "tanh"))


def relayout_config(**kw: object) -> optimus.OptimusConfig:
    return optimus.OptimusConfig(layout=RelayoutParams(), **kw)  # type: ignore[arg-type]


def fused(model: nn.Module, x: torch.Tensor, **kw: object) -> fx.GraphModule:
    return optimus.optimize(fx.symbolic_trace(model), (x,), config=relayout_config(**kw))


def stacked_names(gm: nn.Module) -> list[str]:
    return [n for n, _ in gm.named_parameters() if n.startswith(PREFIX)]


def grads(model: nn.Module) -> list[torch.Tensor]:
    return [p.grad.clone() if p.grad is not None else torch.zeros(0) for p in model.parameters()]


@pytest.mark.parametrize("bias", [True, False])
def test_forward_backward_parity_and_stacked_storage(bias: bool) -> None:
    torch.manual_seed(0)
    model = group(bias=bias)
    ref = copy.deepcopy(model)
    x = torch.randn(4, 2, 3, requires_grad=True)
    x_ref = x.detach().clone().requires_grad_(True)
    gm = fused(model, x)
    assert gm.optimus_report.rules_fired.get("batch_linear") == 1
    assert len(stacked_names(gm)) == (2 if bias else 1)
    # no per-call weight stacking: no transposes or stacks of parameters left in the graph
    assert not [n for n in gm.graph.nodes if n.op == "call_method" and n.target == "t"]
    assert not [n for n in gm.graph.nodes if n.target is torch.stack and n.args[0][0].op == "get_attr"]
    stacked = dict(gm.named_parameters())[stacked_names(gm)[0]]
    # [G, N, K]: the weights stacked as they are, so each keeps eager's (K, 1) strides; the graph
    # reads the [G, K, N] operand baddbmm wants as a transposed view
    assert stacked.shape == (4, 5, 3) and stacked.is_contiguous()
    for lin in model.linears:  # the original parameters are views into the stacked storage
        assert lin.weight.untyped_storage().data_ptr() == stacked.untyped_storage().data_ptr()
        assert lin.weight.stride() == (3, 1)
    out, want = gm(x), ref(x_ref)
    torch.testing.assert_close(out, want)
    out.pow(2).sum().backward()
    want.pow(2).sum().backward()
    torch.testing.assert_close(x.grad, x_ref.grad)
    for got, exp in zip(model.parameters(), ref.parameters(), strict=True):
        assert got.grad is not None
        torch.testing.assert_close(got.grad, exp.grad)
    assert stacked.grad is None  # hidden: an optimizer over gm.parameters() does not step it twice


def test_grads_accumulate_and_zero_like_the_unfused_model() -> None:
    torch.manual_seed(1)
    model, x = group(), torch.randn(4, 2, 3)
    ref = copy.deepcopy(model)
    gm = fused(model, x)
    for step in range(5):
        gm(x).sum().backward()
        ref(x).sum().backward()
        for got, exp in zip(grads(model), grads(ref), strict=True):
            torch.testing.assert_close(got, exp)
        if step == 0:
            for m in (model, ref):  # zero in place: the bound views stay
                for p in m.parameters():
                    p.grad.zero_()  # type: ignore[union-attr]
        if step == 1:  # a user-set gradient on one parameter is kept and accumulated onto
            for m in (model, ref):
                m.linears[0].weight.grad = torch.ones_like(m.linears[0].weight)
        if step == 2:  # cleared: the next backward's gradient is taken as is, then accumulated onto
            for m in (model, ref):
                m.zero_grad(set_to_none=True)


def test_state_dict_and_checkpoint_round_trip() -> None:
    torch.manual_seed(2)
    model, x = group(), torch.randn(4, 2, 3)
    before = {k: v.clone() for k, v in model.state_dict().items()}
    gm = fused(model, x)
    assert stacked_names(gm)
    after = model.state_dict()
    assert list(after) == list(before)
    for k in before:
        assert after[k].shape == before[k].shape
        torch.testing.assert_close(after[k], before[k])
    assert not any(k.startswith(PREFIX) for k in gm.state_dict())  # same keys as unfused
    gm.load_state_dict(gm.state_dict())  # strict: hidden stacked keys are not "missing"
    # a checkpoint written from the re-laid-out model loads into a plain one, and back
    buf = io.BytesIO()
    torch.save(model.state_dict(), buf)
    buf.seek(0)
    loaded = torch.load(buf, weights_only=True)
    fresh = group()
    fresh.load_state_dict(loaded)
    torch.testing.assert_close(fresh(x), gm(x))
    other = group()
    model.load_state_dict(other.state_dict())  # writes through the views into the storage
    torch.testing.assert_close(gm(x), other(x))


def test_optimizer_steps_match_unfused_built_before_and_after() -> None:
    torch.manual_seed(3)
    model, x = group(), torch.randn(4, 2, 3)
    ref = copy.deepcopy(model)
    sgd_before = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)  # built BEFORE optimize
    sgd_ref = torch.optim.SGD(ref.parameters(), lr=0.1, momentum=0.9)
    gm = fused(model, x)
    adam_after = torch.optim.Adam(gm.parameters(), lr=0.01)  # includes the stacked params too
    for _ in range(3):
        for opt in (sgd_before, sgd_ref):
            opt.zero_grad()
        gm(x).pow(2).sum().backward()
        ref(x).pow(2).sum().backward()
        sgd_before.step()
        sgd_ref.step()
    for got, exp in zip(model.parameters(), ref.parameters(), strict=True):
        torch.testing.assert_close(got, exp)
    torch.testing.assert_close(gm(x), ref(x))
    # an optimizer over gm.parameters() (originals + stacked) updates each value once
    ref2 = copy.deepcopy(ref)
    adam_ref2 = torch.optim.Adam(ref2.parameters(), lr=0.01)
    for _ in range(2):
        adam_after.zero_grad()
        adam_ref2.zero_grad()
        gm(x).pow(2).sum().backward()
        ref2(x).pow(2).sum().backward()
        adam_after.step()
        adam_ref2.step()
    torch.testing.assert_close(gm(x), ref2(x))


def test_declines_without_ownership_verify_or_repeated_params() -> None:
    torch.manual_seed(4)
    x = torch.randn(16, 2, 3)
    # a graph optimize() does not own (backend / pre-grad graphs): RuntimeStack fallback (with 16
    # towers, so that the runtime-stacked form also pays under the analytic cost model)
    model = group(g=16)
    gm = fx.symbolic_trace(model)
    record(gm, (x,))  # shapes, as optimize() would
    report = optimus.optimize_graph_module(gm, relayout_config())
    assert report.rules_fired.get("batch_linear") == 1 and not stacked_names(gm)
    assert all(lin.weight.is_contiguous() for lin in model.linears)  # not re-pointed
    torch.testing.assert_close(gm(x), model(x))
    # verify=True: the verifier differentiates the original parameters, so no re-layout
    gm2 = fused(model, x, verify=True)
    assert gm2.optimus_report.rules_fired.get("batch_linear") == 1 and not stacked_names(gm2)

    # one parameter used by every tower: no copy to save, RuntimeStack's broadcast view
    class Shared(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.lin = nn.Linear(3, 5)

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return torch.cat([self.lin(x[i]) for i in range(16)], 1)

    shared = Shared()
    gm3 = fused(shared, x)
    assert not stacked_names(gm3)
    torch.testing.assert_close(gm3(x), shared(x))


def test_cost_model_declines_when_launches_are_free() -> None:
    free = DeviceConstants(launch_s=0.0, bytes_per_s=10e9, flops_per_s=50e9)
    model, x = group(), torch.randn(4, 2, 3)
    ptrs = [p.data_ptr() for p in model.parameters()]
    gm = fused(model, x, cost_model=AnalyticCostModel(cpu=free, cuda=free))
    assert "batch_linear" not in gm.optimus_report.rules_fired
    assert gm.optimus_report.declined.get("batch_linear", 0) >= 1
    assert not stacked_names(gm) and [p.data_ptr() for p in model.parameters()] == ptrs


def test_second_optimize_reuses_the_storage_and_conversion_is_detected() -> None:
    model, x = group(), torch.randn(4, 2, 3)
    gm = fused(model, x)
    again = fused(model, x)  # same parameters, already re-laid out in this order: reused
    (name,) = [n for n in stacked_names(again) if dict(again.named_parameters())[n].dim() == 3]
    assert any(dict(again.named_parameters())[name] is p for p in gm.parameters())
    torch.testing.assert_close(again(x), gm(x))
    # what Module._apply (.to(device), .half()) does to each parameter: cuts the view loose. Before
    # a forward, the per-call check lays the group out again from the parameters' values ...
    w = model.linears[1].weight
    w.data = w.data.clone() * 2
    torch.testing.assert_close(gm(x), model(x))
    assert w.untyped_storage().data_ptr() == model.linears[0].weight.untyped_storage().data_ptr()
    # ... between a forward and its backward, the backward hook says so instead of training the
    # two copies apart silently
    out = gm(x)
    w.data = w.data.clone()
    with pytest.raises(RuntimeError, match="stopped being a view"):
        out.sum().backward()


def test_dynamo_sees_a_plain_parameter_training() -> None:
    torch.manual_seed(5)
    model, x = group(), torch.randn(4, 2, 3)
    ref = copy.deepcopy(model)
    gm = fused(model, x)
    torch._dynamo.reset()
    compiled = torch.compile(gm, backend="aot_eager")
    for _ in range(2):
        for m in (model, ref):
            m.zero_grad()
        compiled(x).pow(2).sum().backward()
        ref(x).pow(2).sum().backward()
        for got, exp in zip(grads(model), grads(ref), strict=True):
            torch.testing.assert_close(got, exp)


class SharedInput(nn.Module):
    """Linears of different widths reading one tensor: merge_shared_linear concatenates them."""

    def __init__(self) -> None:
        super().__init__()
        self.heads = nn.ModuleList([nn.Linear(6, n) for n in (3, 5, 4)])

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.cat([torch.relu(h(x)) for h in self.heads], 1)


def test_concatenated_layout_for_shared_input_linears() -> None:
    torch.manual_seed(6)
    model, x = SharedInput(), torch.randn(5, 6)
    ref = copy.deepcopy(model)
    gm = fused(model, x, rules=("merge_shared_linear",))
    assert gm.optimus_report.rules_fired.get("merge_shared_linear") == 1
    weights = [p for n, p in gm.named_parameters() if n.startswith(PREFIX) and p.dim() == 2]
    assert len(weights) == 1 and weights[0].shape == (12, 6)
    assert not [n for n in gm.graph.nodes if n.target is torch.cat and n.args[0][0].op == "get_attr"]
    sgd, sgd_ref = (torch.optim.SGD(m.parameters(), lr=0.1, momentum=0.5) for m in (model, ref))
    for _ in range(2):
        sgd.zero_grad()
        sgd_ref.zero_grad()
        out, want = gm(x), ref(x)
        torch.testing.assert_close(out, want)
        out.pow(2).sum().backward()
        want.pow(2).sum().backward()
        for got, exp in zip(grads(model), grads(ref), strict=True):
            torch.testing.assert_close(got, exp)
        sgd.step()
        sgd_ref.step()
    torch.testing.assert_close(gm(x), ref(x))


def test_towers_linear_and_layer_norm_params_relaid_out_train_like_unfused() -> None:

    torch.manual_seed(7)
    model, x = Towers(8, 4, 5, slices="narrow"), torch.randn(3, 32)
    ref = copy.deepcopy(model)
    gm = optimus.optimize(fx.symbolic_trace(model), (x,), config=relayout_config())
    assert {"batch_linear", "batch_layer_norm"} <= set(gm.optimus_report.rules_fired)
    assert len(stacked_names(gm)) == 4  # linear weight and bias, layer-norm weight and bias
    sgd, sgd_ref = (torch.optim.SGD(m.parameters(), lr=0.1) for m in (model, ref))
    for _ in range(2):
        sgd.zero_grad()
        sgd_ref.zero_grad()
        gm(x).pow(2).sum().backward()
        ref(x).pow(2).sum().backward()
        for got, exp in zip(grads(model), grads(ref), strict=True):
            torch.testing.assert_close(got, exp)
        sgd.step()
        sgd_ref.step()
    torch.testing.assert_close(gm(x), ref(x))


@pytest.mark.compile
@pytest.mark.slow  # one Inductor compile of fwd+bwd: ~30-90 s on the shared 2-core machine
def test_inductor_compiles_the_relaid_out_graph_training() -> None:
    torch.manual_seed(8)
    model, x = group(g=3, k=2, n=2), torch.randn(3, 2, 2)
    ref = copy.deepcopy(model)
    gm = fused(model, x)
    assert stacked_names(gm)
    torch._dynamo.reset()
    compiled = torch.compile(gm, backend="inductor")
    for _ in range(2):
        for m in (model, ref):
            m.zero_grad()
        out, want = compiled(x), ref(x)
        torch.testing.assert_close(out, want)
        out.pow(2).sum().backward()
        want.pow(2).sum().backward()
        for got, exp in zip(grads(model), grads(ref), strict=True):
            torch.testing.assert_close(got, exp)


# --- gradient buffer: kept and reused for small members, freed with the grads otherwise -------


def small_groups_reuse(reuse: bool, monkeypatch: pytest.MonkeyPatch) -> None:
    """Members of ``group()`` are tiny; a zero limit makes every group a non-reusing one."""
    import optimus.params.relayout as lr

    monkeypatch.setattr(lr, "REUSE_MAX_MEMBER_BYTES", lr.REUSE_MAX_MEMBER_BYTES if reuse else 0)


@pytest.mark.parametrize("reuse", [True, False])
def test_accumulate_and_zero_like_unfused_with_and_without_reuse(
    reuse: bool, monkeypatch: pytest.MonkeyPatch
) -> None:
    small_groups_reuse(reuse, monkeypatch)
    torch.manual_seed(11)
    model, x = group(), torch.randn(4, 2, 3)
    ref = copy.deepcopy(model)
    gm = fused(model, x)
    for step in range(6):
        if step in (0, 3, 4):
            for m in (model, ref):
                m.zero_grad(set_to_none=True)
        if step == 2:
            for m in (model, ref):
                m.zero_grad(set_to_none=False)
        gm(x).pow(2).sum().backward()
        ref(x).pow(2).sum().backward()
        for got, exp in zip(grads(model), grads(ref), strict=True):
            torch.testing.assert_close(got, exp)


def test_small_groups_reuse_one_gradient_buffer_across_steps() -> None:
    from optimus.params.relayout import retained_gradient_buffers

    torch.manual_seed(12)
    model, x = group(), torch.randn(4, 2, 3)
    ref = copy.deepcopy(model)
    gm = fused(model, x)
    sgd, sgd_ref = (torch.optim.SGD(m.parameters(), lr=0.1, momentum=0.9) for m in (model, ref))
    ptrs = []
    for _ in range(4):
        for opt in (sgd, sgd_ref):
            opt.zero_grad(set_to_none=True)
        gm(x).pow(2).sum().backward()
        ref(x).pow(2).sum().backward()
        for got, exp in zip(grads(model), grads(ref), strict=True):
            torch.testing.assert_close(got, exp)
        ptrs.append(model.linears[1].weight.grad.data_ptr())  # type: ignore[union-attr]
        sgd.step()
        sgd_ref.step()
    assert len(set(ptrs[1:])) == 1  # the same buffer every step after the first adoption
    sgd.zero_grad(set_to_none=True)
    kept = retained_gradient_buffers(gm)
    assert len(kept) == 2  # weights and biases: memory the unfused model would have freed
    torch.testing.assert_close(gm(x), ref(x))


@pytest.mark.parametrize("hold", ["view", "derived"])
def test_a_gradient_the_user_kept_is_never_overwritten(hold: str) -> None:
    torch.manual_seed(13)
    model, x = group(), torch.randn(4, 2, 3)
    ref = copy.deepcopy(model)
    gm = fused(model, x)
    for _ in range(2):  # the second step already reuses the buffer
        for m in (model, ref):
            m.zero_grad(set_to_none=True)
        gm(x).sum().backward()
        ref(x).sum().backward()
    w = model.linears[2].weight
    old_ptr = w.grad.data_ptr()  # type: ignore[union-attr]
    kept = w.grad if hold == "view" else w.grad[0]  # type: ignore[index]
    before = kept.clone()  # type: ignore[union-attr]
    for m in (model, ref):
        m.zero_grad(set_to_none=True)
    gm(x).pow(3).sum().backward()  # a different gradient
    ref(x).pow(3).sum().backward()
    torch.testing.assert_close(kept, before)  # the kept tensor still holds the old gradient
    assert w.grad is not None and w.grad.data_ptr() != old_ptr  # a fresh buffer was adopted
    for got, exp in zip(grads(model), grads(ref), strict=True):
        torch.testing.assert_close(got, exp)


def test_groups_that_do_not_reuse_free_their_gradients_with_zero_grad(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    import gc
    import weakref

    from optimus.params.relayout import retained_gradient_buffers

    small_groups_reuse(False, monkeypatch)
    torch.manual_seed(14)
    model, x = group(), torch.randn(4, 2, 3)
    gm = fused(model, x)
    gm(x).sum().backward()
    base = model.linears[0].weight.grad._base  # type: ignore[union-attr]
    assert base is not None
    gone = weakref.ref(base)
    del base
    model.zero_grad(set_to_none=True)
    gc.collect()
    assert gone() is None  # freed like the unfused model's gradients, not kept for the next step
    assert retained_gradient_buffers(gm) == []


class _Branches(nn.Module):
    def __init__(self, g: int) -> None:
        super().__init__()
        self.branches = nn.ModuleList(
            [nn.Sequential(nn.Linear(72, 24), nn.ReLU(), nn.Linear(24, 32)) for _ in range(g)]
        )

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.cat([b(x) for b in self.branches], 1)


@pytest.mark.parametrize(("g", "trainable", "relaid"), [(2, True, False), (2, False, True), (3, True, True)])
def test_trainable_groups_of_two_are_not_relaid_out(g: int, trainable: bool, relaid: bool) -> None:
    """A re-laid-out group of 2 trainable parameters loses in training (its backward's gradient
    hand-off costs more than the launch it saves; MIN_TRAINABLE_MEMBERS): it falls back to the
    per-call stack, which the analytic model declines here. Frozen pairs and groups of 3 are still
    re-laid out. Results match the unfused model either way."""
    torch.manual_seed(7)
    model = _Branches(g).requires_grad_(trainable)
    ref = copy.deepcopy(model)
    x = torch.randn(32, 72)
    gm = fused(model, x)
    assert bool(stacked_names(gm)) is relaid
    if not relaid:
        assert "merge_shared_linear" not in gm.optimus_report.rules_fired
        linears = [m for m in model.modules() if isinstance(m, nn.Linear)]
        assert all(lin.weight._base is None for lin in linears)  # the user's parameters untouched
    out, want = gm(x), ref(x)
    torch.testing.assert_close(out, want)
    if trainable:
        out.pow(2).sum().backward()
        want.pow(2).sum().backward()
        for got, exp in zip(grads(model), grads(ref), strict=True):
            torch.testing.assert_close(got, exp)


# --- the hand-off hook: one post-accumulate hook, a pre-hook only for members' own hooks --------


def _stacked_params(gm: nn.Module) -> list[nn.Parameter]:
    return [p for n, p in gm.named_parameters() if n.startswith(PREFIX)]


def test_the_pre_hook_is_installed_only_once_a_member_has_a_tensor_hook() -> None:
    """Every hook autograd calls costs a real model's step 5-25 us (docs/perf.md): groups without
    member hooks get none; registering one later installs it, and it fires from that backward."""
    torch.manual_seed(15)
    model, x = group(), torch.randn(4, 2, 3)
    ref = copy.deepcopy(model)
    gm = fused(model, x)
    gm(x).sum().backward()
    ref(x).sum().backward()
    assert all(not p._backward_hooks for p in _stacked_params(gm))
    assert all(p._post_accumulate_grad_hooks for p in _stacked_params(gm))
    for m in (model, ref):
        m.zero_grad(set_to_none=True)
        m.linears[2].weight.register_hook(lambda g: g * 3)  # type: ignore[union-attr,operator]
    assert any(p._backward_hooks for p in _stacked_params(gm))
    gm(x).pow(2).sum().backward()
    ref(x).pow(2).sum().backward()
    for got, exp in zip(grads(model), grads(ref), strict=True):
        torch.testing.assert_close(got, exp)


@pytest.mark.parametrize("reuse", [True, False])
def test_accumulating_with_a_frozen_member_and_a_user_set_grad(
    reuse: bool, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The accumulate path: one member frozen (keeps its .grad), one whose .grad the user set to
    a tensor of their own, the others accumulating into views of one buffer."""
    small_groups_reuse(reuse, monkeypatch)
    torch.manual_seed(16)
    model, x = group(), torch.randn(4, 2, 3)
    ref = copy.deepcopy(model)
    gm = fused(model, x)
    for f in (gm, ref):
        f(x).pow(2).sum().backward()
    for m in (model, ref):
        m.linears[1].weight.requires_grad_(False)
        m.linears[3].bias.grad = torch.full_like(m.linears[3].bias, 0.5)
    for f in (gm, ref):
        f(x).pow(3).sum().backward()
        f(x).sum().backward()
    for got, exp in zip(grads(model), grads(ref), strict=True):
        torch.testing.assert_close(got, exp)
    assert model.linears[3].bias.grad is not None and model.linears[3].bias.grad._base is not None


def test_create_graph_accumulates_out_of_place_like_the_unfused_model() -> None:
    """Under ``backward(create_graph=True)`` AccumulateGrad sums out of place and the gradient
    keeps its history: so do the members' gradients, and a second-order loss on them trains the
    same."""
    torch.manual_seed(17)
    model, x = group(), torch.randn(4, 2, 3)
    ref = copy.deepcopy(model)
    gm = fused(model, x)
    for f in (gm, ref):
        f(x).pow(2).sum().backward(create_graph=True)
    kept = [p.grad for p in model.parameters()]
    for f in (gm, ref):
        f(x).pow(3).sum().backward(create_graph=True)
    for p, q, old in zip(model.parameters(), ref.parameters(), kept, strict=True):
        assert p.grad is not old  # a new tensor, as AccumulateGrad's out-of-place sum gives
        assert p.grad is not None and q.grad is not None
        assert p.grad.requires_grad == q.grad.requires_grad
        torch.testing.assert_close(p.grad, q.grad)
    penalties = [sum(p.grad.pow(2).sum() for p in m.parameters()) for m in (model, ref)]  # type: ignore[union-attr]
    for m in (model, ref):
        m.zero_grad(set_to_none=True)
    for penalty in penalties:
        penalty.backward()  # type: ignore[union-attr]
    for got, exp in zip(grads(model), grads(ref), strict=True):
        torch.testing.assert_close(got, exp)
