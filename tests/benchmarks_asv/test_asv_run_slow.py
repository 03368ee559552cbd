"""`asv run --quick` over the last two commits, `asv publish`, and the dashboard in Chromium.

Slow (minutes: asv builds each commit and the harness compiles with Inductor), so it is
marked ``slow`` and runs in its own tox env: ``tox -e asv``. It works on a throw-away clone
whose local ``main`` points at HEAD, so asv's ``branches: ["main"]`` graphs these commits
without touching the real repository; the asv environment of the checkout is reused.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest

from harness.nightly.job import read_asv_conf

ROOT = Path(__file__).resolve().parents[2]
BENCH = "bench_compiled.CompiledSpeedup|bench_optimizer.OptimizeSynthetic.time_optimize"
GRID = {"OPTIMUS_ASV_FAMILIES": "towers", "OPTIMUS_ASV_PHASES": "infer", "OPTIMUS_ASV_WIDTHS": "16"}

pytestmark = pytest.mark.slow


def git(repo: Path, *args: str) -> str:
    return subprocess.run(["git", *args], cwd=repo, check=True, capture_output=True, text=True).stdout.strip()


def asv(repo: Path, conf: Path, *args: str, timeout: float = 1800) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "asv", *args, "--config", str(conf)],
        cwd=repo,
        capture_output=True,
        text=True,
        timeout=timeout,
        env={**os.environ, **GRID},
    )


def test_asv_quick_over_two_commits_publishes_a_rendering_dashboard(tmp_path: Path) -> None:
    repo = tmp_path / "repo"
    subprocess.run(["git", "clone", "-q", str(ROOT), str(repo)], check=True)
    git(repo, "branch", "-f", "main", "HEAD")
    conf = read_asv_conf(repo / "asv.conf.json")
    conf["env_dir"] = str(ROOT / ".asv" / "env")  # reuse the checkout's asv environment
    conf_path = repo / "asv.test.conf.json"
    conf_path.write_text(json.dumps(conf))
    if not (Path.home() / ".asv-machine.json").exists():
        asv(repo, conf_path, "machine", "--yes")
    commits = git(repo, "rev-list", "--first-parent", "-n", "2", "HEAD").split()
    (repo / "last2.txt").write_text("\n".join(commits) + "\n")

    t0 = time.perf_counter()
    run = asv(repo, conf_path, "run", "--quick", "--show-stderr", "--bench", BENCH, "HASHFILE:last2.txt")
    took = time.perf_counter() - t0
    print(f"asv run --quick over {len(commits)} commits: {took:.0f} s")
    assert run.returncode in (0, 2), run.stdout[-3000:] + run.stderr[-3000:]  # 2: a benchmark failed

    machine_dirs = [d for d in (repo / "results" / "asv").iterdir() if d.is_dir()]
    assert len(machine_dirs) == 1
    by_commit = {}
    for f in machine_dirs[0].glob("*.json"):
        if f.name != "machine.json":
            doc = json.loads(f.read_text())
            by_commit[doc["commit_hash"]] = doc["results"]
    assert set(by_commit) == set(commits)
    speedup = by_commit[commits[0]]["bench_compiled.CompiledSpeedup.track_speedup"][0]
    assert isinstance(speedup[0], float) and speedup[0] > 0, speedup

    pub = asv(repo, conf_path, "publish")
    assert pub.returncode == 0, pub.stderr[-3000:]
    html = repo / "results" / "html"
    assets = tmp_path / "assets"
    vendor = subprocess.run([sys.executable, str(ROOT / "scripts" / "asv_vendor_assets.py"), "--out", str(assets),
                             "--index", str(html / "index.html")], capture_output=True, text=True)  # fmt: skip
    if shutil.which("chromium") is None:
        pytest.skip("no chromium: apt-get install -y chromium")
    shot = tmp_path / "dashboard.png"
    cmd = [sys.executable, str(ROOT / "scripts" / "asv_screenshot.py"), "--html-dir", str(html),
           "--out", str(shot), "--page", "#bench_compiled.CompiledSpeedup.track_speedup"]  # fmt: skip
    if vendor.returncode == 0:
        cmd += ["--assets-dir", str(assets)]
    check = subprocess.run(cmd, capture_output=True, text=True, timeout=300)
    report = json.loads(check.stdout)
    assert check.returncode == 0 and report["rendered"], report
    assert report["plot_canvases"] >= 1 and report["non_background"] > 0.02
