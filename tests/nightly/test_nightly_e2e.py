"""`optimus-bench nightly` end to end: real cells, a real injected slowdown, real exit codes.

The cells are real harness measurements (own subprocess, raw samples) of the harness's
stand-in model in eager mode, one torch thread, so four nights fit in the CI budget. The
slowdown is injected where the harness measures (OPTIMUS_BENCH_INJECT_SLOWDOWN), so the
nightly sees nothing but slower samples. Thresholds are the repository's config file.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
ARGS = ["--provider", "tests.harness.fakes:build", "--models", "towers", "--scale", "small",
        "--modes", "eager", "--phases", "infer", "--threads", "1", "--no-asv", "--no-progress"]  # fmt: skip


def night(store: Path, slowdown: str | None = None) -> subprocess.CompletedProcess[str]:
    env = dict(os.environ, PYTHONPATH=str(ROOT))
    env.pop("OPTIMUS_BENCH_INJECT_SLOWDOWN", None)
    if slowdown is not None:
        env["OPTIMUS_BENCH_INJECT_SLOWDOWN"] = slowdown
    return subprocess.run(
        [sys.executable, "-m", "harness.cli", "nightly", "--store", str(store), *ARGS],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )


def test_nightly_catches_injected_slowdown_and_passes_unchanged_runs(tmp_path: Path) -> None:
    store = tmp_path / "nightly"

    first = night(store)
    assert first.returncode == 0, first.stderr
    assert "BASELINE" in first.stdout

    unchanged = night(store)
    assert unchanged.returncode == 0, unchanged.stdout + unchanged.stderr
    assert "# Nightly PASS" in unchanged.stdout
    assert "**regression**" not in unchanged.stdout

    slowed = night(store, "0.15")
    assert slowed.returncode == 1, slowed.stdout + slowed.stderr
    assert "# Nightly REGRESSION" in slowed.stdout
    latency = [
        line
        for line in slowed.stdout.splitlines()
        if line.startswith("| towers/small/eager/infer | latency_ms")
    ]
    assert len(latency) == 1 and "**regression**" in latency[0], slowed.stdout
    change = float(latency[0].split("|")[5].strip().rstrip("%"))
    # +15% injected; seen +9% to +155% here: on a loaded 2-core machine a longer timed region
    # is preempted more often, so only the direction and the threshold are asserted.
    assert change > 5.0, latency[0]
    assert "| towers/small/eager/infer | 1 | latency_ms |" in slowed.stdout  # re-measured, still slow

    # A red night is never a base: the next unchanged night compares with the last green one.
    after = night(store)
    assert after.returncode == 0, after.stdout + after.stderr
    history = json.loads((store / "history.json").read_text())
    assert [r["status"] for r in history["runs"]] == ["pass", "pass", "regression", "pass"]
    assert history["runs"][3]["base_results"] == history["runs"][1]["results"]
    assert (store / history["runs"][2]["summary"]).read_text().startswith("# Nightly REGRESSION")
