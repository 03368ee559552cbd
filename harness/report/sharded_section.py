"""The report's section on sharded cells: ranks, plan, per-rank and slowest-rank figures, and
where a training step goes.

Why its own table: the ordinary grids show one figure per cell (for a sharded cell: the
slowest rank's step); a straggler, a lopsided plan or one rank's memory only shows per rank.
Why the step split: what a dense-arch optimizer can win in a sharded training step is bounded
by the dense parts of it (docs/sharded.md, "Where the step goes").
"""

from __future__ import annotations

from typing import Any

from harness.spec import CellKey


def sharded_cells(doc: dict[str, Any]) -> list[dict[str, Any]]:
    return [c for c in doc["cells"] if int(c.get("nproc") or 1) > 1]


def _ms(lat: dict[str, Any] | None) -> str:
    if not lat:
        return "-"
    return f"{lat['median']:.3g} ({lat.get('q1', lat['median']):.3g}-{lat.get('q3', lat['median']):.3g})"


def _mib(v: Any) -> str:
    return "-" if v is None else f"{v / 2**20:.2f}"


def section(doc: dict[str, Any]) -> str:
    """Markdown: one row per sharded cell (empty string when the file has none)."""
    cells = sharded_cells(doc)
    if not cells:
        return ""
    lines = [
        "## Sharded cells (torchrun, one record per rank)\n",
        "Latency: median (q1-q3) ms; the cell's is the slowest rank at each step. Peak memory per rank, MiB.\n",
        "| cell | ranks | sharding | plan | status | slowest rank | per rank | compile s (per rank) | peak MiB (per rank) |",
        "| --- | --- | --- | --- | --- | --- | --- | --- | --- |",
    ]
    for c in cells:
        ranks = c.get("ranks") or []
        per = " / ".join(_ms(r.get("latency_ms")) for r in ranks) or "-"
        comp = (
            " / ".join("-" if r.get("compile_s") is None else f"{r['compile_s']:.2f}" for r in ranks) or "-"
        )
        mem = " / ".join(_mib(r.get("peak_mem_bytes")) for r in ranks) or "-"
        status = c["status"] if c["status"] == "ok" else f"{c['status']}: {str(c.get('error'))[:120]}"
        status = status.replace("|", "\\|").replace("\n", " ")
        lines.append(
            f"| {CellKey.of(c).label()} | {c.get('nproc')} | {c.get('sharding')} | {c.get('plan_summary') or '-'} "
            f"| {status} | {_ms(c.get('latency_ms'))} | {per} | {comp} | {mem} |"
        )
    return "\n".join(lines + split_table(cells)) + "\n"


# (column heading, step_split_ms key): harness/measure/step_split.py's components
SPLIT_COLUMNS = (
    ("sparse", "sparse"),
    ("dense fwd", "dense_forward"),
    ("dense bwd", "dense_backward"),
    ("all-reduce", "allreduce"),
    ("optimizer", "optimizer"),
    ("hand-off", "handoff"),
    ("other", "other"),
)


def split_table(cells: list[dict[str, Any]]) -> list[str]:
    """Markdown lines: the step split of every cell that has one (training cells); none else."""
    split = [c for c in cells if c.get("step_split_ms")]
    if not split:
        return []
    heads = " | ".join(h for h, _ in SPLIT_COLUMNS)
    lines = [
        "",
        "### Where the step goes\n",
        "Profiled training steps after the timed ones, ms: the median step's split, on the rank with the "
        "longest one; its parts sum to the profiled step. Optimus can "
        "change dense fwd, dense bwd and hand-off; not sparse, the all-reduce's volume or the optimizer "
        "(docs/sharded.md). gloo busy: the all-reduce on gloo's own thread, overlapping the backward.\n",
        f"| cell | rank | profiled step | {heads} | gloo busy |",
        "| --- | --- | --- | " + " | ".join("---" for _ in SPLIT_COLUMNS) + " | --- |",
    ]
    for c in split:
        s = c["step_split_ms"]
        parts = " | ".join(f"{float(s.get(k) or 0.0):.2f}" for _, k in SPLIT_COLUMNS)
        lines.append(
            f"| {CellKey.of(c).label()} | {c.get('step_split_rank', '-')} | {float(s['step']):.2f} | {parts} "
            f"| {float(s.get('allreduce_busy') or 0.0):.2f} |"
        )
    return lines
