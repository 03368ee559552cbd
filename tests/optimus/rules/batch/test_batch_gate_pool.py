"""batch_gate_pool: T gate poolings of one experts tensor -> one bmm over the stacked gates.

Fires on the matmul form (DeepCTR's MMOE) in training and on both forms without a gradient;
declines the multiply-and-sum form in training on CPU (the bmm's per-row backward); parity
forward and backward (values, gradients, dtypes, strides, aliasing); must not fire on a written
experts tensor or gate, on different experts tensors, across grad-mode/autocast regions, in half
precision; the cost model declines where launches cost nothing.
"""

from __future__ import annotations

import pytest
import torch
from layout_helpers import assert_same_results
from optimus_helpers import LAUNCH_BOUND, assert_parity, count_calls
from torch import nn

import optimus

B, E, D = 64, 4, 32


class MatmulPool(nn.Module):
    """DeepCTR's MMOE: ``matmul(softmax(gate).unsqueeze(1), experts).squeeze(1)`` per task."""

    def forward(self, g1: torch.Tensor, g2: torch.Tensor, s: torch.Tensor) -> tuple[torch.Tensor, ...]:
        s = s * 1.0
        a = torch.matmul(g1.softmax(1).unsqueeze(1), s).squeeze(1)
        b = torch.matmul(g2.softmax(1).unsqueeze(1), s).squeeze(1)
        return a.relu(), b.tanh()


class MulSumPool(nn.Module):
    """This repository's mmoe: ``(softmax(gate).unsqueeze(-1) * experts).sum(dim=1)`` per task."""

    def forward(self, g1: torch.Tensor, g2: torch.Tensor, s: torch.Tensor) -> tuple[torch.Tensor, ...]:
        s = s * 1.0
        a = (g1.softmax(1).unsqueeze(-1) * s).sum(dim=1)
        b = torch.sum(s * g2.softmax(1).unsqueeze(-1), 1)
        return a.relu(), b.tanh()


class Returned(nn.Module):
    """Four pooled results returned as they are: their strides and memory are the caller's to see,
    so each piece of the bmm gets a contiguous copy (priced)."""

    def forward(self, g: torch.Tensor, s: torch.Tensor) -> tuple[torch.Tensor, ...]:
        return tuple(torch.matmul(gt.unsqueeze(1), s) for gt in g.unbind(1))


def _inputs(grad: bool = True, dtype: torch.dtype = torch.float32) -> list[torch.Tensor]:
    torch.manual_seed(0)
    shapes = [(B, E), (B, E), (B, E, D)]
    return [torch.randn(s, dtype=dtype, requires_grad=grad) for s in shapes]


def _optimize(model: nn.Module, inputs: list[torch.Tensor], **kw: object) -> torch.fx.GraphModule:
    return optimus.optimize(model, tuple(inputs), rules=["batch_gate_pool"], **kw)  # type: ignore[arg-type]


def test_matmul_form_fires_in_training_and_matches_eager() -> None:
    inputs = _inputs()
    gm = _optimize(MatmulPool(), inputs)
    assert gm.optimus_report.rules_fired == {"batch_gate_pool": 1}
    assert count_calls(gm, torch.bmm) == 1 and count_calls(gm, torch.matmul) == 0
    assert_parity(MatmulPool(), gm, inputs)
    assert_same_results(MatmulPool()(*inputs), gm(*inputs), sources=inputs)


def test_returned_results_keep_eager_strides_and_memory() -> None:
    torch.manual_seed(0)
    inputs = [torch.randn(B, 4, E, requires_grad=True), torch.randn(B, E, D, requires_grad=True)]
    gm = _optimize(Returned(), inputs, cost_model=LAUNCH_BOUND)
    assert gm.optimus_report.rules_fired == {"batch_gate_pool": 1}
    assert_parity(Returned(), gm, inputs)
    assert_same_results(Returned()(*inputs), gm(*inputs), sources=inputs)  # contiguous, not aliased


def test_mul_sum_form_fires_without_a_gradient() -> None:
    inputs = _inputs(grad=False)
    gm = _optimize(MulSumPool(), inputs)
    assert gm.optimus_report.rules_fired == {"batch_gate_pool": 1}
    assert count_calls(gm, torch.bmm) == 1
    assert_same_results(MulSumPool()(*inputs), gm(*inputs), sources=inputs)


def test_float64_keeps_dtype_and_gradients() -> None:
    inputs = _inputs(dtype=torch.float64)
    gm = _optimize(MatmulPool(), inputs)
    assert gm.optimus_report.rules_fired == {"batch_gate_pool": 1}
    assert_parity(MatmulPool(), gm, inputs)
    assert all(o.dtype == torch.float64 for o in gm(*inputs))


def test_mul_sum_declined_in_training_on_cpu() -> None:
    inputs = _inputs()
    gm = _optimize(MulSumPool(), inputs)
    report = gm.optimus_report
    assert report.rules_fired == {}
    assert any("per row" in r for r in report.declined_reasons), report.declined_reasons
    assert_parity(MulSumPool(), gm, inputs)


def test_cost_model_declines_two_matmuls_without_a_gradient() -> None:
    """Forward only, two bmm launches cost what a stack and one bmm cost: nothing to win."""
    inputs = _inputs(grad=False)
    gm = _optimize(MatmulPool(), inputs)
    assert gm.optimus_report.rules_fired == {}
    assert gm.optimus_report.declined == {"batch_gate_pool": 1}


class WrittenExperts(nn.Module):
    def forward(self, g1: torch.Tensor, g2: torch.Tensor, s: torch.Tensor) -> tuple[torch.Tensor, ...]:
        s = s * 1.0
        a = torch.matmul(g1.unsqueeze(1), s)
        s.mul_(2.0)  # the second task reads the written experts
        return a, torch.matmul(g2.unsqueeze(1), s)


class WrittenInputExperts(nn.Module):
    """The experts are the caller's tensor, written between the tasks: not functionalizable."""

    def forward(self, g1: torch.Tensor, g2: torch.Tensor, s: torch.Tensor) -> tuple[torch.Tensor, ...]:
        a = torch.matmul(g1.unsqueeze(1), s)
        s.mul_(2.0)
        return a, torch.matmul(g2.unsqueeze(1), s)


class WrittenGate(nn.Module):
    def forward(self, g1: torch.Tensor, g2: torch.Tensor, s: torch.Tensor) -> tuple[torch.Tensor, ...]:
        s, g = s * 1.0, g2.unsqueeze(1) * 1.0
        a = torch.matmul(g, s)
        g.add_(1.0)
        return a, torch.matmul(g1.unsqueeze(1), s), g


class TwoExperts(nn.Module):
    def forward(self, g1: torch.Tensor, g2: torch.Tensor, s: torch.Tensor) -> tuple[torch.Tensor, ...]:
        return torch.matmul(g1.unsqueeze(1), s * 1.0), torch.matmul(g2.unsqueeze(1), s * 2.0)


class NoGradTask(nn.Module):
    def forward(self, g1: torch.Tensor, g2: torch.Tensor, s: torch.Tensor) -> tuple[torch.Tensor, ...]:
        s = s * 1.0
        a = torch.matmul(g1.unsqueeze(1), s)
        with torch.no_grad():
            b = torch.matmul(g2.unsqueeze(1), s)
        return a, b


class AutocastTask(nn.Module):
    def forward(self, g1: torch.Tensor, g2: torch.Tensor, s: torch.Tensor) -> tuple[torch.Tensor, ...]:
        s = s * 1.0
        a = torch.matmul(g1.unsqueeze(1), s)
        with torch.autocast("cpu", dtype=torch.bfloat16):
            b = torch.matmul(g2.unsqueeze(1), s)
        return a, b


class AutocastMulSum(nn.Module):
    def forward(self, g1: torch.Tensor, g2: torch.Tensor, s: torch.Tensor) -> tuple[torch.Tensor, ...]:
        s = s * 1.0
        with torch.autocast("cpu", dtype=torch.bfloat16):
            return (g1.unsqueeze(-1) * s).sum(1), (g2.unsqueeze(-1) * s).sum(1)


@pytest.mark.parametrize(
    ("model", "grad", "dtype"),
    [
        (WrittenExperts(), True, torch.float32),
        (WrittenInputExperts(), False, torch.float32),
        (WrittenGate(), True, torch.float32),
        (TwoExperts(), True, torch.float32),
        (NoGradTask(), True, torch.float32),
        (AutocastTask(), True, torch.float32),
        (AutocastMulSum(), False, torch.float32),
        (MatmulPool(), True, torch.bfloat16),
    ],
    ids=[
        "written-experts",
        "written-input-experts",
        "written-gate",
        "two-experts",
        "no-grad-region",
        "autocast-region",
        "autocast-mul",
        "bf16",
    ],
)
def test_must_not_fire(model: nn.Module, grad: bool, dtype: torch.dtype) -> None:
    inputs = _inputs(grad=grad, dtype=dtype)
    gm = _optimize(model, [x.clone() for x in inputs], cost_model=LAUNCH_BOUND)
    assert "batch_gate_pool" not in gm.optimus_report.rules_fired
    eager_in, opt_in = [x.clone() for x in inputs], [x.clone() for x in inputs]
    assert_same_results(model(*eager_in), gm(*opt_in), sources=opt_in)
    for a, b in zip(eager_in, opt_in, strict=True):
        torch.testing.assert_close(a, b)  # the write lands on the caller's tensor alike
