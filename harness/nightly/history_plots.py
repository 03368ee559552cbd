"""PNG of the nightly series with their change points marked (matplotlib, Agg backend).

Why a picture: a table says "+8% from abc123..def456"; the plot shows whether the level
really moved there or the detector split noise, which is what a person checks before
bisecting. One panel per (cell, metric) series: the nightly figures, the mean of each
segment between change points, a vertical line at each change labelled with the commit it
starts at and its size, and a triangle on the night an alert was raised.
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Sequence
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt

from harness import metric_registry
from harness.nightly.changes import SeriesResult


def plot_changes(
    found: Sequence[SeriesResult], path: str | Path, title: str = "", max_panels: int = 12
) -> Path:
    """Write the plot of the series that have change points first (at most ``max_panels``)."""
    chosen = sorted(found, key=lambda r: (not r.changes, r.series.cell, r.series.metric))[:max_panels]
    if not chosen:
        raise ValueError("series: nothing to plot (the history holds no ok cells)")
    cols = 1 if len(chosen) == 1 else 2
    rows = math.ceil(len(chosen) / cols)
    fig, axes = plt.subplots(rows, cols, figsize=(7.5 * cols, 3.2 * rows), squeeze=False)
    for ax, r in zip(axes.flat, chosen, strict=False):
        s = r.series
        metric = metric_registry.get(s.metric)
        k = metric.history_scale
        xs = list(range(1, len(s.values) + 1))
        ax.plot(xs, [v * k for v in s.values], "o-", ms=3, lw=0.8, color="#1f77b4", label="nightly figure")
        bounds = [0, *[c.index for c in r.changes], len(s.values)]
        for lo, hi in itertools.pairwise(bounds):
            seg = s.values[lo:hi]
            ax.hlines(sum(seg) / len(seg) * k, lo + 0.5, hi + 0.5, colors="#555555", lw=1.5)
        for c in r.changes:
            color = "#d62728" if c.regression else "#2ca02c"
            ax.axvline(c.index + 0.5, color=color, ls="--", lw=1.2)
            ax.annotate(
                f"{s.shas[c.index][:7]} {c.change * 100:+.1f}%\n[{c.ci[0] * 100:+.1f}, {c.ci[1] * 100:+.1f}]",
                xy=(c.index + 0.5, 1.0),
                xycoords=("data", "axes fraction"),
                xytext=(3, -3),
                textcoords="offset points",
                va="top",
                fontsize=8,
                color=color,
            )
        for t, c, why in r.alerts:
            ax.plot([t + 1], [s.values[t] * k], marker="v", ms=10, color="#d62728", ls="none",
                    label=f"alert ({why}) on night {t + 1}: change from night {c.index + 1}")  # fmt: skip
        ax.set_title(f"{s.cell}  {s.metric}", fontsize=9)
        ax.set_xlabel("night")
        ax.set_ylabel(metric.history_unit or metric.unit)
        ax.legend(fontsize=7, loc="lower right")
        ax.grid(alpha=0.3)
    for ax in list(axes.flat)[len(chosen) :]:
        ax.axis("off")
    if title:
        fig.suptitle(title, fontsize=10)
    fig.tight_layout()
    out = Path(path)
    fig.savefig(out, dpi=110)
    plt.close(fig)
    return out
