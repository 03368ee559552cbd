"""Markdown tables and PNG plots of one results file, written into a directory.

Why: the results JSON is for machines (compare, asv); people read the report. The report
is regenerated from the JSON alone, so a committed results file reproduces its report.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from harness import paper, plots
from harness.results import cell_map
from harness.spec import MODES, PHASES, CellKey


def _cell_text(c: dict[str, Any] | None, what: str, mem_scale: int = 2**20) -> str:
    if c is None:
        return ""
    if c["status"] != "ok":
        return c["status"]
    if what == "latency":
        lat = c["latency_ms"]
        return f"{lat['median']:.3f} ({lat['iqr']:.3f})"
    if what == "memory":
        return "-" if c.get("peak_mem_bytes") is None else f"{c['peak_mem_bytes'] / mem_scale:.4g}"
    if what == "compile":
        return "-" if c.get("compile_s") is None else f"{c['compile_s']:.2f}"
    if what == "peak_at":
        return c.get("peak_mem_at") or "-"
    if what == "nodes":
        nb, na = c.get("nodes_before"), c.get("nodes_after")
        return "-" if nb is None else f"{nb} -> {na}"
    raise ValueError(f"what: unknown {what!r}")


def grid(doc: dict[str, Any], what: str, title: str, mem_scale: int = 2**20) -> str:
    """One markdown table per phase: rows models, columns modes."""
    cells = cell_map(doc)
    keys = list(cells)
    models = list(dict.fromkeys((k.model, k.scale) for k in keys))
    modes = [m for m in MODES if any(k.mode == m for k in keys)]
    out = []
    for phase in [p for p in PHASES if any(k.phase == p for k in keys)]:
        out.append(f"### {title}: {phase}\n")
        out.append("| model | scale | " + " | ".join(modes) + " |")
        out.append("| --- | --- |" + " --- |" * len(modes))
        for model, scale in models:
            vals = [_cell_text(cells.get(CellKey(model, scale, m, phase)), what, mem_scale) for m in modes]
            out.append(f"| {model} | {scale} | " + " | ".join(vals) + " |")
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


def env_text(doc: dict[str, Any]) -> str:
    env, cfg = doc["env"], doc["config"]
    git = env.get("git") or {}
    v = env.get("versions") or {}
    dirty = " (dirty)" if git.get("dirty") else ""
    return (
        f"- commit: `{git.get('sha')}`{dirty}\n"
        f"- torch {v.get('torch')}, torchrec {v.get('torchrec')}, fbgemm-gpu {v.get('fbgemm_gpu')}, python {env.get('python')}\n"
        f"- device: {env.get('device')}; CPU: {env.get('cpu')} ({env.get('cpu_count')} cores); torch threads per "
        f"cell: {cfg.get('threads') or 'default (' + str(env.get('torch_threads')) + ')'}; GPU: {env.get('gpu') or 'none'}\n"
        f"- load average at start (1, 5, 15 min): {env.get('loadavg')}\n"
        f"- timing: {cfg.get('warmup')} warm-up steps, then {cfg.get('min_iters')}-{cfg.get('max_iters')} "
        f"timed steps within {cfg.get('budget_s')} s per cell; cell timeout {cfg.get('timeout_s')} s\n"
    )


def render(doc: dict[str, Any], title: str, image_names: list[str]) -> str:
    rows = paper.paper_rows(doc)
    unit, mem_scale = plots.memory_unit(doc)
    parts = [f"# {title}\n", env_text(doc)]
    if any(r.get("compile+optimus status") for r in rows):
        parts += ["## compile+optimus against compile and compile+peer\n", paper.format_paper_table(rows), ""]
    parts += [
        "## Per mode\n",
        grid(doc, "latency", "Median step latency, ms (IQR)"),
        grid(doc, "memory", f"Peak memory of one step, {unit}", mem_scale),
        *(
            [grid(doc, "peak_at", "Where the step's memory peak falls (CPU; profiler op around it)")]
            if any(c.get("peak_mem_at") for c in doc["cells"])
            else []
        ),
        grid(doc, "compile", "Compile time, s (caches off)"),
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
    images = [
        plots.plot_latency(doc, out / f"{stem}_latency.png"),
        plots.plot_compile_time(doc, out / f"{stem}_compile_time.png"),
        plots.plot_peak_memory(doc, out / f"{stem}_peak_memory.png"),
    ]
    rows = paper.paper_rows(doc)
    if any(r.get("vs compile") for r in rows):
        images.append(plots.plot_speedups(rows, out / f"{stem}_speedup.png"))
        images.append(plots.plot_changes(rows, out / f"{stem}_changes.png"))
    md = out / f"{stem}.md"
    md.write_text(render(doc, title or f"optimus-bench report: {stem}", [p.name for p in images]))
    return [md, *images]
