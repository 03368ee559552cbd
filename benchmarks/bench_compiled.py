"""Compiled models: the paper's figures per commit (speedup, memory, compile time, nodes).

Every figure is read from one harness run (``optimus-bench run``) per commit: modes
``compile`` and ``compile+optimus`` for each family x scale x phase of the grid. The run is
expensive (Inductor compiles C++ on CPU), so it happens once in a shared ``setup_cache``
and every class below reads the same cells. A cell the harness marks failed (crash,
timeout, parity mismatch) makes its benchmarks fail rather than report a number.
"""

from __future__ import annotations

from pathlib import Path

from benchmarks.common import (
    BASE_MODE,
    CELLS_TIMEOUT_S,
    COMPILED_MODES,
    TARGET,
    families,
    find_cell,
    load_cells,
    median_latency_ms,
    phases,
    run_harness_cells,
    scales,
)


def compiled_cells() -> str:
    """Run the harness over the grid once per commit; return the merged results path."""
    return str(run_harness_cells(families(), scales(), COMPILED_MODES, phases(), Path.cwd() / "harness"))


compiled_cells.timeout = CELLS_TIMEOUT_S  # type: ignore[attr-defined]


class CompiledSpeedup:
    """compile+optimus against compile, per family x scale x phase (higher is better)."""

    params = (families(), scales(), phases())
    param_names = ("family", "scale", "phase")
    setup_cache = staticmethod(compiled_cells)
    timeout = CELLS_TIMEOUT_S

    def setup(self, cells_path: str, family: str, scale: str, phase: str) -> None:
        cells = load_cells(cells_path)
        self.base = find_cell(cells, family, scale, BASE_MODE, phase)
        self.opt = find_cell(cells, family, scale, TARGET, phase)

    def track_speedup(self, cells_path: str, family: str, scale: str, phase: str) -> float:
        """Median latency of compile / median latency of compile+optimus."""
        return median_latency_ms(self.base) / median_latency_ms(self.opt)

    track_speedup.unit = "x"  # type: ignore[attr-defined]

    def track_peak_mem_ratio(self, cells_path: str, family: str, scale: str, phase: str) -> float:
        """Peak memory of compile+optimus / peak memory of compile (below 1 saves memory)."""
        return float(self.opt["peak_mem_bytes"]) / float(self.base["peak_mem_bytes"])

    track_peak_mem_ratio.unit = "ratio"  # type: ignore[attr-defined]


class CompiledCells:
    """Per-mode figures: latency, peak memory and compile time of each compiled mode."""

    params = (families(), scales(), phases(), list(COMPILED_MODES))
    param_names = ("family", "scale", "phase", "mode")
    setup_cache = staticmethod(compiled_cells)
    timeout = CELLS_TIMEOUT_S

    def setup(self, cells_path: str, family: str, scale: str, phase: str, mode: str) -> None:
        self.cell = find_cell(load_cells(cells_path), family, scale, mode, phase)

    def track_compile_s(self, cells_path: str, family: str, scale: str, phase: str, mode: str) -> float:
        """Wall time of the first call, compile caches off (Optimus time included)."""
        return float(self.cell["compile_s"])

    track_compile_s.unit = "s"  # type: ignore[attr-defined]

    def track_latency_ms(self, cells_path: str, family: str, scale: str, phase: str, mode: str) -> float:
        """Median latency of one step (forward in infer; forward+backward+step in train)."""
        return median_latency_ms(self.cell)

    track_latency_ms.unit = "ms"  # type: ignore[attr-defined]

    def track_peak_mem_mb(self, cells_path: str, family: str, scale: str, phase: str, mode: str) -> float:
        """Peak memory of the cell as the harness measures it, in MiB."""
        return float(self.cell["peak_mem_bytes"]) / 2**20

    track_peak_mem_mb.unit = "MiB"  # type: ignore[attr-defined]


class OptimizedGraph:
    """What Optimus did to the dense graph inside compile+optimus (same cells)."""

    params = (families(), scales(), phases())
    param_names = ("family", "scale", "phase")
    setup_cache = staticmethod(compiled_cells)
    timeout = CELLS_TIMEOUT_S

    def setup(self, cells_path: str, family: str, scale: str, phase: str) -> None:
        self.cell = find_cell(load_cells(cells_path), family, scale, TARGET, phase)
        if all(self.cell.get(k) is None for k in ("nodes_after", "nodes_before", "optimus_s")):
            # n/a (skipped), not a fake zero; one missing field alone fails its benchmark
            raise NotImplementedError(f"the harness recorded no node counts for {family}/{scale}/{phase}")

    def track_nodes_after(self, cells_path: str, family: str, scale: str, phase: str) -> int:
        """FX nodes of the dense graph after Optimus (fewer nodes: fewer kernels)."""
        return int(self.cell["nodes_after"])

    track_nodes_after.unit = "nodes"  # type: ignore[attr-defined]

    def track_nodes_before(self, cells_path: str, family: str, scale: str, phase: str) -> int:
        """FX nodes of the dense graph Optimus was given (changes when models change)."""
        return int(self.cell["nodes_before"])

    track_nodes_before.unit = "nodes"  # type: ignore[attr-defined]

    def track_optimus_s(self, cells_path: str, family: str, scale: str, phase: str) -> float:
        """Seconds Optimus itself spent inside the compile of this cell."""
        return float(self.cell["optimus_s"])

    track_optimus_s.unit = "s"  # type: ignore[attr-defined]


class DashboardSummaries:
    """The torch.compile dashboard's summaries of compile+optimus against compile over the grid's
    rows (family x scale), per phase (``harness.report.summaries``, docs/harness.md "Dashboard
    summaries"). A failing or mismatched cell is not a failed benchmark here: it lowers the pass
    rate, and is left out of the other figures, as the dashboard does."""

    params = (phases(),)
    param_names = ("phase",)
    setup_cache = staticmethod(compiled_cells)
    timeout = CELLS_TIMEOUT_S

    def setup(self, cells_path: str, phase: str) -> None:
        try:
            from harness.report import summaries
        except ImportError as err:  # a commit before the summaries: n/a, not a number
            raise NotImplementedError("this commit's harness has no dashboard summaries") from err
        grid = {(f, s) for f in families() for s in scales()}
        cells = [
            c
            for c in load_cells(cells_path)
            if (c.get("model"), c.get("scale")) in grid and c.get("mode") in (BASE_MODE, TARGET)
        ]
        self.summary = summaries.summarize({"cells": cells}, phase, TARGET, BASE_MODE)

    def _figure(self, name: str) -> float:
        v = getattr(self.summary, name)
        if v is None:  # no row passed: the figure does not exist (n/a), it is not 0
            raise NotImplementedError(f"no passing row for {name}")
        return float(v)

    def track_pass_rate(self, cells_path: str, phase: str) -> float:
        """Rows where compile+optimus and compile both ran and matched eager, in % of all rows."""
        return float(100 * self.summary.rate)

    track_pass_rate.unit = "%"  # type: ignore[attr-defined]

    def track_geomean_speedup(self, cells_path: str, phase: str) -> float:
        """Geomean speedup over compile, each row clipped to at least 1.0x as the dashboard does."""
        return self._figure("geomean_clipped")

    track_geomean_speedup.unit = "x"  # type: ignore[attr-defined]

    def track_geomean_speedup_unclipped(self, cells_path: str, phase: str) -> float:
        """Geomean speedup over compile, slowdowns counted: the honest one."""
        return self._figure("geomean")

    track_geomean_speedup_unclipped.unit = "x"  # type: ignore[attr-defined]

    def track_compile_latency_geomean_s(self, cells_path: str, phase: str) -> float:
        """Geomean of compile+optimus's compile time over the passing rows."""
        return self._figure("compile_geomean_s")

    track_compile_latency_geomean_s.unit = "s"  # type: ignore[attr-defined]

    def track_compile_latency_max_s(self, cells_path: str, phase: str) -> float:
        """The longest compile of compile+optimus over the passing rows."""
        return self._figure("compile_max_s")

    track_compile_latency_max_s.unit = "s"  # type: ignore[attr-defined]

    def track_peak_mem_compression_mean(self, cells_path: str, phase: str) -> float:
        """Mean of compile's peak memory / compile+optimus's (above 1: less memory)."""
        return self._figure("mem_ratio_mean")

    track_peak_mem_compression_mean.unit = "ratio"  # type: ignore[attr-defined]

    def track_peak_mem_compression_min(self, cells_path: str, phase: str) -> float:
        """The worst row's compile peak / compile+optimus peak."""
        return self._figure("mem_ratio_min")

    track_peak_mem_compression_min.unit = "ratio"  # type: ignore[attr-defined]
