"""The committed reference runs, shown beside a fresh ``reproduce`` run.

Why: the default ``reproduce`` runs at ``tiny`` scale so it finishes in minutes on a laptop, and
at that scale compile times and speedups are small. The paper-scale figures (for example the
compile time saved on dcn ``large`` training) live in the committed results folders (the newest
runs of all families: ``results/medium`` and ``results/large``). This reads those JSON files (never
hard-coded figures) and renders them with the commit and date they were measured at, so a
newcomer sees both the run they just made and what the same command gives at scale, down to the
dashboard summaries of each (``harness.report.summaries``), to read beside the fresh run's.
"""

from __future__ import annotations

import datetime as dt
from pathlib import Path
from typing import Any

from harness.env import REPO_ROOT
from harness.report import paper, summaries
from harness.store import results

REFERENCE_RUNS = (
    ("medium", "reproduce-medium"),
    ("large", "reproduce-large"),
)
"""(folder under ``results/``, stem): each folder holds ``<stem>.json`` from ``optimus-bench reproduce``."""

REPO_RESULTS = REPO_ROOT / "results"


def load_references(root: Path = REPO_RESULTS) -> list[tuple[Path, dict[str, Any]]]:
    """(path, results doc) of every reference run present under ``root``, in REFERENCE_RUNS order."""
    found = []
    for folder, stem in REFERENCE_RUNS:
        path = root / folder / f"{stem}.json"
        if path.is_file():
            found.append((path, results.load(path)))
    return found


def measured_at(doc: dict[str, Any]) -> tuple[str, str]:
    """(short commit, UTC date of the last finished cell) of a results doc; '?' where unknown."""
    sha = str((doc.get("env") or {}).get("git", {}).get("sha") or "?")[:7]
    stamps = [c["finished_at"] for c in doc["cells"] if isinstance(c.get("finished_at"), (int, float))]
    day = dt.datetime.fromtimestamp(max(stamps), dt.UTC).strftime("%Y-%m-%d") if stamps else "?"
    return sha, day


def _noisy(row: dict[str, Any]) -> bool:
    """Either side's latency has an IQR above ``paper.NOISY`` of its median (the report's † mark)."""
    for mode in (paper.BASELINES[0], paper.TARGET):
        med, iqr = row.get(f"{mode} ms"), row.get(f"{mode} iqr")
        if med and iqr is not None and iqr > paper.NOISY * med:
            return True
    return False


def _figure(row: dict[str, Any]) -> str:
    sp = row["vs compile"]
    speed = (
        "-"
        if not sp
        else (str(sp["status"]) if "status" in sp else f"{sp['x']:.2f}x ({sp['lo']:.2f}-{sp['hi']:.2f})")
    )
    if sp and "status" not in sp and _noisy(row):
        speed += " †"
    cs = row["compile_s"]
    comp = "-" if cs is None else f"{cs[0]:.1f} s -> {cs[1]:.1f} s ({row['compile_change_s']:+.1f} s)"
    mem = "-" if row["mem_change_pct"] is None else f"{row['mem_change_pct']:+.1f}%"
    return f"| {row['model']} | {row['scale']} | {row['phase']} | {speed} | {comp} | {mem} |"


def render(refs: list[tuple[Path, dict[str, Any]]], base: Path | None = None) -> str:
    """Markdown: one table per reference run (compile+optimus against compile), with commit and date."""
    lines = ["## Beside the committed reference runs", ""]
    if not refs:
        return "\n".join(
            [
                *lines,
                f"No reference runs found (looked for {', '.join(f for f, _ in REFERENCE_RUNS)} under results/).",
            ]
        )
    lines.append(
        "The same command at larger scales, read from the committed results files: compile+optimus "
        "against compile (speedup with its 95% interval, compile time, peak memory); † marks a "
        f"speedup whose compile or compile+optimus steps spread (IQR) more than {paper.NOISY:.0%} of "
        "their median: read it with the folder's README."
    )
    for path, doc in refs:
        sha, day = measured_at(doc)
        shown = path.relative_to(base) if base is not None and path.is_relative_to(base) else path
        lines += [
            "",
            f"### `{shown}`: scale {doc['config'].get('scale', '?')}, commit {sha}, measured {day}",
            "",
            "| model | scale | phase | speedup vs compile | compile time compile -> optimus | peak mem change |",
            "| --- | --- | --- | --- | --- | --- |",
            *(_figure(r) for r in paper.paper_rows(doc)),
            "",
            *(f"- dashboard summary, {line}" for line in summaries.target_lines(doc)),
        ]
    return "\n".join(lines)


def section(root: Path = REPO_RESULTS) -> str:
    """The rendered section for the reference runs under ``root``."""
    return render(load_references(root), base=root.parent)
