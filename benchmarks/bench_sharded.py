"""Sharded cells: a model's embedding tables sharded over ranks (torchrec DMP under torchrun),
its dense part data-parallel, per commit.

Every figure is read from one harness run (``optimus-bench run --nproc N --sharding auto``):
the cell's latency is the slowest rank's at each step (``harness.run.sharded.merge``), its peak
memory and compile time the largest over ranks. The nightly hands over the cells it measured
at this commit (``OPTIMUS_ASV_SHARDED_CELLS``), so the torchrun jobs run once per night. A cell
the harness marks failed (a rank crashed, hung or ran out of memory; parity mismatch) fails
its benchmarks rather than report a number. ``OPTIMUS_ASV_SHARDED=off`` skips them (n/a).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from benchmarks.common import (
    CELLS_TIMEOUT_S,
    find_cell,
    load_cells,
    median_latency_ms,
    run_harness_cells,
    sharded_families,
    sharded_modes,
    sharded_nproc,
    sharded_on,
    sharded_phases,
    sharded_scale,
)


def sharded_cells() -> str:
    """Run the sharded grid once per commit (unless skipped); return the results path."""
    if not sharded_on():
        return ""
    nproc = sharded_nproc()
    args = ("--nproc", str(nproc), "--sharding", "auto", "--threads", "1")
    return str(
        run_harness_cells(sharded_families(), [sharded_scale()], sharded_modes(), sharded_phases(),
                          Path.cwd() / "harness-sharded", args, "OPTIMUS_ASV_SHARDED_CELLS", nproc)
    )  # fmt: skip


sharded_cells.timeout = CELLS_TIMEOUT_S  # type: ignore[attr-defined]


class ShardedCells:
    """Per-cell figures of the sharded grid (family x phase x mode, at one scale)."""

    params = (sharded_families(), sharded_phases(), sharded_modes())
    param_names = ("family", "phase", "mode")
    setup_cache = staticmethod(sharded_cells)
    timeout = CELLS_TIMEOUT_S

    def setup(self, cells_path: str, family: str, phase: str, mode: str) -> None:
        if not cells_path:
            raise NotImplementedError("sharded cells skipped (OPTIMUS_ASV_SHARDED=off)")
        self.cell: dict[str, Any] = find_cell(load_cells(cells_path), family, sharded_scale(), mode, phase)
        self.ranks = [r for r in self.cell.get("ranks") or [] if r.get("latency_ms")]
        if not self.ranks:
            raise RuntimeError(f"sharded cell {family}/{phase}/{mode} has no per-rank records")

    def track_slowest_rank_ms(self, cells_path: str, family: str, phase: str, mode: str) -> float:
        """Median over steps of the slowest rank's step time (the cell's latency)."""
        return median_latency_ms(self.cell)

    track_slowest_rank_ms.unit = "ms"  # type: ignore[attr-defined]

    def track_rank_imbalance(self, cells_path: str, family: str, phase: str, mode: str) -> float:
        """Slowest rank's median step / fastest rank's (1.0: balanced shards)."""
        medians = [float(r["latency_ms"]["median"]) for r in self.ranks]
        return max(medians) / min(medians)

    track_rank_imbalance.unit = "ratio"  # type: ignore[attr-defined]

    def track_peak_mem_mb(self, cells_path: str, family: str, phase: str, mode: str) -> float:
        """The largest rank's peak memory, in MiB."""
        return float(self.cell["peak_mem_bytes"]) / 2**20

    track_peak_mem_mb.unit = "MiB"  # type: ignore[attr-defined]

    def track_compile_s(self, cells_path: str, family: str, phase: str, mode: str) -> float:
        """The slowest rank's first-call time beyond a step, caches off (Optimus time included)."""
        return float(self.cell["compile_s"])

    track_compile_s.unit = "s"  # type: ignore[attr-defined]
