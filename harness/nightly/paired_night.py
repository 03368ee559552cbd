"""The paired part of a night: tonight's checkout measured side by side with the base night's
commit, cell by cell, and the pairs merged into tonight's results.

Why: a night compared with another night measured earlier, under other load, carries that
load (one night's noise on the 2-core development machine is about 4.5%), and a compiled cell
can run at two speeds in two processes of one commit. Measured side by side (``harness.run.
paired``), a cell's latency verdict is the 95% interval of its per-round ratio against the base
commit, and ``compare`` judges a paired cell by that interval (``harness.gate.compare``). The
night's own unpaired cells are still measured and kept: they are the absolute figures that asv,
the history and the change-point detector read.

What stays unpaired: the sharded suite (each sharded cell is a torchrun job of its own; pairing
it needs both commits inside one job, which the sharded runner does not do yet).
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from harness.run import checkouts, pair_grid
from harness.run.paired import PairOptions
from harness.spec import CellKey

MEASURE_KEYS = (
    "rounds",
    "max_rounds",
    "steps",
    "warmup",
    "processes",
    "max_processes",
    "compiles",
    "process_spread",
    "round_warmup_ms",
)
PAIRED_KEYS = ("enabled", *MEASURE_KEYS, "threshold", "anchor_nights")
PAIR_FIELDS = ("base_sha", "new_sha", "paired_ratio", "paired_ci95", "paired")


@dataclass(frozen=True)
class PairedConfig:
    """The ``paired`` section of the nightly config: how a pair is measured (``PairOptions``'
    fields), the threshold of its verdict and how long an anchor stays."""

    enabled: bool = True
    measure: PairOptions = field(default_factory=PairOptions)
    threshold: float = 0.02
    anchor_nights: int = 7

    @staticmethod
    def from_section(sec: dict[str, Any], where: str) -> PairedConfig:
        bad = sorted(set(sec) - set(PAIRED_KEYS))
        if bad:
            raise ValueError(f"{where}: unknown field(s) {bad}; allowed: {', '.join(PAIRED_KEYS)}")
        for name, v in sec.items():
            if name != "enabled" and (
                isinstance(v, bool) or not isinstance(v, int | float) or not math.isfinite(v) or v < 0
            ):
                raise ValueError(f"{where}.{name}: must be a number >= 0, got {v!r}")
        if not isinstance(sec.get("enabled", True), bool):
            raise ValueError(f"{where}.enabled: must be true or false, got {sec['enabled']!r}")
        measure = PairOptions(**{k: sec[k] for k in MEASURE_KEYS if k in sec})
        try:
            measure.check()
        except ValueError as e:
            raise ValueError(f"{where}: {e}") from None
        rest = {k: sec[k] for k in ("enabled", "threshold", "anchor_nights") if k in sec}
        return PairedConfig(measure=measure, **rest)

    def options(self, device: str, threads: int, provider: str, seed: int) -> PairOptions:
        return replace(self.measure, device=device, threads=threads, provider=provider, seed=seed)


def pair_cells(
    repo: Path,
    base_sha: str,
    keys: list[CellKey],
    cfg: PairedConfig,
    opt: PairOptions,
    out: Path | None,
    log: Callable[[str], None],
    new_env: dict[str, str] | None = None,
) -> dict[str, Any]:
    """Pair ``keys`` of ``base_sha`` against this checkout (as it is, local changes included).
    ``new_env``: extra environment of tonight's workers only."""
    with checkouts.checked_out(repo, [base_sha, str(repo)]) as (base, new):
        cells = [(k.model, k.scale, k.mode, k.phase) for k in keys]
        return pair_grid.run_grid(base, new, cells, opt, threshold=cfg.threshold, out=str(out) if out else None,
                                  new_env=new_env, log=log)  # fmt: skip


def merge(night: dict[str, Any], pairs: dict[str, Any]) -> None:
    """Give each of tonight's cells its pair's figures (a failed pair fails the cell: lost data)."""
    by_key = {CellKey.of(c): c for c in pairs["cells"]}
    for cell in night["cells"]:
        p = by_key.get(CellKey.of(cell))
        if p is None:
            continue
        for f in PAIR_FIELDS:
            if f in p:
                cell[f] = p[f]
        if p["status"] != "ok" and cell["status"] == "ok":
            cell["status"], cell["error"] = p["status"], f"paired measurement: {p['error']}"


def bisect_command(base_sha: str, sha: str, key: CellKey, threshold: float) -> str:
    return (
        f"optimus-bench bisect {base_sha[:12]} {sha[:12]} --cell {key.model}/{key.scale}/{key.mode}/{key.phase} "
        f"--threshold {threshold:g}"
    )
