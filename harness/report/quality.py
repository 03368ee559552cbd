"""The report's training-quality part (``run --quality``): a table of every quality cell and the
plot of the loss curves.

Why a table of its own: a quality cell's figures are not one number per cell but a comparison
with eager over seeds (AUC and logloss, their worst difference from eager, eager's spread across
seeds, the parameter drift); the verdict reads only beside all of them. Why the curves are drawn
over eager's: a mode that trains like eager is a line on top of eager's, so the plot shows both
the learning (the loss falls) and any departure (a second panel: the mode's loss minus eager's).
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt

from harness.modes import mode_registry
from harness.spec import CellKey


def quality_cells(doc: dict[str, Any]) -> list[dict[str, Any]]:
    return [c for c in doc["cells"] if c.get("quality")]


def _f(v: Any, fmt: str) -> str:
    return "-" if v is None else format(v, fmt)


def section(doc: dict[str, Any]) -> str:
    """Markdown: one row per quality cell, family by family (empty string when the file has none)."""
    cells = quality_cells(doc)
    if not cells:
        return ""
    first = cells[0]["quality"]
    seeds = [s["seed"] for s in first["seeds"]]
    lines = [
        "## Training quality\n",
        f"Each mode and an eager copy trained {first['steps']} SGD steps (lr {first.get('lr')}) per seed "
        f"(seeds {', '.join(map(str, seeds))}) on the same batches, then scored on "
        f"{first.get('heldout_batches')} held-out batches. AUC: mean over tasks and seeds; "
        f"|dAUC| and rel. dlogloss: the worst seed against eager (tolerance {first['auc_tol']:g} and "
        f"{first['logloss_rtol']:g}); spread: eager's max - min over seeds; drift: the largest "
        "|parameter - eager's| after training (rel.: over the largest distance an eager parameter moved). "
        f"A cell off by more than the tolerance in any seed, whose mean leaves eager's spread, or whose "
        f"relative drift exceeds {first.get('drift_rtol')} in any seed is `quality_mismatch` (lost data to "
        "`compare`; harness/measure/quality.py says why each rule).\n",
        "| model | mode | AUC | eager AUC (untrained) | \\|dAUC\\| | logloss | rel. dlogloss | spread AUC | spread logloss "
        "| drift | drift rel. | verdict | wall s |",
        "| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |",
    ]
    order = {m: i for i, m in enumerate(mode_registry.names())}
    for c in sorted(cells, key=lambda c: (c["model"], c["scale"], order.get(c["mode"], 99))):
        q = c["quality"]
        verdict = q["verdict"] if c["status"] in ("ok", "quality_mismatch") else c["status"]
        loud = f"**{verdict}**" if verdict != "ok" else verdict
        lines.append(
            f"| {c['model']}/{c['scale']} | {c['mode']} | {_f(q['auc'], '.4f')} | {_f(q['eager_auc'], '.4f')} ({_f(q.get('eager_auc_start'), '.3f')}) "
            f"| {_f(q['auc_diff'], '.1e')} | {_f(q['logloss'], '.4f')} | {_f(q['logloss_rel_diff'], '.1e')} "
            f"| {_f(q['spread_auc'], '.3f')} | {_f(q['spread_logloss'], '.3f')} | {_f(q['drift'], '.1e')} "
            f"| {_f(q.get('drift_rel'), '.1e')} | {loud} | {_f(c.get('wall_s'), '.0f')} |"
        )
    reasons = [(CellKey.of(c).label(), r) for c in cells for r in c["quality"]["reasons"]]
    if reasons:
        lines += ["", "Why each mismatch:", ""]
        lines += [f"- {label}: {r}" for label, r in reasons]
    return "\n".join(lines) + "\n"


def _mean_curve(seeds: list[dict[str, Any]], key: str) -> tuple[list[float], list[float]]:
    """Steps and the mean over seeds of the loss at each curve point (a diverged seed's null
    losses read as NaN, which the plot leaves a gap for)."""
    curves = [s[key] for s in seeds if s.get(key)]
    n = min(len(c) for c in curves)
    steps = [curves[0][i][0] for i in range(n)]
    return steps, [
        sum(math.nan if c[i][1] is None else c[i][1] for c in curves) / len(curves) for i in range(n)
    ]


def plot(doc: dict[str, Any], path: Path) -> Path:
    """Per model: the training loss of every mode (mean over seeds, one point per window of
    ``every`` steps) drawn over eager's (wide and grey, underneath), and below it each mode's loss
    minus its eager copy's (a mode on eager's line reads 0; modes that train alike draw over each
    other, the last in registry order on top)."""
    cells = quality_cells(doc)
    models = list(dict.fromkeys((c["model"], c["scale"]) for c in cells))
    fig, axes = plt.subplots(2, max(1, len(models)), figsize=(4.4 * max(1, len(models)) + 0.6, 7.4),
                             squeeze=False, sharex="col", gridspec_kw={"height_ratios": [3, 2]})  # fmt: skip
    order = {m: i for i, m in enumerate(mode_registry.names())}
    for col, (model, scale) in enumerate(models):
        top, bottom = axes[0][col], axes[1][col]
        mine = sorted((c for c in cells if (c["model"], c["scale"]) == (model, scale)),
                      key=lambda c: order.get(c["mode"], 99))  # fmt: skip
        ref = next((c for c in mine if c["mode"] == mode_registry.REFERENCE), mine[0])
        steps, eager = _mean_curve(ref["quality"]["seeds"], "eager_curve")
        top.plot(steps, eager, color="#bbbbbb", linewidth=6, label="eager (underneath)", zorder=1)
        for c in mine:
            seeds = c["quality"]["seeds"]
            xs, ys = _mean_curve(seeds, "curve")
            _, own_eager = _mean_curve(seeds, "eager_curve")
            style = {"color": mode_registry.color(c["mode"]), "linewidth": 1.2, "zorder": 2}
            label = c["mode"] + ("" if c["status"] == "ok" else f" ({c['status']})")
            top.plot(xs, ys, label=label, **style)
            bottom.plot(xs, [y - e for y, e in zip(ys, own_eager, strict=False)], **style)
        top.set_title(f"{model}/{scale}", fontsize=10)
        top.set_ylabel("training loss (BCE), mean over seeds")
        top.grid(alpha=0.3)
        top.legend(fontsize=7)
        bottom.axhline(0.0, color="black", linewidth=0.8)
        bottom.ticklabel_format(axis="y", style="sci", scilimits=(0, 0))
        bottom.set_xlabel("step")
        bottom.set_ylabel("loss minus eager's")
        bottom.grid(alpha=0.3)
    fig.suptitle("Training quality: loss curves per mode over eager's", fontsize=11)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path
