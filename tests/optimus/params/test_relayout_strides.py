"""Re-laid-out parameters keep eager's layout: every parameter's (and gradient's) strides and
contiguity equal the unfused model's, so code that flattens or views parameters works after
``optimize()`` with ``RelayoutParams``: ``parameters_to_vector``, ``p.view(-1)``, EMA and model
averaging with ``torch._foreach_*``, ``state_dict`` round trips. Each model below has at least one
re-laid-out group of the kind named (linear weights read transposed by ``baddbmm``, biases,
layer-norm affines, the side-by-side weights of a tower and its gate, merged shared-input linears
of equal and of different widths, embedding tables), in train mode, before and after 3 AdamW
steps. A parameter that is not contiguous in eager is left to the per-call stack, and the report
says why."""

from __future__ import annotations

import copy
import io
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import pytest
import torch
from optimus_helpers import LAUNCH_BOUND
from torch import nn
from torch.nn.utils import parameters_to_vector, vector_to_parameters

import optimus
from models.synthetic_towers import Towers
from optimus.params.relayout import PREFIX, STRIDES_REASON, RelayoutParams


class TowerGate(nn.Module):
    """A tower and its gate reading each input, results consumed pointwise: batch_linear's
    side-by-side form (the k weights of one input laid out as one [K, k*N] operand)."""

    def __init__(self, g: int = 4, d: int = 6, n: int = 5) -> None:
        super().__init__()
        self.tower = nn.ModuleList([nn.Linear(d, n) for _ in range(g)])
        self.gate = nn.ModuleList([nn.Linear(d, n) for _ in range(g)])

    def forward(self, *xs: torch.Tensor) -> torch.Tensor:
        outs = [t(x) * torch.sigmoid(g(x)) for t, g, x in zip(self.tower, self.gate, xs, strict=True)]
        return torch.cat(outs, 1)


class SharedInput(nn.Module):
    """Linears reading one tensor: merge_shared_linear (batched when the widths are equal,
    one wide linear over concatenated weights when they differ)."""

    def __init__(self, widths: tuple[int, ...]) -> None:
        super().__init__()
        self.heads = nn.ModuleList([nn.Linear(6, n) for n in widths])

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.cat([torch.relu(h(x)) for h in self.heads], 1)


class Tables(nn.Module):
    """Per-feature embedding lookups, concatenated: batch_embedding's tables laid end to end (the
    cost model takes it from about 10 lookups)."""

    def __init__(self, g: int = 16, rows: int = 10, d: int = 4) -> None:
        super().__init__()
        self.tables = nn.ModuleList([nn.Embedding(rows, d) for _ in range(g)])
        self.head = nn.Linear(g * d, 1)

    def forward(self, idx: torch.Tensor) -> torch.Tensor:
        return self.head(torch.cat([t(idx[:, i]) for i, t in enumerate(self.tables)], 1))


class TransposedWeights(nn.Module):
    """Towers whose weights are transposed views (stride (1, N)), as a model that stores W^T
    and hands ``.t()`` to ``nn.Linear`` has: no contiguous block of a storage has that layout."""

    def __init__(self, g: int = 8, k: int = 3, n: int = 5) -> None:
        super().__init__()
        self.linears = nn.ModuleList([nn.Linear(k, n) for _ in range(g)])
        for lin in self.linears:
            lin.weight = nn.Parameter(lin.weight.detach().t().contiguous().t())

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.cat([torch.tanh(lin(x[i])) for i, lin in enumerate(self.linears)], 1)


@dataclass
class Case:
    model: nn.Module
    inputs: tuple[Any, ...]
    loss: Callable[[Any], torch.Tensor]
    rules: tuple[str, ...] | None = None
    fired: tuple[str, ...] = ()


def _square(out: Any) -> torch.Tensor:
    return out.float().pow(2).mean()


def _case(name: str) -> Case:
    torch.manual_seed(0)
    if name == "towers_family":
        import models

        b = models.build("towers", scale="tiny", device="cpu", seed=0)
        batch = b.batches[0]
        return Case(
            b.module.dense,
            b.dense_inputs(batch),
            lambda out: b.loss(out, batch.labels),
            fired=("batch_linear",),
        )
    if name == "linear_and_layer_norm":
        return Case(
            Towers(8, 4, 5, slices="narrow"),
            (torch.randn(3, 32),),
            _square,
            fired=("batch_linear", "batch_layer_norm"),
        )
    if name == "tower_and_gate":
        xs = tuple(torch.randn(3, 6) for _ in range(4))
        return Case(TowerGate(), xs, _square, rules=("batch_linear",), fired=("batch_linear",))
    if name == "merged_equal_widths":
        return Case(
            SharedInput((4, 4, 4)),
            (torch.randn(5, 6),),
            _square,
            ("merge_shared_linear",),
            ("merge_shared_linear",),
        )
    if name == "merged_unequal_widths":
        return Case(
            SharedInput((3, 5, 4)),
            (torch.randn(5, 6),),
            _square,
            ("merge_shared_linear",),
            ("merge_shared_linear",),
        )
    if name == "embeddings":
        return Case(
            Tables(), (torch.randint(0, 10, (6, 16)),), _square, ("batch_embedding",), ("batch_embedding",)
        )
    raise AssertionError(name)


CASES = (
    "towers_family",
    "linear_and_layer_norm",
    "tower_and_gate",
    "merged_equal_widths",
    "merged_unequal_widths",
    "embeddings",
)


def _optimized(case: Case) -> nn.Module:
    config = optimus.OptimusConfig(layout=RelayoutParams(), **({"rules": case.rules} if case.rules else {}))
    gm = optimus.optimize(case.model, case.inputs, config=config)
    fired = set(gm.optimus_report.rules_fired)
    assert set(case.fired) <= fired, fired
    assert [n for n, _ in gm.named_parameters() if n.startswith(PREFIX)], "nothing was re-laid out"
    return gm


def assert_eager_layouts(model: nn.Module, ref: nn.Module) -> None:
    """Every parameter, and every gradient, has the unfused model's strides and contiguity."""
    got, want = dict(model.named_parameters()), dict(ref.named_parameters())
    assert list(got) == list(want)
    for name, p in got.items():
        q = want[name]
        assert (p.stride(), p.is_contiguous()) == (q.stride(), q.is_contiguous()), name
        assert (p.grad is None) == (q.grad is None), name
        if p.grad is not None and q.grad is not None:
            assert (p.grad.stride(), p.grad.is_contiguous()) == (q.grad.stride(), q.grad.is_contiguous()), (
                name
            )


def assert_flattens_like(model: nn.Module, ref: nn.Module) -> None:
    """``parameters_to_vector`` and ``p.view(-1)`` work and read the unfused model's values."""
    torch.testing.assert_close(
        parameters_to_vector(model.parameters()), parameters_to_vector(ref.parameters())
    )
    for p, q in zip(model.parameters(), ref.parameters(), strict=True):
        torch.testing.assert_close(p.view(-1), q.view(-1))
        if p.grad is not None and q.grad is not None:
            torch.testing.assert_close(p.grad.view(-1), q.grad.view(-1))


@pytest.mark.parametrize("name", CASES)
def test_parameters_keep_eager_strides_through_training_ema_and_checkpoints(name: str) -> None:
    case = _case(name)
    case.model.train()
    ref = copy.deepcopy(case.model)
    gm = _optimized(case)
    model = case.model
    assert_eager_layouts(model, ref)
    assert_flattens_like(model, ref)

    opt, opt_ref = (torch.optim.AdamW(m.parameters(), lr=1e-2, weight_decay=0.1) for m in (model, ref))
    ema, ema_ref = ([p.detach().clone() for p in m.parameters()] for m in (model, ref))
    for _ in range(3):
        opt.zero_grad()
        opt_ref.zero_grad()
        out, want = gm(*case.inputs), ref(*case.inputs)
        torch.testing.assert_close(out, want)
        case.loss(out).backward()
        case.loss(want).backward()
        assert_eager_layouts(model, ref)
        for p, q in zip(model.parameters(), ref.parameters(), strict=True):
            torch.testing.assert_close(p.grad, q.grad)
        opt.step()
        opt_ref.step()
        with torch.no_grad():  # an EMA of the weights, as training loops keep one
            for avg, m in ((ema, model), (ema_ref, ref)):
                torch._foreach_mul_(avg, 0.9)
                torch._foreach_add_(avg, list(m.parameters()), alpha=0.1)
    assert_eager_layouts(model, ref)
    assert_flattens_like(model, ref)
    torch.testing.assert_close(ema, ema_ref)

    # model averaging writes into the parameters in place: the forward reads the new values
    with torch.no_grad():
        torch._foreach_lerp_(list(model.parameters()), ema, 0.5)
        torch._foreach_lerp_(list(ref.parameters()), ema_ref, 0.5)
    torch.testing.assert_close(gm(*case.inputs), ref(*case.inputs))

    # a flat vector written back (each parameter's .data replaced): re-laid out at the next call
    vec = parameters_to_vector(ref.parameters()) * 0.5
    vector_to_parameters(vec.clone(), model.parameters())
    vector_to_parameters(vec.clone(), ref.parameters())
    torch.testing.assert_close(gm(*case.inputs), ref(*case.inputs))
    assert_eager_layouts(model, ref)

    # checkpoints: the unfused keys, values and layouts; a load reaches the forward
    sd, sd_ref = model.state_dict(), ref.state_dict()
    assert list(sd) == list(sd_ref)
    for key, value in sd.items():
        torch.testing.assert_close(value, sd_ref[key])
        assert value.stride() == sd_ref[key].stride(), key
    buf = io.BytesIO()
    torch.save({k: v * 2 for k, v in sd_ref.items()}, buf)
    buf.seek(0)
    loaded = torch.load(buf)
    model.load_state_dict(loaded)  # in place: through the views into the stacked storage
    ref.load_state_dict(loaded)
    assert_eager_layouts(model, ref)
    torch.testing.assert_close(gm(*case.inputs), ref(*case.inputs))


def test_a_parameter_that_is_not_contiguous_is_not_relaid_out_and_the_report_says_why() -> None:
    torch.manual_seed(1)
    model, x = TransposedWeights(), torch.randn(8, 2, 3)
    ref = copy.deepcopy(model)
    assert model.linears[0].weight.stride() == (1, 5)
    # launch-bound prices: the fusion pays even with the weights stacked per call
    config = optimus.OptimusConfig(layout=RelayoutParams(), rules=("batch_linear",), cost_model=LAUNCH_BOUND)
    gm = optimus.optimize(model, (x,), config=config)
    report = gm.optimus_report
    assert report.rules_fired.get("batch_linear") == 1
    assert report.declined_reasons.get(STRIDES_REASON, 0) >= 1
    stacked = [p for n, p in gm.named_parameters() if n.startswith(PREFIX)]
    assert [tuple(p.shape) for p in stacked] == [(8, 5)]  # the biases only
    out, want = gm(x), ref(x)
    torch.testing.assert_close(out, want)
    out.sum().backward()
    want.sum().backward()
    assert_eager_layouts(model, ref)
    for p, q in zip(model.parameters(), ref.parameters(), strict=True):
        torch.testing.assert_close(p.grad, q.grad)


def test_a_non_contiguous_parameter_set_after_optimize_is_a_clear_error() -> None:
    torch.manual_seed(2)
    model, x = Towers(4, 3, 5, slices="index", body=("linear", "tanh")), torch.randn(4, 2, 3)
    gm = optimus.optimize(model, (x,), config=optimus.OptimusConfig(layout=RelayoutParams()))
    assert [n for n, _ in gm.named_parameters() if n.startswith(PREFIX)]
    weight = model.linears[1].weight
    with torch.no_grad():
        weight.data = weight.detach().t().contiguous().t()
    with pytest.raises(RuntimeError, match=r"linears[._]1[._]weight has strides \(1, 5\)"):
        gm(x)


def test_the_batched_gemm_reads_the_weights_without_a_copy() -> None:
    """The [G, N, K] storage reaches baddbmm as a transposed view: no per-call copy of weights."""
    torch.manual_seed(3)
    model, x = Towers(4, 3, 5, slices="index", body=("linear", "tanh")), torch.randn(4, 2, 3)
    gm = optimus.optimize(model, (x,), config=optimus.OptimusConfig(layout=RelayoutParams()))
    gemm = next(n for n in gm.graph.nodes if n.target is torch.baddbmm)
    weight = gemm.args[2]
    assert weight.op == "call_method" and weight.target == "transpose"
    assert weight.args[0].op == "get_attr"
    for node in gm.graph.nodes:  # the stacked parameters are only viewed
        if node.op == "get_attr" and str(node.target).startswith(PREFIX):
            assert {(u.op, u.target) for u in node.users} <= {
                ("call_method", "transpose"),
                ("call_method", "unsqueeze"),
            }
