"""scripts/ab_grad_reuse.py: both variants build, match, and are timed side by side (tiny, eager)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def run(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, str(ROOT / "scripts" / "ab_grad_reuse.py"), *args],
        capture_output=True,
        text=True,
        timeout=600,
        cwd=ROOT,
    )


def test_times_reuse_against_no_reuse_in_one_process() -> None:
    proc = run(
        "--model", "towers", "--scale", "tiny", "--mode", "eager+optimus", "--rounds", "3", "--steps", "1"
    )
    assert proc.returncode == 0, proc.stderr[-2000:]
    doc = json.loads(proc.stdout[proc.stdout.index("{") :])
    assert doc["max_abs_diff"] <= 1e-5
    assert set(doc["modes"]) == {"reuse", "no-reuse"}
    assert len(doc["modes"]["reuse"]["rounds_ms"]) == 3
    assert doc["modes"]["reuse"]["speedup_vs_base"] > 0


def test_rejects_a_mode_without_optimus() -> None:
    proc = run("--mode", "compile")
    assert proc.returncode == 2
    assert "invalid choice" in proc.stderr
