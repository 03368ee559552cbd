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
