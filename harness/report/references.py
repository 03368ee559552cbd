"""The committed reference runs, shown beside a fresh ``reproduce`` run.

Why: the default ``reproduce`` runs at ``tiny`` scale so it finishes in minutes on a laptop, and
at that scale compile times and speedups are small. The paper-scale figures (for example the
compile time saved on dcn ``large`` training) live in the committed results folders (the newest
runs of all families: ``results/medium`` and ``results/large``). This reads those JSON files (never
hard-coded figures) and renders them with the commit and date they were measured at, so a
newcomer sees both the run they just made and what the same command gives at scale, down to the
dashboard summaries of each (``harness.report.summaries``), to read beside the fresh run's.

The reference models (``REFERENCE_MODELS``: MLPerf's DLRMv2) are models the field knows, not
ours: their committed run (``results/mlperf-dlrmv2``) is shown the same way at no cost, and
``reproduce --reference NAME`` measures one afresh beside our families (minutes of compiles on a
two-core machine, which is why it is not in the default run).
"""

from __future__ import annotations

import datetime as dt
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from harness.env import REPO_ROOT
from harness.report import paper, summaries
from harness.spec import parse_list
from harness.store import results

REFERENCE_RUNS = (
    ("medium", "reproduce-medium"),
    ("large", "reproduce-large"),
    ("mlperf-dlrmv2", "mlperf-dlrmv2"),
)
"""(folder under ``results/``, stem): each folder holds ``<stem>.json``, from ``optimus-bench
reproduce`` (our families) or, for a reference model, from ``run`` with reproduce's options."""


@dataclass(frozen=True)
class ReferenceModel:
    """A model the field knows, run beside our families by ``reproduce --reference NAME``: the
    provider that builds it, the one model and scale it runs at, and where it comes from."""

    name: str
    provider: str
    model: str
    scale: str
    source: str

    def out_path(self, out: str | Path) -> Path:
        """Its results file beside reproduce's ``--out``: ``<stem>-<name>.json``."""
        path = Path(out)
        return path.with_name(f"{path.stem}-{self.name}.json")


REFERENCE_MODELS: dict[str, ReferenceModel] = {
    "mlperf_dlrmv2": ReferenceModel(
        name="mlperf_dlrmv2",
        provider="harness.providers.mlperf_dlrmv2:build",
        model="mlperf_dlrmv2",
        scale="cpu",
        source="MLPerf Training DLRMv2 (mlcommons/training recommendation_v2/torchrec_dlrm): "
        "torchrec's DLRM_DCN, tables capped at the cpu scale's row cap",
    ),
}
"""``reproduce --reference`` names: each runs in every mode and phase reproduce runs, at its own
scale (its provider has no ``tiny``), into its own results file and report."""


def reference_models(text: str | None) -> list[ReferenceModel]:
    """The models a ``--reference`` comma list names (None or '': none); an unknown name is one
    line naming the allowed ones (a ValueError: exit 2 before any cell)."""
    if not text:
        return []
    return [REFERENCE_MODELS[n] for n in parse_list(text, "reference", tuple(REFERENCE_MODELS))]


def reference_section(model: ReferenceModel, doc: dict[str, Any], report: str) -> str:
    """Markdown: the reference model's paper-style rows and dashboard summaries, fresh from this
    run, with the name of its own full report (every mode and metric)."""
    return "\n".join(
        [
            f"## Reference model: {model.name}, scale {model.scale}",
            "",
            f"{model.source}. Measured in this run, in its modes and phases and with its options; "
            f"its full report: `{report}`.",
            "",
            paper.format_paper_table(paper.paper_rows(doc)),
            "",
            *(f"- dashboard summary, {line}" for line in summaries.target_lines(doc)),
        ]
    )


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
        "The same command at larger scales, and the reference models, read from the committed "
        "results files: compile+optimus "
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
