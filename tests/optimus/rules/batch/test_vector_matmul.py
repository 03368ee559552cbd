"""vector_matmul: bmm with one row on the left (MMoE's gate pooling) or one column on the right ->
a broadcast multiply and a sum, in training on CPU where the cost model says the bmm's per-row
backward costs more. Parity forward and backward; must not fire without grad, in half precision,
under a dtype change (autocast), with broadcasting or with M and N both above 1; and the cost
model's decline at a small batch."""

from __future__ import annotations

import pytest
import torch
from layout_helpers import assert_same_results
from optimus_helpers import assert_parity
from torch import nn

import optimus


class GatePooling(nn.Module):
    """DeepCTR's MMoE: ``matmul(softmax(gate).unsqueeze(1), stack(experts, 1)).squeeze(1)``."""

    def forward(self, gate: torch.Tensor, experts: torch.Tensor) -> torch.Tensor:
        return torch.matmul(gate.softmax(-1).unsqueeze(1), experts * 1.0)


class ColumnPooling(nn.Module):
    def forward(self, keys: torch.Tensor, query: torch.Tensor) -> torch.Tensor:
        return torch.bmm(keys * 1.0, query.unsqueeze(-1).tanh())


def _optimize(model: nn.Module, *inputs: torch.Tensor) -> torch.fx.GraphModule:
    return optimus.optimize(model, inputs, rules=["vector_matmul"])


@pytest.mark.parametrize(
    ("model", "shapes"),
    [(GatePooling(), [(1024, 4), (1024, 4, 32)]), (ColumnPooling(), [(1024, 6, 16), (1024, 16)])],
    ids=["row", "column"],
)
def test_fires_at_a_large_batch_in_training_and_matches_eager(
    model: nn.Module, shapes: list[tuple[int, ...]]
) -> None:
    torch.manual_seed(0)
    inputs = [torch.randn(s, requires_grad=True) for s in shapes]
    gm = _optimize(model, *inputs)
    assert gm.optimus_report.rules_fired == {"vector_matmul": 1}
    assert not any(n.target in (torch.matmul, torch.bmm) for n in gm.graph.nodes)
    assert_parity(model, gm, inputs)
    assert_same_results(model(*inputs), gm(*inputs), sources=inputs)


def test_declined_at_a_small_batch_by_the_cost_model() -> None:
    inputs = [torch.randn(64, 4, requires_grad=True), torch.randn(64, 4, 32, requires_grad=True)]
    gm = _optimize(GatePooling(), *inputs)
    assert gm.optimus_report.rules_fired == {} and gm.optimus_report.declined == {"vector_matmul": 1}


@pytest.mark.parametrize("case", ["no-grad", "float16", "both-wide", "broadcast"])
def test_must_not_fire(case: str) -> None:
    grad = case != "no-grad"
    dtype = torch.float16 if case == "float16" else torch.float32
    gate = torch.randn(1024, 3 if case == "both-wide" else 1, 4, dtype=dtype, requires_grad=grad)
    experts = torch.randn(1 if case == "broadcast" else 1024, 4, 32, dtype=dtype, requires_grad=grad)

    class Plain(nn.Module):
        def forward(self, a: torch.Tensor, s: torch.Tensor) -> torch.Tensor:
            return torch.matmul(a * 1.0, s * 1.0)

    gm = _optimize(Plain(), gate, experts)
    assert "vector_matmul" not in gm.optimus_report.rules_fired
    torch.testing.assert_close(gm(gate, experts), Plain()(gate, experts))


def test_must_not_fire_under_autocast() -> None:
    class Autocast(nn.Module):
        def forward(self, a: torch.Tensor, s: torch.Tensor) -> torch.Tensor:
            with torch.autocast("cpu", dtype=torch.bfloat16):
                return torch.matmul(a * 1.0, s * 1.0)

    a, s = torch.randn(1024, 1, 4, requires_grad=True), torch.randn(1024, 4, 32, requires_grad=True)
    gm = optimus.optimize(Autocast(), (a, s), rules=["vector_matmul"])
    assert "vector_matmul" not in gm.optimus_report.rules_fired
    out = gm(a, s)
    assert out.dtype == torch.bfloat16
    torch.testing.assert_close(out, Autocast()(a, s))
