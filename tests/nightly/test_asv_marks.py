"""The change points marked on a published asv dashboard (``harness.nightly.asv_marks``), without a browser.

A published site is faked by its two files the step reads (``index.html``, ``index.json``);
the browser check of the real dashboard is ``tests/benchmarks_asv/test_asv_changes_dashboard.py``.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from harness.cli import main
from harness.nightly.asv_marks import SCRIPT, TAG, mark_dashboard, marks_of
from harness.nightly.changepoints import describe
from harness.nightly.changes import Series, SeriesResult

ROOT = Path(__file__).resolve().parents[2]
DEMO = ROOT / "results" / "nightly-changes-demo" / "history.jsonl"
BENCH = "bench_compiled.CompiledCells.track_latency_ms"


def _site(tmp: Path, shas: list[str], benchmarks: tuple[str, ...] = (BENCH,)) -> Path:
    html = tmp / "html"
    html.mkdir(parents=True)
    (html / "index.html").write_text("<html>\n  <head>\n    <title>asv</title>\n  </head>\n</html>\n")
    index = {
        "benchmarks": {b: {} for b in benchmarks},
        "revision_to_hash": {str(i): s for i, s in enumerate(shas)},
    }
    (html / "index.json").write_text(json.dumps(index))
    return html


def _stepped(shas: list[str]) -> SeriesResult:
    values = [5.0, 5.1, 4.9, 5.0, 5.5, 5.6, 5.4, 5.5]
    s = Series("towers/tiny/compile/infer", "latency_ms", shas, values, [False] * len(values))
    return SeriesResult(s, describe(values, [4]), [])


def _written(html: Path) -> dict[str, list[dict[str, object]]]:
    text = (html / SCRIPT).read_text()
    head = text.split("\n", 1)[0]
    assert head.startswith("window.OPTIMUS_CHANGES = ") and head.endswith(";")
    assert "$.plot.plugins.push" in text  # the flot plugin that draws them follows the data
    return dict(json.loads(head[len("window.OPTIMUS_CHANGES = ") : -1]))


def test_a_change_point_is_marked_with_its_commits_once(tmp_path: Path) -> None:
    shas = [f"{i:02d}" * 20 for i in range(8)]
    html = _site(tmp_path, shas)
    for _ in range(2):  # after each publish; the second run replaces, never duplicates
        marked = mark_dashboard(html, marks_of([_stepped(shas)]))
    assert marked.skipped == []
    (mark,) = _written(html)[BENCH]
    assert mark["commit"] == shas[4] and mark["before"] == shas[3]
    assert mark["cell"] == "towers/tiny/compile/infer" and mark["regression"] is True
    assert str(mark["size"]).startswith("+10.")
    assert (html / "index.html").read_text().count(TAG) == 1
    assert (html / "index.html").read_text().index(TAG) < (html / "index.html").read_text().index("</head>")


def test_marks_the_dashboard_cannot_show_are_skipped_with_why(tmp_path: Path) -> None:
    shas = [f"{i:02d}" * 20 for i in range(8)]
    html = _site(tmp_path, shas[:4])  # asv has no results for the commit of the change
    marked = mark_dashboard(html, marks_of([_stepped(shas)]))
    assert marked.placed == [] and "commit not on the dashboard" in marked.skipped[0]
    other = _site(tmp_path / "b", shas, benchmarks=("bench_optimizer.OptimizeSynthetic.time_optimize",))
    marked = mark_dashboard(other, marks_of([_stepped(shas)]))
    assert marked.placed == [] and f"benchmark {BENCH} not on the dashboard" in marked.skipped[0]
    assert _written(other) == {}
    graphed = _site(tmp_path / "c", shas)
    index = json.loads((graphed / "index.json").read_text())
    index["benchmarks"][BENCH] = {
        "param_names": ["family", "mode"],
        "params": [["'dlrm'", "'towers'"], ["'eager'"]],
    }
    (graphed / "index.json").write_text(json.dumps(index))
    marked = mark_dashboard(graphed, marks_of([_stepped(shas)]))  # the cell's mode is not graphed
    assert marked.placed == [] and f"{BENCH} has no mode='compile' (not graphed)" in marked.skipped[0]
    with pytest.raises(ValueError, match="not a published asv dashboard"):
        mark_dashboard(tmp_path / "nothing", [])


def test_changes_command_marks_the_history_change_point(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    pytest.importorskip("otava.analysis", reason="apache-otava is installed by scripts/install-deps")
    shas = [json.loads(line)["night"]["sha"] for line in DEMO.read_text().splitlines()]
    html = _site(tmp_path, shas)
    assert main(["changes", str(DEMO), "--asv-html", str(html)]) == 0
    assert "marked 1 change point(s)" in capsys.readouterr().out
    (mark,) = _written(html)[BENCH]
    assert (
        mark["commit"] == shas[25] and mark["alert"] == "alerted on night 33 (agree)"
    )  # night 26, as the README
    assert main(["changes", str(DEMO), "--asv-html", str(tmp_path / "missing")]) == 2


def test_the_nightly_marks_the_dashboard_its_asv_config_publishes_to(tmp_path: Path) -> None:
    from harness.nightly.changes import ChangeConfig
    from harness.nightly.job import ChangePoints, mark_changes

    shas = [f"{i:02d}" * 20 for i in range(8)]
    html = _site(tmp_path, shas)
    conf = tmp_path / "asv.conf.json"
    conf.write_text('{\n  // comments are allowed\n  "html_dir": "html"\n}\n')  # relative to the config
    logged: list[str] = []
    mark_changes(conf, ChangePoints(True, [], "", set(), [_stepped(shas)]), ChangeConfig(), logged.append)
    assert logged == ["1 change point(s) marked on the dashboard"]
    assert _written(html)[BENCH][0]["commit"] == shas[4]
