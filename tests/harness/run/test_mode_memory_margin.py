"""``run --memory-margin`` reaches the Optimus modes: the margin a cell is prepared under is the
one Optimus's memory gate uses, and outside the block the modes are back to Optimus's default.

WHY: a harness setting that silently did not reach ``optimus.optimize`` would report the default
trade as the one asked for; these tests read the optimizer's own report to see which ran.
"""

from __future__ import annotations

from typing import Any

import torch

from harness.modes import builtin
from models.synthetic_towers import Towers


def _prepare() -> tuple[dict, Any]:
    """(the fields the harness records, the optimizer's report)."""
    torch.manual_seed(0)
    model = Towers(n=8, width=16).eval()
    x = torch.randn(64, 8 * 16)
    with torch.no_grad():
        gm, _, fields = builtin._optimize_relayout(model, (x,))
    return fields, gm.optimus_report


def test_margin_one_judges_the_tower_chain_as_one_rewrite_and_default_does_not() -> None:
    """Under the margin the memory gate is on, and only then does it take the linear -> norm ->
    tanh chain as one rewrite (``report.chains``, optimus/engine/vertical.py). With the re-laid-out
    parameters (no weights stacked per call) the whole chain lifts no estimated peak, so it is
    taken whole; link by link, before vertical chains, the margin declined its first links."""
    default_fields, default = _prepare()
    with builtin.memory_margin(1.0):
        strict_fields, strict = _prepare()
    assert default.chains == {}
    assert strict.chains == {"vertical chain (batch_linear > batch_layer_norm > batch_unary)": 1}
    assert strict.live_peak_after <= strict.live_peak_before
    assert not any("memory" in reason for reason in strict.declined_reasons)
    assert strict_fields["nodes_after"] == default_fields["nodes_after"]


def test_the_margin_does_not_outlive_its_block() -> None:
    with builtin.memory_margin(1.0):
        pass
    assert builtin.settings().memory_margin is None
    assert _prepare()[1].chains == {}  # the gate is off again: no chain is judged
