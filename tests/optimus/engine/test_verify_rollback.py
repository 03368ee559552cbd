"""verify=True: a rewrite it rejects leaves the graph exactly as before (edges and node order)."""

from __future__ import annotations

from collections.abc import Sequence

import pytest
import torch
from optimus_helpers import LAUNCH_BOUND
from torch import fx, nn

import optimus
from optimus.engine.rule import Cost, HorizontalRule
from optimus.rules import REGISTRY
from optimus.semantics.graph_copy import copy_graph_module


class SigmoidForTanh(HorizontalRule):
    """Batches tanh calls but computes sigmoid: a rewrite verify must reject."""

    name = "test_sigmoid_for_tanh"

    def key(self, node, ctx):  # type: ignore[no-untyped-def]
        canon = ctx.canon(node)
        return "tanh" if canon is not None and canon.op == "tanh" else None

    def fuse(self, nodes: Sequence[fx.Node], b) -> Sequence[fx.Node]:  # type: ignore[no-untyped-def]
        x = b.stack([b.ctx.canon(n)["input"] for n in nodes])
        return b.unbind(b.call(torch.sigmoid, x), len(nodes))

    def cost(self, nodes, ctx):  # type: ignore[no-untyped-def]
        return Cost(launches=len(nodes)), Cost(launches=1)


class LateInput(nn.Module):
    """The second tanh's input is computed after the first tanh, so batching the two moves that
    input up: a rollback must move it back."""

    def forward(self, x: torch.Tensor, y: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        a = torch.tanh(x)
        y2 = y * 2.0 + 1.0
        b = torch.tanh(y2)
        return a, b


def test_rejected_rewrite_leaves_the_graph_code_identical(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(REGISTRY, SigmoidForTanh.name, SigmoidForTanh)
    traced = fx.symbolic_trace(LateInput())
    before = copy_graph_module(traced).code  # the code optimize starts from
    xs = (torch.randn(3, 4), torch.randn(3, 4))
    gm = optimus.optimize(traced, xs, rules=[SigmoidForTanh.name], cost_model=LAUNCH_BOUND, verify=True)
    assert gm.optimus_report.rolled_back == {SigmoidForTanh.name: 1}
    assert gm.code == before
    for a, b in zip(gm(*xs), LateInput()(*xs), strict=True):
        torch.testing.assert_close(a, b)


class WritesItsInput(nn.Module):
    """Four parallel tanh towers, then an in-place write to the caller's input."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        outs = [torch.tanh(p) for p in x.split(4, dim=1)]
        x.add_(1.0)
        return torch.cat(outs, dim=1) * 2


def test_verify_runs_a_model_that_writes_its_input_in_place() -> None:
    x = torch.randn(8, 16)
    expected_x = x.clone() + 1.0
    reference = WritesItsInput()(x.clone())
    gm = optimus.optimize(WritesItsInput(), (x.clone(),), verify=True, cost_model=LAUNCH_BOUND)
    assert not gm.optimus_report.rolled_back
    assert not any("failed" in note for note in gm.optimus_report.notes), gm.optimus_report.notes
    got_x = x.clone()
    torch.testing.assert_close(gm(got_x), reference)
    torch.testing.assert_close(got_x, expected_x)
