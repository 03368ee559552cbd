"""Compare two results files cell by cell: latency, peak memory, compile time, status.

Why both a test and a threshold: with hundreds of samples a 1% change is "significant"
but irrelevant, and with few noisy samples a 15% jump can be chance. A latency change is
a regression only if Mann-Whitney U rejects "same distribution" (p < alpha) AND the median
moved by more than the minimum effect. Peak memory and compile time are single numbers
per cell, so they are judged by thresholds (relative and absolute) alone.

Why lost data is its own verdict: a gate that only looks for regressions goes green when the
new run simply lacks the slow cell. A base cell missing from the new run (``missing``), a new
cell that is not ``ok`` (``failed``: failed, timeout or mismatch) and a figure that is not a
finite number (``non-finite``) make the comparison ``incomplete``: exit code INCOMPLETE
(``harness.exit_codes``), which wins over REGRESSION.

Why a pass-rate row: the verdicts above read the cells of BASE only, so a new run that adds a row
which fails passes them. The pass rate (``harness.report.summaries``: the share of rows where a
mode ran, matched eager and has a speedup) sees every row of both files; a fall in it is a
regression naming the cells that stopped passing (``pass_rate_rows``).

Why a paired cell is judged by its pair: a cell that ``pair`` (or the paired nightly) measured
carries ``paired_ratio`` and its 95% interval, from rounds timed side by side against
``base_sha``. Its latency verdict is that interval against the pair's threshold (a regression
when the whole interval lies above it; ``unstable`` when a side's processes disagreed, which is
shown and never judged), not a test between two files measured at other times. Its compile time
is judged on the pair's alternated cold compiles.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass
from typing import Any

from harness import exit_codes, metric_registry
from harness.report import summaries
from harness.spec import CellKey
from harness.stats import bootstrap_median_ratio, mann_whitney_u
from harness.store.results import cell_map

INCOMPLETE_VERDICTS = ("missing", "failed", "non-finite")
DEFAULT_ALPHA = 0.01  # significance level of the latency test (Mann-Whitney U)


class Thresholds:
    """The gate's limits: ``alpha`` (significance level of the latency test) and, per judged
    metric of ``harness.metric_registry``, its relative limit (``rel_key``, e.g. ``latency``,
    ``memory``, ``compile``) and absolute minimum (``abs_key``, e.g. ``memory_abs`` bytes,
    ``compile_abs`` seconds). Defaults come from the registry; the nightly config overrides them."""

    def __init__(self, alpha: float = DEFAULT_ALPHA, **limits: float) -> None:
        defaults = metric_registry.threshold_defaults()
        bad = [k for k in limits if k not in defaults]
        if bad:
            raise ValueError(f"{bad[0]}: unknown threshold; allowed values: {', '.join(self.keys())}")
        self.alpha = alpha
        self.limits: dict[str, float] = {**defaults, **limits}

    @staticmethod
    def keys() -> tuple[str, ...]:
        return ("alpha", *metric_registry.threshold_defaults())

    def __getattr__(self, name: str) -> float:
        limits = self.__dict__.get("limits", {})
        if name in limits:
            return limits[name]
        raise AttributeError(f"Thresholds has no {name!r}")

    def as_dict(self) -> dict[str, float]:
        return {"alpha": self.alpha, **self.limits}

    def of(self, metric: metric_registry.Metric) -> tuple[float, float]:
        """(relative, absolute) limit of ``metric``."""
        rel = self.limits[metric.rel_key] if metric.rel_key else metric.rel
        return rel, self.limits[metric.abs_key] if metric.abs_key else metric.abs_min

    def validate(self) -> Thresholds:
        for name, v in self.as_dict().items():
            if isinstance(v, bool) or not isinstance(v, int | float) or not math.isfinite(v) or v < 0:
                raise ValueError(f"{name}: threshold must be a finite number >= 0, got {v!r}")
        if not 0 < self.alpha < 1:
            raise ValueError(f"alpha: must be in (0, 1), got {self.alpha}")
        return self


@dataclass
class Row:
    cell: str
    metric: str  # a judged metric of harness.metric_registry, or status
    base: Any
    new: Any
    change: float | None  # relative change new/base - 1
    verdict: str  # regression | improvement | no change | not comparable | missing | failed | non-finite
    p_value: float | None = None
    ci: tuple[float, float] | None = None  # bootstrap CI of the median ratio

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


def _rel(base: float, new: float) -> float | None:
    return None if base == 0 else new / base - 1.0


def compare_latency(
    base: list[float], new: list[float], th: Thresholds
) -> tuple[str, float, float, tuple[float, float]]:
    """Verdict, relative median change, p-value and CI for two latency sample sets."""
    verdict, change, p = latency_verdict(base, new, th)
    return verdict, change, p, bootstrap_median_ratio(base, new)


def latency_verdict(base: list[float], new: list[float], th: Thresholds) -> tuple[str, float, float]:
    """The latency rule alone (no interval): verdict, relative median change, p-value. The
    replay benchmark (``harness.nightly.replay``) judges thousands of nights with it."""
    import numpy as np

    mb, mn = float(np.median(base)), float(np.median(new))
    change = mn / mb - 1.0 if mb > 0 else 0.0
    _, p = mann_whitney_u(base, new)
    verdict = "no change"
    if p < th.alpha and abs(change) > th.of(metric_registry.get("latency_ms"))[0]:
        verdict = "regression" if change > 0 else "improvement"
    return verdict, change, p


def _scalar(
    base: float, new: float, rel: float, abs_min: float, lower_is_better: bool = True
) -> tuple[str, float | None]:
    change = _rel(base, new)
    diff = new - base
    if abs(diff) <= abs_min or change is None or abs(change) <= rel:
        return "no change", change
    return ("regression" if (diff > 0) == lower_is_better else "improvement"), change


def cell_label(cell: dict[str, Any]) -> str:
    """The row label of a cell: its key, plus ``[N ranks, sharding]`` for a sharded cell (so a
    sharded cell and a single-process cell of the same key never read as one)."""
    label = CellKey.of(cell).label()
    n = int(cell.get("nproc") or 1)
    return f"{label} [{n} ranks, {cell.get('sharding')}]" if n > 1 else label


def compare_docs(base: dict[str, Any], new: dict[str, Any], th: Thresholds | None = None) -> list[Row]:
    """All comparison rows for cells of ``base`` (missing in ``new`` -> a 'missing' row)."""
    th = (th or Thresholds()).validate()
    rows: list[Row] = []
    new_cells = cell_map(new)
    for key, b in cell_map(base).items():
        label = cell_label(b)
        n = new_cells.get(key)
        if n is None:
            rows.append(Row(label, "status", b["status"], None, None, "missing"))
            continue
        if n["status"] != "ok":  # lost data, whatever the base was: the gate cannot pass on it
            rows.append(Row(label, "status", b["status"], n["status"], None, "failed"))
            continue
        if b["status"] != "ok":
            rows.append(Row(label, "status", b["status"], n["status"], None, "improvement"))
            continue
        nb, nn = int(b.get("nproc") or 1), int(n.get("nproc") or 1)
        if nb != nn:  # a sharded job against a single process (or other rank counts): another measurement
            rows.append(Row(label, "nproc", nb, nn, None, "not comparable"))
            continue
        garbled = _non_finite_figure(b, n)
        if garbled:
            rows.append(Row(label, garbled, None, None, None, "non-finite"))
            continue
        for metric in metric_registry.judged():
            row = _judge(metric, label, b, n, th)
            if row is not None:
                rows.append(row)
    return rows


def _judge(metric: metric_registry.Metric, label: str, b: dict[str, Any], n: dict[str, Any],
           th: Thresholds) -> Row | None:  # fmt: skip
    """The row of one metric of one cell pair; None when either cell lacks the figure."""
    bv, nv = metric.value(b), metric.value(n)
    if bv is None or nv is None:
        return None
    paired = n.get("paired")
    if paired and n.get("paired_ci95") and metric.name == "latency_ms":
        return _judge_pair(label, n, paired)
    if paired and metric.name == "compile_s":
        bv, nv = _median(paired["base"]["compile_s"]), _median(paired["new"]["compile_s"])
    if metric.judge == "samples":
        verdict, change, p, ci = compare_latency(b[metric.name]["samples"], n[metric.name]["samples"], th)
        return Row(label, metric.name, bv, nv, change, verdict, p, ci)
    if metric.comparable_by and b.get(metric.comparable_by) != n.get(metric.comparable_by):
        # Measured another way (e.g. peak memory before the CPU gradient fix): a change here says
        # nothing about the code, so it is shown but never judged.
        return Row(label, metric.name, bv, nv, None, "not comparable")
    rel, abs_min = th.of(metric)
    v, c = _scalar(bv, nv, rel, abs_min, metric.lower_is_better)
    return Row(label, metric.name, bv, nv, c, v)


def _median(xs: list[float]) -> float:
    import numpy as np

    return float(np.median(xs))


def _judge_pair(label: str, n: dict[str, Any], paired: dict[str, Any]) -> Row:
    """The latency row of a paired cell: its interval against the pair's threshold."""
    lo, hi = n["paired_ci95"]
    t = float(paired.get("threshold", 0.02))
    if not paired.get("stable", True):
        verdict = "unstable"
    elif lo > 1 + t:
        verdict = "regression"
    elif hi < 1 - t:
        verdict = "improvement"
    else:
        verdict = "no change"
    base_ms, new_ms = _median(paired["base"]["ms"]), _median(paired["new"]["ms"])
    return Row(label, "latency_ms", base_ms, new_ms, float(n["paired_ratio"]) - 1.0, verdict, None, (lo, hi))


def _non_finite_figure(*cells: dict[str, Any]) -> str | None:
    """The first judged figure that is NaN/inf in any of ``cells`` (documents built in memory
    skip ``cell_record.validate``, so the gate checks again what it is about to judge)."""
    for c in cells:
        for metric in metric_registry.judged():
            if any(isinstance(v, float) and not math.isfinite(v) for v in metric.figures(c)):
                return metric.name
    return None


def pass_rate_rows(base: dict[str, Any], new: dict[str, Any]) -> list[Row]:
    """One row per (phase, mode, baseline) summarized in both files: a regression when the pass
    rate fell (compared exactly, as fractions), naming in ``new`` the cells of NEW that do not
    pass and did in BASE or are new rows; the same rate, or a higher one, is not a regression."""
    old_found = summaries.summaries(base)
    rows = []
    for s in summaries.summaries(new):
        b = summaries.find(old_found, *s.key)
        if b is None:
            continue
        was = {name for name, _ in b.left_out}
        stopped = [
            f"{name}/{s.mode}/{s.phase} ({why})"
            for name, why in s.left_out
            if name in b.passing or name not in was
        ]
        now = {*s.passing, *(name for name, _ in s.left_out)}
        stopped += [f"{name}/{s.mode}/{s.phase} (row gone)" for name in b.passing if name not in now]
        if s.rate < b.rate:
            verdict, text = "regression", f"{s.pass_text()}; stopped passing: {', '.join(stopped)}"
        else:
            verdict, text = ("improvement" if s.rate > b.rate else "no change"), s.pass_text()
        change = float(s.rate / b.rate) - 1.0 if b.rate else None
        rows.append(Row(f"pass rate {s.mode} vs {s.against}, {s.phase}", "pass_rate", b.pass_text(), text,
                        change, verdict))  # fmt: skip
    return rows


def has_regression(rows: list[Row]) -> bool:
    return any(r.verdict == "regression" for r in rows)


def incomplete(rows: list[Row]) -> list[Row]:
    """Rows that say the new run lost or garbled data (see the module docstring)."""
    return [r for r in rows if r.verdict in INCOMPLETE_VERDICTS]


def exit_code(rows: list[Row]) -> int:
    """The gate: INCOMPLETE over REGRESSION over OK (``harness.exit_codes``)."""
    if incomplete(rows):
        return exit_codes.INCOMPLETE
    return exit_codes.REGRESSION if has_regression(rows) else exit_codes.OK


def _fmt(metric: str, v: Any) -> str:
    if v is None:
        return "-"
    try:
        m = metric_registry.get(metric)
    except ValueError:  # "status" rows
        return str(v)
    return f"{format(v * m.compare_scale, m.compare_fmt)} {m.compare_unit}".rstrip()


def format_rows(rows: list[Row]) -> str:
    """Markdown table of the comparison, regressions first."""
    order = {"missing": 0, "failed": 0, "non-finite": 0, "regression": 1, "not comparable": 2,
             "improvement": 3, "no change": 4}  # fmt: skip
    lines = [
        "| cell | metric | base | new | change | p (MWU) | 95% CI new/base | verdict |",
        "| --- | --- | --- | --- | --- | --- | --- | --- |",
    ]
    for r in sorted(rows, key=lambda r: (order.get(r.verdict, 9), r.cell, r.metric)):
        change = f"{r.change * 100:+.1f}%" if r.change is not None else "-"
        p = f"{r.p_value:.2g}" if r.p_value is not None else "-"
        if r.metric == "latency_ms" and r.p_value is None and r.ci is not None:
            p = "paired"  # the interval is of per-round ratios timed side by side (_judge_pair)
        ci = f"{r.ci[0]:.3f}-{r.ci[1]:.3f}" if r.ci is not None else "-"
        loud = r.verdict == "regression" or r.verdict in INCOMPLETE_VERDICTS
        verdict = f"**{r.verdict}**" if loud else r.verdict
        lines.append(
            f"| {r.cell} | {r.metric} | {_fmt(r.metric, r.base)} | {_fmt(r.metric, r.new)} | {change} | {p} | {ci} | {verdict} |"
        )
    n_reg = sum(r.verdict == "regression" for r in rows)
    n_imp = sum(r.verdict == "improvement" for r in rows)
    lines.append("")
    n_lost = len(incomplete(rows))
    lost = f"{n_lost} cell(s) missing, failed or non-finite (incomplete), " if n_lost else ""
    lines.append(f"{lost}{n_reg} regression(s), {n_imp} improvement(s), {len(rows)} comparison(s).")
    return "\n".join(lines)
