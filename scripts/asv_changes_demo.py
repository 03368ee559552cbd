#!/usr/bin/env python3
"""An asv dashboard of a nightly history with its change points marked, and its screenshot.

Why a script: the committed demo history (``results/nightly-changes-demo/history.jsonl``) is
synthetic; its nights have made-up commits and were never run by asv. To show what the
dashboard looks like, this builds a throw-away git repository with one commit per night (the
night's history sha in its message), writes asv result files for those commits straight from
the history (one ``CompiledCells.track_latency_ms`` figure per cell and night: running asv per
commit would measure this machine, not the history), runs ``asv publish``, marks the change
points (``harness.nightly.asv_marks``, the same step as ``optimus-bench changes --asv-html``), and
renders the graph in headless Chromium (``scripts/asv_screenshot.py --expect-marks``).

    python scripts/asv_changes_demo.py [--history results/nightly-changes-demo/history.jsonl]
        [--out results/nightly-changes-demo/asv-dashboard.png] [--assets-dir DIR] [--work DIR]

``--assets-dir``: local copies of asv's CDN files (``scripts/asv_vendor_assets.py``; fetched
into the work directory when not given). Exit 0: rendered with the marks; 1: not; 2: error.
"""

from __future__ import annotations

import argparse
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from harness.nightly.asv_demo import PAGE, build  # noqa: E402


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--history", default="results/nightly-changes-demo/history.jsonl")
    ap.add_argument("--out", default="results/nightly-changes-demo/asv-dashboard.png")
    ap.add_argument("--assets-dir", help="local copies of asv's CDN files (default: fetch them with npm)")
    ap.add_argument("--work", help="keep the repository, results and site here (default: a temporary dir)")
    args = ap.parse_args(argv)
    with tempfile.TemporaryDirectory(prefix="asv-changes-demo-") as tmp:
        work = Path(args.work) if args.work else Path(tmp)
        html, placed, skipped = build(args.history, work)
        for m in placed:
            print(f"marked {m['cell']} {m['metric']}: change point at {m['commit'][:10]} {m['size']}")
        for why in skipped:
            print(f"not marked: {why}")
        assets = args.assets_dir
        if assets is None:
            assets = str(work / "assets")
            subprocess.run([sys.executable, str(ROOT / "scripts" / "asv_vendor_assets.py"), "--out", assets,
                            "--index", str(html / "index.html")], check=True, capture_output=True)  # fmt: skip
        shot = subprocess.run([sys.executable, str(ROOT / "scripts" / "asv_screenshot.py"), "--html-dir", str(html),
                               "--out", args.out, "--page", PAGE, "--assets-dir", assets,
                               "--expect-marks", str(len(placed))], capture_output=True, text=True)  # fmt: skip
        print(shot.stdout, shot.stderr, sep="", end="")
        return shot.returncode


if __name__ == "__main__":
    sys.exit(main())
