"""`optimus-bench nightly` end to end: real cells, a real injected slowdown, real exit codes.

The night is paired (the default): tonight's checkout is timed side by side with the base
night's commit, and the injected slowdown reaches tonight's workers only. The cells are real harness measurements (own subprocess, raw samples) of the harness's
stand-in model in eager mode, one torch thread, so four nights fit in the CI budget. The
slowdown is injected where the harness measures (OPTIMUS_BENCH_INJECT_SLOWDOWN), so the
nightly sees nothing but slower samples.

Thresholds: the repository's config file with a wider latency gate (200% instead of 5%) and a
10x injected slowdown. Why: nights run seconds apart on a shared 2-core CI machine, and an
unchanged night was seen 66% slower than its base there (0.544 -> 0.903 ms, CI of 05c65f9),
so the 5% gate makes "an unchanged night passes" a coin toss. The gate logic at the real
thresholds is tested on fixed samples in test_nightly_gate.py and test_nightly_logic.py.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
NIGHTLY = [sys.executable, "-m", "harness.cli", "nightly"]
LATENCY_GATE = 2.0  # +200%: far above the machine's night-to-night noise
SLOWDOWN = "9.0"  # every timed step takes 10x as long: +900%, far above the gate
ARGS = ["--provider", "tests.harness.fakes:build", "--models", "towers", "--scale", "small",
        "--modes", "eager", "--phases", "infer", "--threads", "1", "--no-asv", "--no-sharded", "--no-quality", "--no-progress"]  # fmt: skip


def wide_gate_config(tmp_path: Path) -> Path:
    """The repository's nightly config with the latency gate widened to ``LATENCY_GATE``."""
    cfg = json.loads((ROOT / "benchmarks" / "nightly_thresholds.json").read_text())
    cfg["harness"]["latency"] = LATENCY_GATE
    cfg["paired"].update(threshold=LATENCY_GATE, rounds=6, max_rounds=6, steps=3, processes=1, compiles=1,
                         max_processes=1, process_spread=10.0)  # fmt: skip
    path = tmp_path / "nightly_thresholds.json"
    path.write_text(json.dumps(cfg))
    return path


def night(store: Path, slowdown: str | None = None) -> subprocess.CompletedProcess[str]:
    env = dict(os.environ, PYTHONPATH=str(ROOT))
    env.pop("OPTIMUS_BENCH_INJECT_SLOWDOWN", None)
    if slowdown is not None:
        env["OPTIMUS_BENCH_INJECT_SLOWDOWN"] = slowdown
    return subprocess.run(
        [*NIGHTLY, "--store", str(store), "--config", str(wide_gate_config(store.parent)), *ARGS],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
    )


def test_nightly_catches_injected_slowdown_and_passes_unchanged_runs(tmp_path: Path) -> None:
    store = tmp_path / "nightly"

    first = night(store)
    assert first.returncode == 0, first.stderr
    assert "BASELINE" in first.stdout

    unchanged = night(store)
    assert unchanged.returncode == 0, unchanged.stdout + unchanged.stderr
    assert "# Nightly PASS" in unchanged.stdout
    assert "Paired with the base commit" in unchanged.stdout  # the default night is paired
    assert "**regression**" not in unchanged.stdout

    slowed = night(store, SLOWDOWN)
    assert slowed.returncode == 1, slowed.stdout + slowed.stderr
    assert "# Nightly REGRESSION" in slowed.stdout
    latency = [
        line
        for line in slowed.stdout.splitlines()
        if line.startswith("| towers/small/eager/infer | latency_ms")
    ]
    assert len(latency) == 1 and "**regression**" in latency[0], slowed.stdout
    assert "| paired |" in latency[0]  # judged on the interval of the side-by-side rounds
    assert "optimus-bench bisect " in slowed.stdout  # the command that finds the commit
    change = float(latency[0].split("|")[5].strip().rstrip("%"))
    # +900% injected; on a loaded 2-core machine a longer timed region is preempted more often,
    # so only the direction and the gate are asserted.
    assert change > 100 * LATENCY_GATE, latency[0]
    assert "| towers/small/eager/infer | 1 | latency_ms |" in slowed.stdout  # re-measured, still slow

    # A red night is never a base: the next unchanged night compares with the last green one.
    after = night(store)
    assert after.returncode == 0, after.stdout + after.stderr
    history = json.loads((store / "history.json").read_text())
    assert [r["status"] for r in history["runs"]] == ["pass", "pass", "regression", "pass"]
    assert history["runs"][3]["base_results"] == history["runs"][1]["results"]
    assert (store / history["runs"][2]["summary"]).read_text().startswith("# Nightly REGRESSION")
