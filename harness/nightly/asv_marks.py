"""Mark the nightly's change points on a published asv dashboard (a step after `asv publish`).

Why this way: asv's own "regressions" come from its step detection at publish time, which
misses steps of 10% or less at this machine's noise; writing ours into its ``regressions.json``
would be overwritten by the next publish, and asv marks them on a graph only when it is
opened from the regressions page. Instead one script is added to the published site,
``optimus_changes.js``: our change points (``harness.nightly.changes``) with their commits, and
a flot plugin (``harness/nightly/asv_changes.js``; flot's public plugin API, flot 0.8.3 as asv pins it)
that draws them on the main graph of their benchmark: a line at the first commit at the new
level, a band back to the last commit at the old one, and a label naming the commit, the cell
and the size. asv's files are otherwise untouched; marking again after each publish replaces
the marks (idempotent).
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from harness import metric_registry
from harness.nightly.alert_policy import AlertPolicy
from harness.nightly.changes import SeriesResult, alerts_of

SCRIPT = "optimus_changes.js"
PLUGIN = Path(__file__).with_name("asv_changes.js")
TAG = f'<script language="javascript" type="text/javascript" src="{SCRIPT}"></script>'


def benchmark_of(metric: str) -> str | None:
    """The asv benchmark that graphs a history metric (``Metric.asv_bench``), None if none does."""
    return metric_registry.get(metric).asv_bench


@dataclass(frozen=True)
class Marked:
    placed: list[dict[str, Any]]  # the marks written, one per change point
    skipped: list[str]  # why a change point has no mark (benchmark or commit not on the dashboard)


def marks_of(found: Sequence[SeriesResult], commit_of: Mapping[str, str] | None = None,
             dedupe: int = AlertPolicy.dedupe) -> list[dict[str, Any]]:  # fmt: skip
    """One mark per change point of ``found``; ``commit_of`` maps a history sha to the commit
    asv knows it by (identity when absent: the nightly records the commit it measured)."""
    out = []
    for r in found:
        s = r.series
        bench = benchmark_of(s.metric)
        if bench is None:  # a metric no asv benchmark graphs: nothing on the dashboard to mark
            continue
        for c in r.changes:
            alerts = alerts_of(r, c, dedupe)
            model, scale, mode, phase = s.cell.split("/")
            out.append({
                "benchmark": bench,
                "params": {"family": repr(model), "scale": repr(scale), "phase": repr(phase), "mode": repr(mode)},
                "cell": s.cell,
                "metric": s.metric,
                "commit": (commit_of or {}).get(s.shas[c.index], s.shas[c.index]),
                "before": (commit_of or {}).get(s.shas[c.index - 1], s.shas[c.index - 1]),
                "size": f"{c.change * 100:+.1f}% [{c.ci[0] * 100:+.1f}%, {c.ci[1] * 100:+.1f}%]",
                "regression": c.regression,
                "alert": f"alerted on night {alerts[0][0] + 1} ({alerts[0][1]})" if alerts else "",
            })  # fmt: skip
    return out


def _params_not_graphed(bench: dict[str, Any], params: dict[str, str]) -> str:
    """The first of the mark's parameter values the benchmark does not graph ('' if none)."""
    for name, values in zip(bench.get("param_names", []), bench.get("params", []), strict=False):
        if name in params and params[name] not in values:
            return f"{name}={params[name]}"
    return ""


def mark_dashboard(html_dir: str | Path, marks: Sequence[dict[str, Any]]) -> Marked:
    """Write ``optimus_changes.js`` into the published ``html_dir`` and load it from its
    ``index.html``; a mark whose benchmark or commit the dashboard lacks is skipped, with why."""
    html = Path(html_dir)
    index_html, index_json = html / "index.html", html / "index.json"
    if not index_html.is_file() or not index_json.is_file():
        raise ValueError(
            f"{html}: not a published asv dashboard (no index.html / index.json); run `asv publish`"
        )
    index = json.loads(index_json.read_text())
    hashes = list(index.get("revision_to_hash", {}).values())
    benchmarks = index.get("benchmarks", {})
    by_bench: dict[str, list[dict[str, Any]]] = {}
    placed, skipped = [], []
    for m in marks:
        where = f"{m['cell']} {m['metric']} at {m['commit'][:10]}"
        if m["benchmark"] not in benchmarks:
            skipped.append(f"{where}: benchmark {m['benchmark']} not on the dashboard")
        elif not any(h.startswith(m["commit"]) for h in hashes):
            skipped.append(f"{where}: commit not on the dashboard (asv has no results for it)")
        elif missing := _params_not_graphed(benchmarks[m["benchmark"]], m["params"]):
            skipped.append(f"{where}: {m['benchmark']} has no {missing} (not graphed)")
        else:
            by_bench.setdefault(m["benchmark"], []).append(m)
            placed.append(m)
    data = json.dumps(by_bench, sort_keys=True)  # one line: the data, then the plugin
    (html / SCRIPT).write_text(f"window.OPTIMUS_CHANGES = {data};\n{PLUGIN.read_text()}")
    text = index_html.read_text()
    if TAG not in text:
        if "</head>" not in text:
            raise ValueError(f"{index_html}: no </head> to add {SCRIPT} before")
        index_html.write_text(text.replace("</head>", f"    {TAG}\n  </head>", 1))
    return Marked(placed, skipped)
