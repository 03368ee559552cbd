"""Change points over the nightly history: the series, the changes, tonight's alerts.

Why a module of its own: the nightly (``harness.nightly.job``), the ``changes`` subcommand and the
plots read the same thing: for every (cell, metric) of one machine's nights, the series of
figures, its change points (``harness.nightly.changepoints``) and the alert decisions of
``harness.nightly.alert_policy`` replayed night by night, so a decision made on a past night is the
one made again today (no hidden state besides the history file).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from harness import metric_registry
from harness.nightly.alert_policy import AlertPolicy, Tracker, same_change
from harness.nightly.changepoints import DETECTORS, Change, Detector, detect
from harness.spec import CellKey
from harness.store import history_store, results
from harness.store.history_store import Night


@dataclass(frozen=True)
class ChangeConfig:
    """The ``alert`` section of the nightly config."""

    detector: str = "otava"
    max_pvalue: float = 0.0005
    window: int = 50
    policy: AlertPolicy = field(default_factory=AlertPolicy)
    min_history: int = 6  # nights of this machine before change points gate (the pairwise gate alone before)
    max_nights: int = 120  # the newest nights analysed (bounds the nightly's cost)

    def make_detector(self) -> Detector:
        if self.detector == "otava":
            return DETECTORS["otava"](window=self.window, max_pvalue=self.max_pvalue)  # type: ignore[call-arg]
        return DETECTORS[self.detector](pvalue=self.max_pvalue)  # type: ignore[call-arg]


def config_from(section: dict[str, Any], where: str) -> ChangeConfig:
    """Validate the ``alert`` section; errors name ``where`` and the field."""
    policy_keys = ("persist_nights", "agree_nights", "min_change", "dedupe")
    allowed = ("detector", "max_pvalue", "window", "min_history", "max_nights", *policy_keys)
    bad = sorted(set(section) - set(allowed))
    if bad:
        raise ValueError(f"{where}: unknown field(s) {bad}; allowed: {', '.join(sorted(allowed))}")
    detector = section.get("detector", "otava")
    if detector not in DETECTORS:
        raise ValueError(f"{where}.detector: unknown {detector!r}; allowed values: {', '.join(DETECTORS)}")
    p = section.get("max_pvalue", ChangeConfig.max_pvalue)
    if isinstance(p, bool) or not isinstance(p, int | float) or not (math.isfinite(p) and 0 < p < 1):
        raise ValueError(f"{where}.max_pvalue: must be in (0, 1), got {p!r}")
    ints = {}
    for name, default, low in (("window", 50, 4), ("min_history", 6, 4), ("max_nights", 120, 10)):
        v = section.get(name, default)
        if isinstance(v, bool) or not isinstance(v, int) or v < low:
            raise ValueError(f"{where}.{name}: must be an integer >= {low}, got {v!r}")
        ints[name] = v
    try:
        policy = AlertPolicy(**{k: section[k] for k in policy_keys if k in section}).validate()
    except ValueError as e:
        raise ValueError(f"{where}: {e}") from None
    return ChangeConfig(detector, float(p), ints["window"], policy, ints["min_history"], ints["max_nights"])


@dataclass
class Series:
    cell: str
    metric: str
    shas: list[str]
    values: list[float]
    flagged: list[bool]  # the pairwise gate confirmed a regression of this (cell, metric) that night


@dataclass
class SeriesResult:
    series: Series
    changes: list[Change]  # of the whole series, tonight
    alerts: list[tuple[int, Change, str]]  # (night position, change, reason), every night replayed

    def alerted_tonight(self) -> list[tuple[Change, str]]:
        last = len(self.series.values) - 1
        return [(c, why) for t, c, why in self.alerts if t == last]


def build_series(nights: Sequence[Night]) -> list[Series]:
    """One series per (cell, metric) over ``nights`` (in order); a night whose cell is not ok,
    or whose figure is missing or not > 0, is left out of that series."""
    out: dict[tuple[str, str], Series] = {}
    for n in nights:
        flagged = {(c, m) for c, m in n.night.get("flagged", [])}
        sha = str(n.night.get("sha") or "unknown")
        for cell in n.results["cells"]:
            if cell["status"] != "ok":
                continue
            label = CellKey.of(cell).label()
            for metric in metric_registry.history_metrics():
                raw = metric_registry.get(metric).value(cell)
                if (
                    not isinstance(raw, int | float)
                    or isinstance(raw, bool)
                    or not (raw > 0 and math.isfinite(raw))
                ):
                    continue
                s = out.setdefault((label, metric), Series(label, metric, [], [], []))
                s.shas.append(sha)
                s.values.append(float(raw))
                s.flagged.append((label, metric) in flagged)
    return list(out.values())


def analyse(series: Series, cfg: ChangeConfig, detector: Detector | None = None) -> SeriesResult:
    """Change points of ``series`` tonight, and the alert decisions replayed night by night."""
    det = detector or cfg.make_detector()
    tracker = Tracker(cfg.policy)
    alerts: list[tuple[int, Change, str]] = []
    for t in range(cfg.min_history - 1, len(series.values)):
        for c, why in tracker.night(detect(series.values[: t + 1], det), series.flagged[: t + 1]):
            alerts.append((t, c, why))
    changes = detect(series.values, det) if len(series.values) >= 2 else []
    return SeriesResult(series, changes, alerts)


def commit_range(series: Series, index: int) -> str:
    """The commits between the last night at the old level and the first at the new one."""
    return f"{series.shas[index - 1][:10]}..{series.shas[index][:10]}"


def alerts_of(r: SeriesResult, c: Change, dedupe: int) -> list[tuple[int, str]]:
    """(night, reason) of the alerts raised for tonight's change ``c`` (``same_change``)."""
    return [(t, why) for t, a, why in r.alerts if same_change(c, a.index, r.changes, dedupe)]


def format_changes(found: Sequence[SeriesResult], dedupe: int = AlertPolicy.dedupe) -> str:
    """Markdown table of every change point, tonight's alerts first."""
    rows = []
    for r in found:
        last = len(r.series.values) - 1
        for c in r.changes:
            near = alerts_of(r, c, dedupe)
            if near and near[0][0] == last:
                alert = f"**ALERT tonight ({near[0][1]})**"
            elif near:
                alert = f"alerted on night {near[0][0] + 1} ({near[0][1]})"
            else:
                alert = "-"
            kind = "regression" if c.regression else "improvement"
            rows.append(
                (
                    0 if "tonight" in alert else 1,
                    f"| {r.series.cell} | {r.series.metric} | {commit_range(r.series, c.index)} | "
                    f"{c.change * 100:+.1f}% [{c.ci[0] * 100:+.1f}%, {c.ci[1] * 100:+.1f}%] | {c.direction} ({kind}) | "
                    f"{c.nights_after} | {alert} |",
                )
            )
    if not rows:
        return "No change points in the history of this machine.\n"
    head = [
        "| cell | metric | starts in commits | size [95% CI] | direction | nights at new level | alert |",
        "| --- | --- | --- | --- | --- | --- | --- |",
    ]
    return "\n".join(head + [r for _, r in sorted(rows, key=lambda x: x[0])]) + "\n"


def analyse_history(
    history: str, cfg: ChangeConfig, machine_of: str | None = None
) -> tuple[list[SeriesResult], list[history_store.Night], list[str], dict[str, Any]]:
    """The series of one machine's nights of ``history`` (the newest night's machine unless
    ``machine_of`` names a results file), analysed: (results, nights, nights left out, machine)."""
    if Path(history).suffix != ".jsonl":
        raise ValueError(f"{history}: expected a nightly history (.jsonl)")
    nights = history_store.read(history)
    if not nights:
        raise ValueError(f"{history}: no nights (missing or empty history)")
    env = results.load(machine_of)["env"] if machine_of else nights[-1].results["env"]
    machine = history_store.machine_key(env)
    same, left_out = history_store.select(nights, machine)
    same = same[-cfg.max_nights :]
    return [analyse(s, cfg) for s in build_series(same)], same, left_out, machine
