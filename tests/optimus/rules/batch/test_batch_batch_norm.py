"""batch_batch_norm: parity (outputs, gradients, running statistics, num_batches_tracked, all
bit-equal to eager's), train and eval, the BatchNorm variants, and must-not-fire cases."""

from __future__ import annotations

import copy
from typing import Any

import pytest
import torch
import torch.nn.functional as F
from optimus_helpers import LAUNCH_BOUND
from torch import nn

import optimus
from optimus import OptimusConfig

RULES = ("batch_batch_norm",)


class Experts(nn.Module):
    """G parallel ``Linear -> BatchNorm1d -> ReLU -> Dropout`` experts of one input (MMoE)."""

    def __init__(
        self, g: int = 4, d_in: int = 8, width: int | list[int] = 16, p: float = 0.0, **bn: Any
    ) -> None:
        super().__init__()
        widths = width if isinstance(width, list) else [width] * g
        self.experts = nn.ModuleList(
            nn.Sequential(nn.Linear(d_in, w), nn.BatchNorm1d(w, **bn), nn.ReLU(), nn.Dropout(p))
            for w in widths
        )
        norms = [m for m in self.modules() if isinstance(m, nn.BatchNorm1d)]
        for norm in norms:  # non-trivial statistics and affine parameters
            if norm.running_mean is not None and norm.running_var is not None:
                norm.running_mean.normal_()
                norm.running_var.uniform_(0.5, 2.0)
            if norm.weight is not None:
                nn.init.normal_(norm.weight)
                nn.init.normal_(norm.bias)

    def forward(self, x: torch.Tensor) -> list[torch.Tensor]:
        return [e(x) for e in self.experts]


def fired(gm: Any, rule: str = "batch_batch_norm") -> int:
    return int(gm.optimus_report.rules_fired.get(rule, 0))


def step(fn: Any, params: list[torch.Tensor], x: torch.Tensor) -> tuple[list[torch.Tensor], list[Any]]:
    """One seeded forward + backward: outputs and the gradients of ``params`` and ``x`` (read from
    ``.grad``: the re-layout hands the gradients of parameters it laid out to their ``.grad``)."""
    leaf = x.detach().clone().requires_grad_(True)
    for p in params:
        p.grad = None
    torch.manual_seed(0)
    outs = fn(leaf)
    gen = torch.Generator().manual_seed(1)
    loss = sum((o * torch.randn(o.shape, generator=gen)).sum() for o in outs)
    loss.backward()
    return [o.detach() for o in outs], [p.grad for p in params] + [leaf.grad]


def same(a: torch.Tensor, b: torch.Tensor, exact: bool) -> bool:
    if exact:
        return torch.equal(a, b)
    return a.dtype == b.dtype and torch.allclose(a, b, rtol=1e-4, atol=1e-5)


def assert_bit_equal(
    mod: nn.Module, train: bool, x: torch.Tensor, steps: int = 2, exact: bool = True, **kw: Any
) -> Any:
    """Eager on one copy, the optimized graph on another: outputs, gradients, every buffer
    (running statistics, num_batches_tracked) bit-equal after each of ``steps`` steps (close,
    when ``exact`` is False: other rules, e.g. batch_linear's batched GEMM, round differently)."""
    eager, mine = copy.deepcopy(mod).train(train), copy.deepcopy(mod).train(train)
    kw.setdefault("rules", RULES)
    kw.setdefault("cost_model", LAUNCH_BOUND)
    gm = optimus.optimize(mine, (x,), config=OptimusConfig(**kw))
    for i in range(steps):
        xi = x + i
        ref_out, ref_grads = step(eager, list(eager.parameters()), xi)
        out, grads = step(gm, list(mine.parameters()), xi)
        assert len(out) == len(ref_out)
        for a, b in zip(ref_out, out, strict=True):
            assert same(a, b, exact)
        for a, b in zip(ref_grads, grads, strict=True):
            assert (a is None) == (b is None)
            assert a is None or same(a, b, exact)
        ref_buffers, buffers = dict(eager.named_buffers()), dict(mine.named_buffers())
        assert ref_buffers.keys() == buffers.keys()
        for name, value in ref_buffers.items():
            assert same(value, buffers[name], exact), name
    return gm


@pytest.mark.parametrize("train", [True, False])
@pytest.mark.parametrize(
    "bn",
    [
        {},
        {"momentum": 0.3},
        {"affine": False},
        {"track_running_stats": False},
        {"eps": 1e-3, "momentum": 0.05},
    ],
)
def test_parity_bit_equal(train: bool, bn: dict[str, Any]) -> None:
    torch.manual_seed(0)
    mod = Experts(4, 8, 16, **bn)
    gm = assert_bit_equal(mod, train, torch.randn(32, 8))
    assert fired(gm) == 1
    assert sum(1 for n in gm.graph.nodes if n.target is F.batch_norm) == 1


def test_parity_float64_and_unequal_widths() -> None:
    torch.manual_seed(0)
    mod = Experts(4, 8, [8, 16, 24, 8]).double()
    gm = assert_bit_equal(mod, True, torch.randn(20, 8, dtype=torch.float64))
    assert fired(gm) == 1


def test_experts_chain_with_dropout_keeps_rng_stream() -> None:
    """Linear -> BN -> ReLU -> Dropout(p > 0) in training with all rules: the dropout draws stay
    per member, in eager's order (a different mask would be far off, not a rounding apart)."""
    torch.manual_seed(0)
    mod = Experts(4, 8, 32, p=0.3)
    gm = assert_bit_equal(mod, True, torch.randn(64, 8), exact=False, rules=None)
    assert fired(gm) == 1
    assert fired(gm, "batch_unary") >= 1


def test_momentum_none_declined_and_state_kept() -> None:
    """momentum=None (a cumulative average over num_batches_tracked) in train mode: not batched,
    and the optimized model still updates the statistics exactly as eager."""
    torch.manual_seed(0)
    mod = Experts(4, 8, 16, momentum=None)
    gm = assert_bit_equal(mod, True, torch.randn(32, 8))
    assert fired(gm) == 0


def test_momentum_none_in_eval_batches() -> None:
    torch.manual_seed(0)
    mod = Experts(4, 8, 16, momentum=None)
    gm = assert_bit_equal(mod, False, torch.randn(32, 8))
    assert fired(gm) == 1


class TwoSettings(nn.Module):
    """Four BatchNorms with one setting, then four with another (each four is a group)."""

    def __init__(self, first: dict[str, Any], second: dict[str, Any]) -> None:
        super().__init__()
        self.norms = nn.ModuleList([nn.BatchNorm1d(16, **s) for s in [first] * 4 + [second] * 4])

    def forward(self, x: torch.Tensor) -> list[torch.Tensor]:
        return [n(x * float(i + 1)) for i, n in enumerate(self.norms)]


def batch_norms(gm: Any) -> int:
    return sum(1 for n in gm.graph.nodes if n.target is F.batch_norm)


def test_equal_settings_fuse() -> None:
    """The control for the cases below: eight BatchNorms that differ in nothing are one."""
    torch.manual_seed(0)
    gm = assert_bit_equal(TwoSettings({}, {}), True, torch.randn(8, 16))
    assert fired(gm) == 1
    assert batch_norms(gm) == 1


@pytest.mark.parametrize(
    ("first", "second"),
    [
        ({"eps": 1e-5}, {"eps": 1e-3}),
        ({"momentum": 0.1}, {"momentum": 0.2}),
        ({"affine": True}, {"affine": False}),
        ({"track_running_stats": True}, {"track_running_stats": False}),
    ],
)
@pytest.mark.parametrize("train", [True, False])
def test_different_settings_do_not_fuse(first: dict[str, Any], second: dict[str, Any], train: bool) -> None:
    torch.manual_seed(0)
    gm = assert_bit_equal(TwoSettings(first, second), train, torch.randn(8, 16))
    assert batch_norms(gm) == 2  # one per setting, never one for all eight


def test_module_called_twice_does_not_fuse() -> None:
    """A BatchNorm1d applied to two inputs updates its running statistics twice, in order;
    batching either call would lose an update. The other four still fuse."""

    class Twice(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.norms = nn.ModuleList([nn.BatchNorm1d(16) for _ in range(5)])

        def forward(self, x: torch.Tensor) -> list[torch.Tensor]:
            outs = [n(x * float(i + 1)) for i, n in enumerate(self.norms)]
            return [*outs, self.norms[0](x * 7.0)]

    torch.manual_seed(0)
    gm = assert_bit_equal(Twice(), True, torch.randn(8, 16))
    assert fired(gm) == 1
    assert batch_norms(gm) == 3  # the fused four, and the twice-called module's two calls


def test_mutated_shared_input_does_not_fuse() -> None:
    """BatchNorms read one input that is then written in place: they must run before the write."""

    class Mutated(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.norms = nn.ModuleList([nn.BatchNorm1d(16) for _ in range(4)])

        def forward(self, x: torch.Tensor) -> list[torch.Tensor]:
            h = x * 2.0
            outs = [n(h) for n in self.norms]
            h.mul_(3.0)
            return [*outs, h]

    torch.manual_seed(0)
    mod, x = Mutated(), torch.randn(8, 16)
    eager, mine = copy.deepcopy(mod), copy.deepcopy(mod)
    with torch.no_grad():  # eager's backward would fail: BatchNorm saved the value later written
        gm = optimus.optimize(mine, (x,), config=OptimusConfig(rules=RULES, cost_model=LAUNCH_BOUND))
        for a, b in zip(eager(x), gm(x), strict=True):
            assert torch.equal(a, b)
    for (name, a), (_, b) in zip(eager.named_buffers(), mine.named_buffers(), strict=True):
        assert torch.equal(a, b), name
    assert fired(gm) == 0


@pytest.mark.parametrize(
    ("shape", "why"),
    [((8, 16, 5), "3-D input"), ((8, 12), "not a multiple of 64 bytes")],
)
def test_unsupported_shapes_decline(shape: tuple[int, ...], why: str) -> None:
    torch.manual_seed(0)

    class Norms(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.norms = nn.ModuleList([nn.BatchNorm1d(shape[1]) for _ in range(4)])

        def forward(self, x: torch.Tensor) -> list[torch.Tensor]:
            return [n(x * float(i + 1)) for i, n in enumerate(self.norms)]

    mod = Norms()
    gm = assert_bit_equal(mod, True, torch.randn(*shape))
    assert fired(gm) == 0
    assert any(why in r for r in gm.optimus_report.declined_reasons)


def test_mixed_dtypes_do_not_fuse() -> None:
    class Mixed(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.a = nn.ModuleList([nn.BatchNorm1d(16) for _ in range(4)])
            self.b = nn.ModuleList([nn.BatchNorm1d(16).double() for _ in range(4)])

        def forward(self, x: torch.Tensor) -> list[torch.Tensor]:
            return [n(x + i) for i, n in enumerate(self.a)] + [
                n(x.double() + i) for i, n in enumerate(self.b)
            ]

    torch.manual_seed(0)
    gm = assert_bit_equal(Mixed(), True, torch.randn(8, 16))
    assert batch_norms(gm) == 2  # one per dtype


def test_dependent_batch_norms_do_not_fuse() -> None:
    class Stack(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.norms = nn.ModuleList([nn.BatchNorm1d(16) for _ in range(4)])

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            for norm in self.norms:
                x = norm(x)
            return x

    torch.manual_seed(0)
    gm = assert_bit_equal(Stack(), True, torch.randn(8, 16))
    assert fired(gm) == 0


class SlicedExperts(nn.Module):
    """G experts ``Linear -> BatchNorm1d -> ReLU -> Dropout``, each over its own slice of the
    input (no shared input: batch_linear batches the linears, not merge_shared_linear)."""

    def __init__(self, g: int = 6, d_in: int = 8, width: int = 16, p: float = 0.2) -> None:
        super().__init__()
        self.experts = nn.ModuleList(
            nn.Sequential(nn.Linear(d_in, width), nn.BatchNorm1d(width), nn.ReLU(), nn.Dropout(p))
            for _ in range(g)
        )

    def forward(self, x: torch.Tensor) -> list[torch.Tensor]:
        return [e(piece) for e, piece in zip(self.experts, x.unbind(0), strict=True)]


@pytest.mark.parametrize("train", [True, False])
def test_linear_batch_norm_relu_is_one_vertical_chain(train: bool) -> None:
    """With the memory gate on (a margin of 0.1%: any real gain pays for the peak), the experts' linears, BatchNorms and ReLUs are one chain, taken
    whole; the dropouts stay per member (their draws in eager's order); state matches eager."""
    torch.manual_seed(0)
    mod = SlicedExperts()
    gm = assert_bit_equal(mod, train, torch.randn(6, 32, 8), exact=False, rules=None, memory_margin=1e-3)
    rep = gm.optimus_report
    assert rep.chains == {"vertical chain (batch_linear > batch_batch_norm > batch_unary)": 1}
    for rule in ("batch_linear", "batch_batch_norm", "batch_unary"):
        assert rep.rules_fired[rule] == 1
    dropouts = [n for n in gm.graph.nodes if n.target is F.dropout]
    assert len(dropouts) == (6 if train else 0)  # eval: noop_dropout removed them


class InplaceAfter(nn.Module):
    """Four BatchNorms whose results are rectified in place: with ``read_first`` another op reads
    each result before the write (the write then cannot be made out-of-place)."""

    def __init__(self, read_first: bool) -> None:
        super().__init__()
        self.read_first = read_first
        self.norms = nn.ModuleList([nn.BatchNorm1d(16) for _ in range(4)])

    def forward(self, x: torch.Tensor) -> list[torch.Tensor]:
        outs = []
        for i, norm in enumerate(self.norms):
            y = norm(x * float(i + 1))
            if self.read_first:
                outs.append(y * 2.0)
            outs.append(y.relu_())
        return outs


def test_inplace_relu_after_batch_norm_is_functionalized_then_fused() -> None:
    torch.manual_seed(0)
    gm = assert_bit_equal(InplaceAfter(read_first=False), True, torch.randn(8, 16), rules=None)
    assert fired(gm) == 1
    assert fired(gm, "functionalize_inplace") >= 1


def test_batch_norm_result_written_in_place_does_not_fuse() -> None:
    """A result read and then written in place is a mutated value: its BatchNorm stays in the
    chain of effects (one stacked result would hand the write a view of a split)."""
    torch.manual_seed(0)
    gm = assert_bit_equal(InplaceAfter(read_first=True), True, torch.randn(8, 16))
    assert fired(gm) == 0


@pytest.mark.parametrize("train", [True, False])
def test_parity_with_the_relayout(train: bool) -> None:
    """With ``RelayoutParams`` the affine parameters are concatenated from one storage laid out
    for the group; values, gradients and buffers stay bit-equal."""
    from optimus.params.relayout import RelayoutParams

    torch.manual_seed(0)
    gm = assert_bit_equal(Experts(4, 8, 16), train, torch.randn(32, 8), layout=RelayoutParams())
    assert fired(gm) == 1
