"""PNG plots of a results file (matplotlib, Agg backend: no display needed).

Why these three: latency (with its spread) says what runs faster, compile time and peak
memory are the other two figures the paper reports. Every plot has a title, axis labels
with units and a legend; failed cells are left out of the bars and named in the title note.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt
import numpy as np
from matplotlib.ticker import ScalarFormatter

from harness import metric_registry
from harness.modes import mode_registry
from harness.modes.mode_registry import BASELINES, TARGET
from harness.spec import PHASES
from harness.store.results import cell_map


def _layout(doc: dict[str, Any]) -> tuple[list[str], list[str], list[str], str]:
    keys = list(cell_map(doc))
    models = list(dict.fromkeys(k.model for k in keys))
    modes = [m for m in mode_registry.names() if any(k.mode == m for k in keys)]
    phases = [p for p in PHASES if any(k.phase == p for k in keys)]
    scales = sorted({k.scale for k in keys})
    return models, modes, phases, "/".join(scales)


def _grouped_bars(
    doc: dict[str, Any],
    value: Any,
    ylabel: str,
    title: str,
    path: Path,
    *,
    err: Any = None,
    log: bool = False,
    modes_filter: tuple[str, ...] | None = None,
) -> Path:
    cells = cell_map(doc)
    models, modes, phases, scale = _layout(doc)
    if modes_filter:
        modes = [m for m in modes if m in modes_filter]
    fig, axes = plt.subplots(
        1, max(1, len(phases)), figsize=(max(7.0, 1.6 * len(models) * len(phases) + 3), 5.2), squeeze=False
    )
    missing: list[str] = []
    width = 0.8 / max(1, len(modes))
    x = np.arange(len(models))
    for ax, phase in zip(axes[0], phases, strict=False):
        for i, mode in enumerate(modes):
            ys: list[float] = []
            lo: list[float] = []
            hi: list[float] = []
            for model in models:
                c = next(
                    (v for k, v in cells.items() if (k.model, k.mode, k.phase) == (model, mode, phase)), None
                )
                y = value(c) if c is not None and c["status"] == "ok" else None
                if c is not None and c["status"] != "ok":
                    missing.append(f"{model}/{mode}/{phase}: {c['status']}")
                    xpos = x[len(ys)] + (i - (len(modes) - 1) / 2) * width
                    ax.annotate(c["status"], (xpos, 0.02), xycoords=("data", "axes fraction"), rotation=90,
                                ha="center", va="bottom", fontsize=7, color="red")  # fmt: skip
                ys.append(np.nan if y is None else y)
                e = err(c) if (err is not None and y is not None) else None
                lo.append(0.0 if e is None else max(0.0, y - e[0]))
                hi.append(0.0 if e is None else max(0.0, e[1] - y))
            ax.bar(x + (i - (len(modes) - 1) / 2) * width, ys, width, label=mode, color=mode_registry.color(mode),
                   yerr=[lo, hi] if err is not None else None, capsize=2)  # fmt: skip
        ax.set_xticks(x, models)
        ax.set_xlabel("model")
        ax.set_ylabel(ylabel)
        ax.set_title(f"{phase}")
        if log:
            ax.set_yscale("log")
            ax.yaxis.set_major_formatter(ScalarFormatter())
            ax.yaxis.set_minor_formatter(ScalarFormatter())
            ax.tick_params(axis="y", which="minor", labelsize=7)
        ax.grid(axis="y", alpha=0.3)
    if not modes:
        for ax in axes[0]:
            ax.text(
                0.5,
                0.5,
                "no cells of the modes this plot shows",
                ha="center",
                va="center",
                transform=ax.transAxes,
            )
    handles, labels = axes[0][0].get_legend_handles_labels()
    if handles:
        fig.legend(
            handles, labels, title="mode", fontsize=8, loc="lower center", ncol=len(modes), frameon=False
        )
    note = f"\n(red labels: {len(missing)} failed/mismatched cells, not plotted)" if missing else ""
    fig.suptitle(f"{title}, scale {scale}{note}", fontsize=11)
    fig.tight_layout(rect=(0, 0.1, 1, 1))
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def plot_metric(doc: dict[str, Any], metric: metric_registry.Metric, path: Path) -> Path:
    """Grouped bars of one metric of ``harness.metric_registry`` per model, mode and phase."""
    unit, scale = metric.display_unit(doc["cells"])

    def value(c: dict[str, Any]) -> float | None:
        v = metric.value(c)
        return None if v is None else v * scale

    err = None
    if metric.judge == "samples":  # whiskers: the interquartile range of the samples

        def err(c: dict[str, Any]) -> tuple[float, float] | None:
            v = c[metric.name]
            return (v["q1"] * scale, v["q3"] * scale) if "q1" in v else None

    compile_modes = tuple(m.name for m in mode_registry.modes() if m.has_compile_time)
    return _grouped_bars(
        doc, value, metric.plot_ylabel.format(unit=unit), metric.plot_title or metric.name, path, err=err,
        modes_filter=compile_modes if metric.plot_compile_modes else None,
    )  # fmt: skip


def plot_speedups(rows: list[dict[str, Any]], path: Path) -> Path:
    """Speedup of compile+optimus over compile and over compile+peer, per model and phase."""
    labels = [f"{r['model']}\n{r['phase']}" for r in rows]
    fig, ax = plt.subplots(figsize=(max(6.0, 0.9 * len(rows) + 3), 4.6))
    x = np.arange(len(rows))
    for i, (key, color) in enumerate((f"vs {b}", mode_registry.color(b)) for b in BASELINES):
        ys, lo, hi = [], [], []
        for r in rows:
            v = r.get(key) or {}
            ok = "x" in v
            ys.append(v["x"] if ok else np.nan)
            lo.append(v["x"] - v["lo"] if ok else 0.0)
            hi.append(v["hi"] - v["x"] if ok else 0.0)
        for j, r in enumerate(rows):
            v = r.get(key) or {}
            if "status" in v:
                ax.annotate(str(v["status"]), (x[j] + (i - 0.5) * 0.38, 0.02), xycoords=("data", "axes fraction"),
                            rotation=90, ha="center", va="bottom", fontsize=7, color="red")  # fmt: skip
        ax.bar(x + (i - 0.5) * 0.38, ys, 0.38, yerr=[lo, hi], capsize=2, color=color,
               label=f"{TARGET} {key.replace('vs', 'over')}")  # fmt: skip
    tops = [(r.get(f"vs {b}") or {}).get("hi", 0.0) for r in rows for b in BASELINES]
    ax.set_ylim(0.0, max(1.8, *(t * 1.08 for t in tops if np.isfinite(t))))
    ax.set_xlim(-0.7, len(rows) - 0.3)
    ax.axhline(1.0, color="black", linewidth=0.8)
    ax.axhline(1.63, color="#2ca02c", linestyle="--", linewidth=0.8, label="paper: up to 1.63x")
    ax.set_xticks(x, labels)
    ax.set_xlabel("model / phase")
    ax.set_ylabel("speedup (x, >1 is faster; whiskers: 95% CI)")
    scales = "/".join(sorted({r["scale"] for r in rows}))
    ax.set_title(f"Speedup of {TARGET} - scale {scales}")
    ax.legend(fontsize=8)
    ax.grid(axis="y", alpha=0.3)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def plot_changes(rows: list[dict[str, Any]], path: Path) -> Path:
    """Compile-time change (s) and peak-memory change (%) of compile+optimus vs compile."""
    labels = [f"{r['model']}\n{r['phase']}" for r in rows]
    fig, (a1, a2) = plt.subplots(1, 2, figsize=(max(8.0, 1.4 * len(rows) + 4), 4.6))
    x = np.arange(len(rows))
    comp = [np.nan if r["compile_change_s"] is None else r["compile_change_s"] for r in rows]
    mem = [np.nan if r["mem_change_pct"] is None else r["mem_change_pct"] for r in rows]
    a1.bar(x, comp, color=mode_registry.color(TARGET), label=f"{TARGET} minus {BASELINES[0]}")
    a1.set_ylabel("compile time change (s, <0 is faster)")
    a1.set_title("Compile time change vs compile")
    a2.bar(x, mem, color=mode_registry.color(TARGET), label=f"{TARGET} vs {BASELINES[0]}")
    a2.axhline(-6.0, color="black", linestyle="--", linewidth=0.8, label="paper: ~-6%")
    a2.set_ylabel("peak memory change (%, <0 is less)")
    a2.set_title("Peak memory change vs compile")
    for j, r in enumerate(rows):
        if r["compile_change_s"] is None:
            status = (r.get("vs compile") or {}).get("status", "n/a")
            for ax in (a1, a2):
                ax.annotate(str(status), (x[j], 0.5), xycoords=("data", "axes fraction"), rotation=90,
                            ha="center", va="center", fontsize=7, color="red")  # fmt: skip
    for ax in (a1, a2):
        ax.axhline(0.0, color="black", linewidth=0.8)
        ax.set_xticks(x, labels)
        ax.set_xlabel("model / phase")
        ax.grid(axis="y", alpha=0.3)
        ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def plot_floor(doc: dict[str, Any], path: Path) -> Path:
    """Each family's modes against its roofline floor: per model (row) and phase (column), the
    median step latency of every mode as a bar and the floor as a line, on a log axis (the floor
    of a small model sits orders of magnitude below its step), each bar labelled with its % of
    floor. Why a plot of its own: the floor is one figure per family and phase, not per mode."""
    cells = cell_map(doc)
    models, modes, phases, scale = _layout(doc)
    fig, axes = plt.subplots(
        max(1, len(models)), max(1, len(phases)), figsize=(4.2 * max(1, len(phases)) + 1, 3.4 * max(1, len(models))),
        squeeze=False,
    )  # fmt: skip
    x = np.arange(len(modes))
    for r, model in enumerate(models):
        for col, phase in enumerate(phases):
            ax = axes[r][col]
            got = [next((v for k, v in cells.items() if (k.model, k.mode, k.phase) == (model, m, phase)), None)
                   for m in modes]  # fmt: skip
            ok = [c if c is not None and c["status"] == "ok" else None for c in got]
            ys = [c["latency_ms"]["median"] if c is not None else np.nan for c in ok]
            ax.bar(x, ys, 0.7, color=[mode_registry.color(m) for m in modes])
            floors = [c["floor_ms"] for c in ok if c is not None and c.get("floor_ms")]
            if floors:
                ax.axhline(
                    min(floors), color="black", linestyle="--", linewidth=1.0, label="floor (roofline)"
                )
            for i, (c, g) in enumerate(zip(ok, got, strict=True)):
                if c is not None and c.get("of_floor") is not None:
                    ax.annotate(
                        f"{100 * c['of_floor']:.3g}%", (x[i], ys[i]), ha="center", va="bottom", fontsize=7
                    )
                elif g is not None and c is None:
                    ax.annotate(g["status"], (x[i], 0.02), xycoords=("data", "axes fraction"), rotation=90,
                                ha="center", va="bottom", fontsize=7, color="red")  # fmt: skip
            ax.set_yscale("log")
            if floors:  # the floor line above the axis, not on it
                ax.set_ylim(bottom=min(floors) / 3)
            ax.set_xticks(x, modes, rotation=20, fontsize=7)
            ax.set_ylabel("median step latency (ms)")
            ax.set_title(f"{model} / {phase}", fontsize=9)
            ax.grid(axis="y", alpha=0.3)
            if floors:
                ax.legend(fontsize=7, loc="lower right")
    fig.suptitle(
        f"Modes against the roofline floor of the dense arch (label: % of floor), scale {scale}", fontsize=10
    )
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path
