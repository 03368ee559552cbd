"""Markdown tables and PNG plots of one results file, written into a directory.

Why: the results JSON is for machines (compare, asv); people read the report. The report
is regenerated from the JSON alone, so a committed results file reproduces its report.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from harness import metric_registry
from harness.measure import limit
from harness.modes import mode_registry
from harness.report import paper, plots, quality, summaries
from harness.spec import PHASES, CellKey
from harness.store.results import cell_map


def _cell_text(c: dict[str, Any] | None, what: str, scale: float = 1.0) -> str:
    """Grid text of one cell: its status unless ok, else the metric ``what`` (or the node counts)."""
    if c is None:
        return ""
    if c["status"] != "ok":
        return c["status"]
    if what == "nodes":
        nb, na = c.get("nodes_before"), c.get("nodes_after")
        return "-" if nb is None else f"{nb} -> {na}"
    metric = metric_registry.get(what)
    v = c.get(metric.name)
    return "-" if v is None or v == "" else metric.report_text(v, scale)


def grid(doc: dict[str, Any], what: str, title: str, scale: float = 1.0) -> str:
    """One markdown table per phase: rows models, columns modes; ``what``: a metric or "nodes"."""
    cells = cell_map(doc)
    keys = list(cells)
    models = list(dict.fromkeys((k.model, k.scale) for k in keys))
    modes = [m for m in mode_registry.names() if any(k.mode == m for k in keys)]
    out = []
    for phase in [p for p in PHASES if any(k.phase == p for k in keys)]:
        out.append(f"### {title}: {phase}\n")
        out.append("| model | scale | " + " | ".join(modes) + " |")
        out.append("| --- | --- |" + " --- |" * len(modes))
        for model, sc in models:
            vals = [_cell_text(cells.get(CellKey(model, sc, m, phase)), what, scale) for m in modes]
            out.append(f"| {model} | {sc} | " + " | ".join(vals) + " |")
        out.append("")
    return "\n".join(out)


def failures(doc: dict[str, Any]) -> str:
    bad = [c for c in doc["cells"] if c["status"] != "ok"]
    if not bad:
        return "All cells ok (every compiled/optimized cell matched eager within tolerance).\n"
    lines = ["| cell | status | error |", "| --- | --- | --- |"]
    for c in bad:
        err = str(c["error"]).replace("|", "\\|").replace("\n", " ")[:300]
        lines.append(f"| {CellKey.of(c).label()} | {c['status']} | {err} |")
    return "\n".join(lines) + "\n"


def _timing_text(cfg: dict[str, Any]) -> str:
    if cfg.get("quality_steps"):
        return (
            f"- training quality: {cfg['quality_steps']} SGD steps (lr {cfg.get('quality_lr')}) x "
            f"{cfg.get('quality_seeds')} seeds per cell beside an eager copy; latency = the mode's training steps "
            f"(the first call left out), taken in turns with the eager copy's; cell timeout {cfg.get('timeout_s')} s\n"
        )
    return (
        f"- timing: {cfg.get('warmup')} warm-up steps, then {cfg.get('min_iters')}-{cfg.get('max_iters')} "
        f"timed steps within {cfg.get('budget_s')} s per cell; cell timeout {cfg.get('timeout_s')} s\n"
    )


def env_text(doc: dict[str, Any]) -> str:
    env, cfg = doc["env"], doc["config"]
    git = env.get("git") or {}
    v = env.get("versions") or {}
    dirty = " (dirty)" if git.get("dirty") else ""
    return (
        (
            f"- commit: `{git.get('sha')}`{dirty}\n"
            f"- torch {v.get('torch')}, torchrec {v.get('torchrec')}, fbgemm-gpu {v.get('fbgemm_gpu')}, python {env.get('python')}\n"
            f"- device: {env.get('device')}; CPU: {env.get('cpu')} ({env.get('cpu_count')} cores); torch threads per "
            f"cell: {cfg.get('threads') or 'default (' + str(env.get('torch_threads')) + ')'}; GPU: {env.get('gpu') or 'none'}\n"
            f"- load average at start (1, 5, 15 min): {env.get('loadavg')}\n" + _timing_text(cfg)
        )
        + (
            f"- sharded: {cfg.get('nproc')} ranks per cell (one torchrun job each), sharding {cfg.get('sharding')}; "
            "latency = slowest rank per step\n"
            if int(cfg.get("nproc") or 1) > 1
            else ""
        )
        + peaks_text(env.get("peaks"))
    )


def peaks_text(peaks: dict[str, Any] | None) -> str:
    """The run's measured machine peaks, the denominators of every cell's floor."""
    if not peaks:
        return ""
    shapes = ", ".join(f"{g['m']}x{g['n']}x{g['k']} {g['flops_per_s'] / 1e9:.1f}" for g in peaks["gemm"])
    return (
        f"- machine peaks ({peaks['device']}, {peaks['threads']} thread(s), median of {peaks['repeats']}): "
        f"GEMM GFLOP/s {shapes} (each matmul at the rate of the nearest shape below its own); streaming copy of "
        f"{peaks['copy_bytes'] / 2**20:.0f} MiB {peaks['bandwidth_bytes_per_s'] / 1e9:.1f} GB/s"
        + (
            f", in cache ({peaks['cache_copy_bytes'] / 2**10:.0f} KiB) {peaks['cache_bandwidth_bytes_per_s'] / 1e9:.1f} GB/s"
            if peaks.get("cache_bandwidth_bytes_per_s")
            else ""
        )
        + "\n"
    )


def shown(doc: dict[str, Any], m: metric_registry.Metric) -> bool:
    """Whether the report shows ``m``: always, except where no cell can have it: a metric marked
    ``report_if_present`` that no cell has, and in a quality run (``run --quality``, which
    measures no peak memory) a metric that no cell has."""
    if m.report_if_present:
        return any(c.get(m.name) for c in doc["cells"])
    if doc["config"].get("quality_steps"):
        return any(c.get(m.name) is not None for c in doc["cells"])
    return True


def metric_grids(doc: dict[str, Any]) -> list[str]:
    """One grid per metric of the registry that has a report title, in registry order."""
    out = []
    for m in metric_registry.metrics():
        if m.report_title is None or not shown(doc, m):
            continue
        unit, scale = m.display_unit(doc["cells"])
        out.append(grid(doc, m.name, m.report_title.format(unit=unit), scale))
    return out


def render(doc: dict[str, Any], title: str, image_names: list[str]) -> str:
    # A quality run's step times are taken in turns with an eager copy's, not timed as a cell
    # times them: no speedup table or dashboard is read from them.
    timed = not doc["config"].get("quality_steps")
    rows = paper.paper_rows(doc) if timed else []
    parts = [f"# {title}\n", env_text(doc)]
    if any(r.get(f"{mode_registry.TARGET} status") for r in rows):
        against = " and ".join(mode_registry.BASELINES)
        parts += [f"## {mode_registry.TARGET} against {against}\n", paper.format_paper_table(rows), ""]
    from harness.report.sharded_section import section as sharded_section

    sharded = sharded_section(doc)
    trained = quality.section(doc)
    limit_table = limit.format_table(doc)
    dashboard = summaries.section(doc) if timed else ""
    parts += [
        *([trained] if trained else []),
        *([dashboard] if dashboard else []),
        *([sharded] if sharded else []),
        *(["## The limit: an ideal rewrite on this device\n", limit_table, ""] if limit_table else []),
        "## Per mode\n",
        *metric_grids(doc),
        grid(doc, "nodes", "Dense-graph nodes before -> after Optimus"),
        "## Failed, timed-out and mismatched cells\n",
        failures(doc),
        "## Plots\n",
        *[f"![{n}]({n})" for n in image_names],
        "",
        "Peak memory on CPU: bytes of parameters, buffers and optimizer state plus the "
        "peak of the torch allocator's own allocations during one step (torch.profiler memory events); "
        "on CUDA: torch.cuda.max_memory_allocated.",
    ]
    return "\n".join(parts) + "\n"


def write_report(doc: dict[str, Any], out_dir: str | Path, stem: str, title: str | None = None) -> list[Path]:
    """Write ``<stem>.md`` and its PNGs into ``out_dir``; return the paths written."""
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    if not doc["cells"]:
        raise ValueError("results: no cells to report")
    plotted = sorted((m for m in metric_registry.metrics() if m.plot_stem and shown(doc, m)),
                     key=lambda m: m.plot_rank)  # fmt: skip
    images = [plots.plot_metric(doc, m, out / f"{stem}_{m.plot_stem}.png") for m in plotted]
    if any(c.get("floor_ms") for c in doc["cells"]):
        images.append(plots.plot_floor(doc, out / f"{stem}_floor.png"))
    if quality.quality_cells(doc):
        images.insert(0, quality.plot(doc, out / f"{stem}_quality.png"))
    rows = paper.paper_rows(doc) if not doc["config"].get("quality_steps") else []
    if any(r.get(f"vs {mode_registry.BASELINES[0]}") for r in rows):
        images.append(plots.plot_speedups(rows, out / f"{stem}_speedup.png"))
        images.append(plots.plot_changes(rows, out / f"{stem}_changes.png"))
    md = out / f"{stem}.md"
    md.write_text(render(doc, title or f"optimus-bench report: {stem}", [p.name for p in images]))
    return [md, *images]
