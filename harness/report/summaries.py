"""The torch.compile dashboard's summary figures of one results file, per phase, mode and baseline.

Why: the people who read this harness's reports also read PyTorch's torch.compile dashboard
(``benchmarks/dynamo/runner.py`` and ``common.py`` in PyTorch), and compare every benchmark with
it. Its executive summary has four figures per compiler: pass rate, geometric-mean speedup, compile
latency and peak-memory compression ratio. They are computed here the way the dashboard defines
them, so a figure of ours can be put beside the dashboard's:

- **pass rate**: a row (model, scale) passes a mode when the mode's cell is ``ok`` (it ran and
  matched eager), the baseline's cell is ``ok`` and the speedup is above 0. A missing cell does not
  pass. Printed as the dashboard prints it, ``"perc%, passing/total"`` with the percentage rounded
  as Python's ``round`` does (the dashboard's ``percentage(..., decimals=0)``).
- rows that do not pass are left out of every other figure, as the dashboard removes the models
  that fail their accuracy check;
- **geomean speedup**: baseline median latency over the mode's, geometric mean over the passing
  rows; the dashboard clips each speedup to at least 1.0x first (a slowdown counts as 1.0x). Both
  are given: the clipped one to read beside the dashboard, the unclipped one because it is the
  honest figure (clipping hides every slowdown);
- **compile latency**: the mode's ``compile_s`` (first call, caches off, minus one step; the
  dashboard's first compiled iteration minus an eager one), geometric mean and maximum over the
  passing rows that have one (the dashboard prints the mean);
- **peak-memory compression ratio**: the baseline's peak memory over the mode's (above 1: the mode
  uses less), arithmetic mean (as the dashboard) and minimum (the worst row) over passing rows.

The dashboard compares every compiler with eager. Here each mode is also compared with
``compile``, since what Optimus adds is read against Inductor alone.
"""

from __future__ import annotations

import math
import statistics
from dataclasses import dataclass
from fractions import Fraction
from typing import Any

from harness.modes import mode_registry
from harness.spec import PHASES, CellKey
from harness.store.results import cell_map

AGAINST = (mode_registry.REFERENCE, mode_registry.BASELINES[0])
"""The baselines of the summaries: eager (the dashboard's) and compile (Inductor alone)."""


@dataclass(frozen=True)
class Summary:
    """The dashboard's four figures for one mode against one baseline in one phase."""

    phase: str
    mode: str
    against: str
    total: int  # rows (model, scale) of the phase
    passing: tuple[str, ...]  # "model/scale" of the rows that pass
    left_out: tuple[tuple[str, str], ...]  # ("model/scale", why) of the rows that do not
    geomean_clipped: float | None
    geomean: float | None
    compile_geomean_s: float | None
    compile_max_s: float | None
    mem_ratio_mean: float | None
    mem_ratio_min: float | None

    @property
    def key(self) -> tuple[str, str, str]:
        return self.phase, self.mode, self.against

    @property
    def rate(self) -> Fraction:
        """Passing over total, exact (the gate compares these; 0 when there are no rows)."""
        return Fraction(len(self.passing), self.total) if self.total else Fraction(0)

    @property
    def percent(self) -> int:
        """The dashboard's rounding: Python's ``round`` of ``100 * passing / total`` (half to even)."""
        return round(100 * len(self.passing) / self.total) if self.total else 0

    def pass_text(self) -> str:
        return f"{self.percent}%, {len(self.passing)}/{self.total}"


def _median(cell: dict[str, Any]) -> float | None:
    lat = cell.get("latency_ms")
    v = lat.get("median") if isinstance(lat, dict) else None
    return float(v) if isinstance(v, int | float) and math.isfinite(v) and v > 0 else None


def _why_not(cell: dict[str, Any] | None, base: dict[str, Any] | None, against: str) -> str | None:
    """None when the row passes, else why it does not (the text the report shows)."""
    if cell is None:
        return "missing"
    if cell["status"] != "ok":
        return str(cell["status"])
    if base is None:
        return f"{against} missing"
    if base["status"] != "ok":
        return f"{against} {base['status']}"
    b, m = _median(base), _median(cell)
    if b is None or m is None or not b / m > 0:
        return "no speedup"
    return None


def _positive(values: list[Any]) -> list[float]:
    return [float(v) for v in values if isinstance(v, int | float) and math.isfinite(v) and v > 0]


def summarize(doc: dict[str, Any], phase: str, mode: str, against: str) -> Summary:
    """The four figures of ``mode`` against ``against`` over every row of ``phase`` in ``doc``."""
    cells = cell_map(doc)
    rows = list(dict.fromkeys((k.model, k.scale) for k in cells if k.phase == phase))
    passing, left_out, speedups, compiles, ratios = [], [], [], [], []
    for model, scale in rows:
        cell = cells.get(CellKey(model, scale, mode, phase))
        base = cells.get(CellKey(model, scale, against, phase))
        name = f"{model}/{scale}"
        why = _why_not(cell, base, against)
        if why is not None:
            left_out.append((name, why))
            continue
        assert cell is not None and base is not None
        passing.append(name)
        speedups.append(_median(base) / _median(cell))  # type: ignore[operator]
        compiles.append(cell.get("compile_s"))
        bm, mm = _positive([base.get("peak_mem_bytes")]), _positive([cell.get("peak_mem_bytes")])
        if bm and mm:
            ratios.append(bm[0] / mm[0])
    comp = _positive(compiles)
    return Summary(
        phase,
        mode,
        against,
        len(rows),
        tuple(passing),
        tuple(left_out),
        statistics.geometric_mean([max(s, 1.0) for s in speedups]) if speedups else None,
        statistics.geometric_mean(speedups) if speedups else None,
        statistics.geometric_mean(comp) if comp else None,
        max(comp) if comp else None,
        statistics.fmean(ratios) if ratios else None,
        min(ratios) if ratios else None,
    )


def summaries(doc: dict[str, Any]) -> list[Summary]:
    """Every (phase, mode, baseline) of ``doc``: for each phase and each baseline the file ran,
    every other mode of the file, in registry order."""
    keys = list(cell_map(doc))
    modes = [m for m in mode_registry.names() if any(k.mode == m for k in keys)]
    out = []
    for phase in [p for p in PHASES if any(k.phase == p for k in keys)]:
        for against in [a for a in AGAINST if a in modes]:
            out += [summarize(doc, phase, m, against) for m in modes if m != against]
    return out


def find(found: list[Summary], phase: str, mode: str, against: str) -> Summary | None:
    return next((s for s in found if s.key == (phase, mode, against)), None)


def _x(v: float | None) -> str:
    return "-" if v is None else f"{v:.2f}x"


def _s(v: float | None) -> str:
    return "-" if v is None else f"{v:.1f} s"


EXPLAINED = (
    "As PyTorch's torch.compile dashboard defines them (`benchmarks/dynamo/runner.py`, `common.py`): "
    "a row passes when the mode's cell is ok (it matched eager), the baseline's cell is ok and the "
    "speedup is above 0; a missing cell does not pass, and the rows that do not pass are left out of "
    "every other figure. Speedup: baseline median step latency / the mode's; the dashboard's geomean "
    "clips each speedup to at least 1.0x, which hides every slowdown, so **the unclipped geomean is the "
    "honest one**. Compile latency: the mode's compile time (first call, caches off, minus one step), "
    "geometric mean and maximum. Peak-memory compression: baseline peak / the mode's peak (above 1 the "
    "mode uses less), mean and minimum. docs/harness.md, 'Dashboard summaries'."
)


def format_table(found: list[Summary]) -> str:
    """Markdown: one table per phase, a row per (mode, baseline); empty when there is nothing."""
    if not found:
        return ""
    lines: list[str] = []
    for phase in dict.fromkeys(s.phase for s in found):
        lines += [
            f"### {phase}",
            "",
            "| mode | against | pass rate | geomean speedup, clipped (dashboard) | geomean speedup, unclipped "
            "| compile latency geomean | compile latency max | peak-mem compression mean | min | left out |",
            "| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |",
        ]
        for s in (s for s in found if s.phase == phase):
            out = ", ".join(f"{name} ({why})" for name, why in s.left_out) or "-"
            lines.append(
                f"| {s.mode} | {s.against} | {s.pass_text()} | {_x(s.geomean_clipped)} | {_x(s.geomean)} "
                f"| {_s(s.compile_geomean_s)} | {_s(s.compile_max_s)} | {_x(s.mem_ratio_mean)} "
                f"| {_x(s.mem_ratio_min)} | {out} |"
            )
        lines.append("")
    lines.append(EXPLAINED)
    return "\n".join(lines)


def section(doc: dict[str, Any]) -> str:
    """The report's section, or '' when the file has no baseline to summarize against."""
    table = format_table(summaries(doc))
    return f"## Dashboard summaries\n\n{table}\n" if table else ""


def line(s: Summary) -> str:
    """One summary as one line of text (``compare``, ``reproduce``)."""
    return (
        f"{s.phase}, {s.mode} vs {s.against}: pass rate {s.pass_text()}; geomean speedup "
        f"{_x(s.geomean_clipped)} clipped, {_x(s.geomean)} unclipped; compile latency geomean "
        f"{_s(s.compile_geomean_s)}, max {_s(s.compile_max_s)}; peak-mem compression mean "
        f"{_x(s.mem_ratio_mean)}, min {_x(s.mem_ratio_min)}"
    )


def target_lines(doc: dict[str, Any]) -> list[str]:
    """compile+optimus against compile, one line per phase: the headline of the summaries."""
    found = summaries(doc)
    picked = [find(found, p, mode_registry.TARGET, mode_registry.BASELINES[0]) for p in PHASES]
    return [line(s) for s in picked if s is not None]


def change_lines(base: dict[str, Any], new: dict[str, Any]) -> list[str]:
    """compile+optimus against compile, base -> new, one line per phase in both files (``compare``)."""
    old_found, new_found = summaries(base), summaries(new)
    out = []
    for phase in PHASES:
        key = (phase, mode_registry.TARGET, mode_registry.BASELINES[0])
        b, n = find(old_found, *key), find(new_found, *key)
        if b is None or n is None:
            continue
        out.append(
            f"dashboard summary, {phase}, {n.mode} vs {n.against} (base -> new): pass rate {b.pass_text()} -> "
            f"{n.pass_text()}; geomean speedup {_x(b.geomean_clipped)} -> {_x(n.geomean_clipped)} clipped, "
            f"{_x(b.geomean)} -> {_x(n.geomean)} unclipped; compile latency geomean {_s(b.compile_geomean_s)} -> "
            f"{_s(n.compile_geomean_s)}, max {_s(b.compile_max_s)} -> {_s(n.compile_max_s)}; peak-mem "
            f"compression mean {_x(b.mem_ratio_mean)} -> {_x(n.mem_ratio_mean)}, min {_x(b.mem_ratio_min)} -> "
            f"{_x(n.mem_ratio_min)}"
        )
    return out
