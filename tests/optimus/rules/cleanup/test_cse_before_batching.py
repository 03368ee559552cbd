"""Identical pure calls are deduplicated (CSE) before any batching rule sees them.

Twenty identical ``nan_to_num(x).tanh() * 2`` chains were stacked into one batch: CSE merged the
first call of each chain but kept stale canonical forms for the rest, so ``batch_unary`` then
batched twenty copies of the same ``tanh``. Merging the identical calls leaves one chain.
"""

from __future__ import annotations

import pytest
import torch
from optimus_helpers import LAUNCH_BOUND
from torch import nn

import optimus
from optimus.params.relayout import RelayoutParams

CONFIGS = {
    "default": lambda: optimus.OptimusConfig(),
    "launch_bound": lambda: optimus.OptimusConfig(cost_model=LAUNCH_BOUND),
    "relayout": lambda: optimus.OptimusConfig(layout=RelayoutParams()),
}


class Twenty(nn.Module):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.stack([torch.nan_to_num(x).tanh() * 2 for _ in range(20)]).sum(0)


class One(nn.Module):
    """What ``Twenty`` computes, written with the chain once."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        t = torch.nan_to_num(x).tanh() * 2
        return torch.stack([t] * 20).sum(0)


def _input() -> torch.Tensor:
    x = torch.randn(4, 8)
    x[0, 0], x[1, 1] = float("nan"), float("inf")
    return x


@pytest.mark.parametrize("config", sorted(CONFIGS))
def test_twenty_identical_chains_become_one(config: str) -> None:
    x = _input()
    gm = optimus.optimize(Twenty(), (x,), config=CONFIGS[config]())
    one = optimus.optimize(One(), (x,), config=CONFIGS[config]())
    rep = gm.optimus_report
    assert rep.nodes_after == one.optimus_report.nodes_after, gm.code
    assert sum(1 for n in gm.graph.nodes if n.target in (torch.nan_to_num, "nan_to_num")) == 1
    assert "batch_unary" not in rep.rules_fired and "batch_binary" not in rep.rules_fired
    torch.testing.assert_close(gm(x), Twenty()(x))


def test_two_outputs_are_not_merged_into_one_tensor() -> None:
    """Merging two returned values would hand the caller one tensor twice (an in-place op on one
    output would change the other): CSE declines, with a reason."""
    x = torch.randn(4, 8)
    mod = type(
        "TwoOut", (nn.Module,), {"forward": lambda self, x: (torch.nan_to_num(x), torch.nan_to_num(x))}
    )()
    gm = optimus.optimize(mod, (x,))
    a, b = gm(x)
    assert a is not b and a.data_ptr() != b.data_ptr()
    assert any("both values are outputs" in r for r in gm.optimus_report.declined_reasons)


@pytest.mark.compile
def test_backend_deduplicates_before_batching() -> None:
    torch._dynamo.reset()
    x = _input()
    chosen = optimus.backend(optimus.OptimusConfig(cost_model=LAUNCH_BOUND))
    compiled = torch.compile(Twenty(), backend=chosen)
    torch.testing.assert_close(compiled(x), Twenty()(x))
    rep = chosen.reports[-1]
    assert "batch_unary" not in rep.rules_fired and rep.rules_fired.get("cse", 0) >= 40
