"""``run --memory-margin`` reaches the Optimus modes: the margin a cell is prepared under is the
one Optimus's memory gate uses, and outside the block the modes are back to Optimus's default.

WHY: a harness setting that silently did not reach ``optimus.optimize`` would report the default
trade as the one asked for; these tests read the optimizer's own report to see which ran.
"""

from __future__ import annotations

import torch

from harness import modes
from models.synthetic_towers import Towers


def _prepare() -> tuple[dict, dict]:
    """(the fields the harness records, the optimizer's declined_reasons)."""
    torch.manual_seed(0)
    model = Towers(n=8, width=16).eval()
    x = torch.randn(64, 8 * 16)
    with torch.no_grad():
        gm, _, fields = modes._optimize_relayout(model, (x,))
    return fields, dict(gm.optimus_report.declined_reasons)


def _memory_declines(prepared: tuple[dict, dict]) -> int:
    return sum(n for reason, n in prepared[1].items() if "raises peak memory" in reason)


def test_margin_one_declines_peak_raising_rewrites_and_default_takes_them() -> None:
    default = _prepare()
    with modes.memory_margin(1.0):
        strict = _prepare()
    assert _memory_declines(default) == 0
    assert _memory_declines(strict) >= 1, strict[1]
    assert strict[0]["nodes_after"] > default[0]["nodes_after"]  # fewer groups fused under the gate


def test_the_margin_does_not_outlive_its_block() -> None:
    with modes.memory_margin(1.0):
        pass
    assert modes._MEMORY_MARGIN[0] is None
    assert _memory_declines(_prepare()) == 0
