"""batch_slice_matmul: matmuls with consecutive slices ``P[i][e]`` of one tensor -> one bmm over
the narrowed ``P``.

Fires on DeepCTR's DCNMix expert chain (``V[i][e].t() @ x``, ``C[i][e] @ v``, ``U[i][e] @ v``)
and on ``x_e @ P[e]``, in any slice order; parity forward and backward (values, the gradient on
``P`` and on the inputs, dtypes, strides, aliasing); must not fire on slices that are not
consecutive, slices of different tensors, a written ``P``, across grad-mode/autocast regions, in
mixed dtypes; the cost model declines two forward-only matmuls with separate inputs.
"""

from __future__ import annotations

import pytest
import torch
from layout_helpers import assert_same_results
from optimus_helpers import LAUNCH_BOUND, assert_parity, count_calls
from torch import nn

import optimus

BS, IN, R, E, L = 16, 12, 4, 3, 2


class CrossMix(nn.Module):
    """DeepCTR's CrossNetMix expert chain, ``[L, E, in, r]`` parameters sliced per layer/expert."""

    def __init__(self, order: tuple[int, ...] = tuple(range(E))) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.order = order
        self.V = nn.Parameter(torch.randn(L, E, IN, R) * 0.3)
        self.C = nn.Parameter(torch.randn(L, E, R, R) * 0.3)
        self.U = nn.Parameter(torch.randn(L, E, IN, R) * 0.3)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x0 = x.unsqueeze(2)
        xl = x0
        for i in range(L):
            outs = []
            for e in self.order:
                v = torch.tanh(torch.matmul(self.V[i][e].t(), xl))
                v = torch.tanh(torch.matmul(self.C[i][e], v))
                outs.append(torch.matmul(self.U[i][e], v).squeeze(2))
            xl = torch.stack(outs, 2).mean(2, keepdim=True) + xl
        return xl.squeeze(2)


class RightSlices(nn.Module):
    """``x_e @ P[e]`` with a different ``x_e`` per slice, results returned as they are."""

    def __init__(self, indices: tuple[int, ...] = (0, 1, 2), two: bool = False) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.indices = indices
        self.P = nn.Parameter(torch.randn(E, IN, R))
        self.Q = nn.Parameter(torch.randn(E, IN, R)) if two else None

    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, ...]:
        outs = []
        for n, e in enumerate(self.indices):
            p = self.Q if self.Q is not None and n % 2 else self.P
            outs.append((x * (n + 1.0)) @ p[e])
        return tuple(outs)


def _optimize(model: nn.Module, x: torch.Tensor, **kw: object) -> torch.fx.GraphModule:
    return optimus.optimize(model, (x,), rules=["batch_slice_matmul"], **kw)  # type: ignore[arg-type]


@pytest.mark.parametrize("order", [(0, 1, 2), (2, 0, 1)], ids=["in-order", "permuted"])
def test_fires_on_the_dcnmix_chain_and_matches_eager(order: tuple[int, ...]) -> None:
    model = CrossMix(order)
    x = torch.randn(BS, IN, requires_grad=True)
    gm = _optimize(model, x)
    assert gm.optimus_report.rules_fired == {"batch_slice_matmul": 3 * L}
    assert count_calls(gm, torch.matmul) == 0 and count_calls(gm, torch.bmm) == 3 * L
    assert_parity(model, gm, [x])  # the gradients on V, C, U and x
    assert_same_results(model(x), gm(x), sources=[x, *model.parameters()])


def test_right_form_returned_keeps_strides_dtype_and_memory() -> None:
    model = RightSlices().double()
    x = torch.randn(BS, 5, IN, dtype=torch.float64, requires_grad=True)
    gm = _optimize(model, x, cost_model=LAUNCH_BOUND)
    assert gm.optimus_report.rules_fired == {"batch_slice_matmul": 1}
    assert_parity(model, gm, [x])
    assert_same_results(model(x), gm(x), sources=[x, *model.parameters()])


def test_cost_model_declines_two_forward_only_matmuls() -> None:
    """Without a gradient, two GEMM launches cost about what a stack and one bmm cost."""
    model = RightSlices(indices=(0, 1))
    with torch.no_grad():
        x = torch.randn(BS, 5, IN)
        gm = _optimize(model, x)
    assert gm.optimus_report.rules_fired == {}
    assert gm.optimus_report.declined == {"batch_slice_matmul": 1}


class WrittenP(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.register_buffer("P", torch.randn(E, IN, R))

    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, ...]:
        a = x @ self.P[0]
        self.P.mul_(2.0)
        return a, (x * 2.0) @ self.P[1]


class RegionSplit(nn.Module):
    def __init__(self, mode: str) -> None:
        super().__init__()
        self.mode = mode
        self.P = nn.Parameter(torch.randn(E, IN, R))

    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, ...]:
        a = x @ self.P[0]
        ctx = torch.no_grad() if self.mode == "grad" else torch.autocast("cpu", dtype=torch.bfloat16)
        with ctx:
            b = (x * 2.0) @ self.P[1]
        return a, b


class AutocastBoth(nn.Module):
    """Both matmuls under autocast: bfloat16 results of float32 operands."""

    def __init__(self) -> None:
        super().__init__()
        self.P = nn.Parameter(torch.randn(E, IN, R))

    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, ...]:
        with torch.autocast("cpu", dtype=torch.bfloat16):
            return x @ self.P[0], (x * 2.0) @ self.P[1]


@pytest.mark.parametrize(
    "model",
    [
        RightSlices(indices=(0, 2)),
        RightSlices(indices=(0, 1), two=True),
        WrittenP(),
        RegionSplit("grad"),
        RegionSplit("autocast"),
        AutocastBoth(),
    ],
    ids=["not-consecutive", "two-tensors", "written-P", "no-grad-region", "autocast-region", "autocast-both"],
)
def test_must_not_fire(model: nn.Module) -> None:
    x = torch.randn(BS, 5, IN, requires_grad=True)
    state = {k: v.clone() for k, v in model.state_dict().items()}
    gm = _optimize(model, x, cost_model=LAUNCH_BOUND)
    assert "batch_slice_matmul" not in gm.optimus_report.rules_fired
    model.load_state_dict(state)
    eager = model(x)
    model.load_state_dict(state)
    assert_same_results(eager, gm(x), sources=[x])
