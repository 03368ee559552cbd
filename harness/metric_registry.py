"""The metrics: the one place that says what a figure of a cell is and how it is judged.

Why a registry: ``peak_mem_bytes``, ``compile_s`` and ``latency_ms`` used to be read by string in
compare, report, plots, the history plots, the asv marks, the nightly change points and the
asv suite, each with its own unit, format and threshold. Each figure is now one ``Metric``
here: its unit, which direction is better, its formats, how the gate judges it and its default
thresholds (the nightly config's ``harness`` section overrides them by ``rel_key``/``abs_key``).
Adding a metric is one ``register(Metric(...))`` plus the code that measures it
(``harness/run/cell.py``), see docs/harness.md.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

JUDGES = ("samples", "scalar", "shown")


def _num(fmt: str) -> Callable[[Any, float], str]:
    return lambda v, scale: format(v * scale, fmt)


_TWO_DECIMALS = _num(".2f")


@dataclass(frozen=True)
class Metric:
    """One figure of a cell (the cell field ``name``)."""

    name: str
    unit: str  # of the stored value ('bytes' picks KiB/MiB/GiB per results file in reports and plots)
    lower_is_better: bool = True
    judge: str = (
        "scalar"  # samples: Mann-Whitney U on latency samples; scalar: thresholds; shown: never judged
    )
    rel: float = 0.0  # default relative threshold (judge samples/scalar)
    rel_key: str | None = None  # its key in the nightly config's harness section / compare.Thresholds
    abs_min: float = 0.0  # and the change must exceed this much (stored unit)
    abs_key: str | None = None
    comparable_by: str | None = None  # cell field that must match for the figure to be judged
    compare_unit: str = ""  # unit and scale of the compare table ("MiB", 1/2**20)
    compare_scale: float = 1.0
    compare_fmt: str = ".2f"
    report_title: str | None = None  # heading of its report grid ('{unit}' filled in); None: no grid
    report_text: Callable[[Any, float], str] = _TWO_DECIMALS  # (value, display scale) -> grid text
    report_if_present: bool = False  # grid only when some cell has the figure
    plot_stem: str | None = None  # '<stem>_<plot_stem>.png' in the report; None: no plot
    plot_title: str = ""
    plot_ylabel: str = ""  # '{unit}' filled in
    plot_rank: int = 100  # order of the plots in the report
    plot_compile_modes: bool = False  # only modes with a compile time (mode_registry.Mode.has_compile_time)
    asv_bench: str | None = None  # the asv benchmark that graphs it (harness.nightly.asv_marks)
    history: bool = False  # a series of the nightly's change-point detection (harness.nightly.changes)
    history_unit: str = ""  # unit and scale of the history plots
    history_scale: float = 1.0

    def value(self, cell: dict[str, Any]) -> Any:
        """The figure of ``cell`` (latency: its median), None when not recorded."""
        v = cell.get(self.name)
        return v["median"] if isinstance(v, dict) else v

    def figures(self, cell: dict[str, Any]) -> list[Any]:
        """Every number the gate reads for this metric (latency: median and samples)."""
        v = cell.get(self.name)
        return [v.get("median"), *v.get("samples", [])] if isinstance(v, dict) else [v]

    def display_unit(self, cells: list[dict[str, Any]]) -> tuple[str, float]:
        """(unit, scale) for reports and plots: bytes become KiB, MiB or GiB, whichever keeps the
        largest figure between 1 and 1024 (readable ticks); other units stay as stored."""
        if self.unit != "bytes":
            return self.unit, 1.0
        peak = max((self.value(c) or 0 for c in cells if c["status"] == "ok"), default=0)
        for unit, scale in (("GiB", 2**30), ("MiB", 2**20)):
            if peak >= scale:
                return unit, 1.0 / scale
        return "KiB", 1.0 / 2**10


_REGISTRY: dict[str, Metric] = {}


def register(metric: Metric, replace: bool = False) -> Metric:
    if metric.judge not in JUDGES:
        raise ValueError(f"metric {metric.name}: judge {metric.judge!r}; allowed values: {', '.join(JUDGES)}")
    if metric.name in _REGISTRY and not replace:
        raise ValueError(f"metric: {metric.name!r} is already registered")
    taken = {k for m in _REGISTRY.values() if m.name != metric.name for k in (m.rel_key, m.abs_key) if k}
    clash = {k for k in (metric.rel_key, metric.abs_key) if k} & (taken | {"alpha"})
    if clash:
        raise ValueError(f"metric {metric.name}: threshold key(s) {sorted(clash)} already used")
    _REGISTRY[metric.name] = metric
    return metric


def unregister(name: str) -> None:
    get(name)
    del _REGISTRY[name]


def get(name: str) -> Metric:
    try:
        return _REGISTRY[name]
    except KeyError:
        raise ValueError(f"metric: unknown {name!r}; allowed values: {', '.join(_REGISTRY)}") from None


def metrics() -> tuple[Metric, ...]:
    return tuple(_REGISTRY.values())


def judged() -> tuple[Metric, ...]:
    """Metrics the gate judges, latency (samples) first."""
    ms = [m for m in _REGISTRY.values() if m.judge != "shown"]
    return tuple(sorted(ms, key=lambda m: m.judge != "samples"))


def threshold_defaults() -> dict[str, float]:
    """Threshold key -> default, for ``compare.Thresholds`` and the nightly config."""
    out: dict[str, float] = {}
    for m in judged():
        if m.rel_key:
            out[m.rel_key] = m.rel
        if m.abs_key:
            out[m.abs_key] = m.abs_min
    return out


def history_metrics() -> tuple[str, ...]:
    return tuple(m.name for m in _REGISTRY.values() if m.history)


def _latency_text(v: Any, scale: float) -> str:
    return f"{v['median']:.3f} ({v['iqr']:.3f})"


def _str_text(v: Any, scale: float) -> str:
    return str(v)


def _pct_text(v: Any, scale: float) -> str:
    return f"{100 * v:.3g}%"  # three figures: a tiny model's step sits at a fraction of a percent


for _m in (
    Metric("latency_ms", "ms", judge="samples", rel=0.05, rel_key="latency", compare_unit="ms",
           compare_fmt=".3f", report_title="Median step latency, ms (IQR)", report_text=_latency_text,
           plot_stem="latency", plot_title="Step latency per mode (bar: median, whiskers: IQR)",
           plot_ylabel="median step latency (ms)", plot_rank=0,
           asv_bench="bench_compiled.CompiledCells.track_latency_ms", history=True, history_unit="ms"),
    Metric("peak_mem_bytes", "bytes", rel=0.03, rel_key="memory", abs_min=64 * 1024, abs_key="memory_abs",
           comparable_by="peak_mem_method", compare_unit="MiB", compare_scale=1 / 2**20,
           report_title="Peak memory of one step, {unit}", report_text=_num(".4g"),
           plot_stem="peak_memory", plot_title="Peak memory per mode (CPU: tensors + the step's allocator peak)",
           plot_ylabel="peak memory of one step ({unit})", plot_rank=2,
           asv_bench="bench_compiled.CompiledCells.track_peak_mem_mb", history=True, history_unit="MiB",
           history_scale=1 / 2**20),
    Metric("peak_mem_at", "op", judge="shown", report_if_present=True, report_text=_str_text,
           report_title="Where the step's memory peak falls (CPU; profiler op around it)"),
    Metric("compile_s", "s", rel=0.20, rel_key="compile", abs_min=1.0, abs_key="compile_abs", compare_unit="s",
           report_title="Compile time, s (caches off)", plot_stem="compile_time",
           plot_title="Compile time, caches off (eager+optimus: the optimize call)",
           plot_ylabel="compile time (s), caches off", plot_rank=1, plot_compile_modes=True,
           asv_bench="bench_compiled.CompiledCells.track_compile_s", history=True, history_unit="s"),
    # The roofline floor (harness/measure/roofline.py): shown, not judged; a change of the floor is
    # a change of the counting or of the machine's peaks, not of the code under test.
    Metric("floor_ms", "ms", judge="shown", report_if_present=True, report_text=_num(".4f"),
           report_title="Roofline floor of the dense arch, ms (max of FLOPs / GEMM rate, bytes / bandwidth)"),
    Metric("of_floor", "fraction", lower_is_better=False, judge="shown", report_if_present=True,
           report_text=_pct_text, report_title="% of floor (floor_ms / median step latency; 100% = at the roofline)"),
):  # fmt: skip
    register(_m)
