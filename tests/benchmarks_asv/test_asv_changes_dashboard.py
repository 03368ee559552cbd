"""The asv dashboard of the demo history, with its change point marked, in headless Chromium.

``scripts/asv_changes_demo.py`` publishes the committed demo history
(``results/nightly-changes-demo/history.jsonl``) with ``asv publish`` and marks its change point;
``scripts/asv_screenshot.py --expect-marks`` renders the graph and counts the marks in the DOM.
Skipped without Chromium (``apt-get install -y chromium``), as the other browser check, and
when asv's CDN files cannot be fetched from the npm registry (``scripts/asv_vendor_assets.py``).
"""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

ROOT = Path(__file__).resolve().parents[2]
HISTORY = ROOT / "results" / "nightly-changes-demo" / "history.jsonl"
TAG_START = '<script language="javascript" type="text/javascript" src="optimus_changes.js">'


def _shot(html: Path, assets: Path, out: Path, expect: int, query: str = "") -> tuple[int, dict[str, Any]]:
    cmd = [sys.executable, str(ROOT / "scripts" / "asv_screenshot.py"), "--html-dir", str(html), "--out", str(out),
           "--page", "#bench_compiled.CompiledCells.track_latency_ms" + query, "--assets-dir", str(assets),
           "--expect-marks", str(expect)]  # fmt: skip
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=300)
    return proc.returncode, json.loads(proc.stdout[proc.stdout.index("{") :])


def test_the_dashboard_shows_the_change_point_with_its_commit(tmp_path: Path) -> None:
    pytest.importorskip("otava.analysis", reason="apache-otava is installed by scripts/install-deps")
    if shutil.which("chromium") is None:
        pytest.skip("no chromium: apt-get install -y chromium")
    from harness.nightly.asv_demo import build

    html, placed, skipped = build(str(HISTORY), tmp_path)
    assert skipped == [] and len(placed) == 1
    assets = tmp_path / "assets"
    vendor = subprocess.run([sys.executable, str(ROOT / "scripts" / "asv_vendor_assets.py"), "--out", str(assets),
                             "--index", str(html / "index.html")], capture_output=True, text=True)  # fmt: skip
    if vendor.returncode != 0:
        pytest.skip(f"asv's CDN files not fetched from npm (offline?): {vendor.stderr[-300:]}")

    rc, report = _shot(html, assets, tmp_path / "marked.png", expect=1)
    assert rc == 0 and report["rendered"], report
    assert report["change_marks"] == 1 and report["plot_canvases"] >= 1
    (label,) = report["change_mark_labels"]
    assert f"change point {placed[0]['commit'][:10]}: towers/tiny/compile/infer +" in label  # with its commit

    # the change is towers'; with only dlrm's series selected (asv's URL state) it is not drawn
    rc, report = _shot(html, assets, tmp_path / "dlrm.png", expect=0, query="?p-family=%27dlrm%27")
    assert rc == 0 and report["change_marks"] == 0 and report["plot_canvases"] >= 1, report
    rc, report = _shot(html, assets, tmp_path / "towers.png", expect=1, query="?p-family=%27towers%27")
    assert rc == 0 and report["change_marks"] == 1, report

    # the same site without the marks script: the check sees no mark and fails
    index = html / "index.html"
    index.write_text("\n".join(line for line in index.read_text().splitlines() if TAG_START not in line))
    rc, report = _shot(html, assets, tmp_path / "unmarked.png", expect=1)
    assert rc == 1 and report["change_marks"] == 0, report
    assert "0 change point mark(s) on the graph, expected 1" in report["reasons"]
