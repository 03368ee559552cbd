"""CSE never merges two values that both reach the caller, also through views: the two outputs
would share memory, so an in-place op on one would change the other. Found by the user-program
fuzzer (tests/optimus/fuzz_run.py)."""

from __future__ import annotations

import pytest
import torch
from optimus_helpers import LAUNCH_BOUND
from torch import nn

import optimus
from optimus.params.relayout import RelayoutParams


class TwinsOneThroughAView(nn.Module):
    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        h = x * 1.5
        o0 = torch.sigmoid(h[:, :2])
        o0 = o0.as_strided(o0.shape, (o0.shape[1], 1))
        o1 = torch.sigmoid(h[:, :2])
        return o0, o1


@pytest.mark.parametrize("layout", [None, RelayoutParams()])
def test_twins_reaching_the_caller_through_a_view_stay_apart(layout: RelayoutParams | None) -> None:
    x = torch.randn(4, 6)
    config = optimus.OptimusConfig(cost_model=LAUNCH_BOUND, **({"layout": layout} if layout else {}))
    gm = optimus.optimize(TwinsOneThroughAView(), (x,), config=config)
    o0, o1 = gm(x)
    assert o0.untyped_storage().data_ptr() != o1.untyped_storage().data_ptr()
    expected = o1.clone()
    o0.add_(1.0)  # the caller writes one output: the other must not change
    torch.testing.assert_close(o1, expected)
    assert any("both values are outputs" in r for r in gm.optimus_report.declined_reasons)


def test_twins_read_only_inside_the_graph_are_still_merged() -> None:
    class Inner(nn.Module):
        def forward(self, x: torch.Tensor) -> torch.Tensor:
            a = torch.sigmoid(x[:, :2]).t()
            b = torch.sigmoid(x[:, :2])
            return a.t() + b

    x = torch.randn(4, 6)
    gm = optimus.optimize(Inner(), (x,), cost_model=LAUNCH_BOUND)
    assert gm.optimus_report.rules_fired.get("cse", 0) >= 1
    torch.testing.assert_close(gm(x), Inner()(x))
