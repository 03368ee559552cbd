"""``optimus-bench ab --nproc 2``: modes of one sharded model timed inside one 2-rank gloo
torchrun job (harness/run/sharded/ab.py, paired_rank.py); and its document's summary."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from harness import exit_codes
from harness.env import REPO_ROOT
from harness.run.sharded.ab import summarize

pytest.importorskip("torchrec")


def _ab(*extra: str) -> subprocess.CompletedProcess[str]:
    cmd = [sys.executable, "-m", "harness.cli", "ab", "--model", "dcn", "--scale", "tiny", "--phase", "train",
           "--modes", "eager,eager+optimus", "--nproc", "2", "--device", "cpu", *extra]  # fmt: skip
    return subprocess.run(cmd, cwd=REPO_ROOT, capture_output=True, text=True, timeout=600)


def test_two_modes_in_one_sharded_job(tmp_path: Path) -> None:
    out = tmp_path / "ab.json"
    p = _ab("--rounds", "4", "--steps", "2", "--warmup", "1", "--out", str(out))
    assert p.returncode == exit_codes.OK, p.stderr[-2000:]
    doc = json.loads(out.read_text())
    assert doc["config"]["nproc"] == 2 and doc["base"] == "eager"
    eager, opt = doc["modes"]["eager"], doc["modes"]["eager+optimus"]
    assert len(eager["rounds_ms"]) == len(opt["rounds_ms"]) == 4
    lo, hi = opt["speedup_ci95"]
    assert lo <= opt["speedup_vs_base"] <= hi
    assert opt["parity_vs_base"]["ok"]
    # the Optimus side ran under the process group: its members are the autograd leaves
    assert opt["optimus_gradients"].startswith("autograd (a process group of 2 ranks")
    assert "2 ranks in one torchrun job" in p.stdout and "| eager+optimus |" in p.stdout


def test_a_job_past_its_limit_is_one_line_and_incomplete() -> None:
    p = _ab("--rounds", "2", "--steps", "1", "--timeout-s", "1")
    assert p.returncode == exit_codes.INCOMPLETE
    last = p.stderr.strip().splitlines()[-1]
    assert last.startswith("optimus-bench ab: sharded ab of dcn/tiny/train:") and "Traceback" not in p.stderr


@pytest.mark.parametrize(
    "extra, needle",
    [
        (["--processes", "2"], "--processes"),
        (["--nproc", "0"], "--nproc"),
        (["--modes", "eager"], "two or more"),
    ],
)
def test_bad_options_are_one_line_and_bad_input(extra: list[str], needle: str) -> None:
    p = _ab(*extra)
    assert p.returncode == exit_codes.BAD_INPUT, p.stderr[-500:]
    assert needle in p.stderr.strip().splitlines()[-1] and "Traceback" not in p.stderr


def test_summary_is_the_median_per_round_speedup_with_its_interval() -> None:
    sides = [
        {"mode": "eager", "rounds_ms": [10.0, 12.0, 11.0, 30.0], "first_call_s": 0.1},
        {"mode": "eager+optimus", "rounds_ms": [5.0, 6.0, 5.5, 15.0], "first_call_s": 0.2,
         "parity_vs_base": {"ok": True, "max_abs_err": 0.0}},
    ]  # fmt: skip
    cfg = {"rounds": 4, "steps": 1, "warmup": 0, "seed": 0, "threads": 1, "atol": 1e-4, "rtol": 1e-3, "nproc": 2,
           "sharding": "auto"}  # fmt: skip
    plan_doc = {"model": "dcn", "modules": {}, "nproc": 2, "sharding": "auto"}
    doc = summarize("dcn", "tiny", "train", sides, cfg, plan_doc, 1.0)
    row = doc["modes"]["eager+optimus"]
    # every round 2x, whatever the round's load (the fourth round is three times slower)
    assert row["speedup_vs_base"] == pytest.approx(2.0)
    assert row["speedup_ci95"] == pytest.approx((2.0, 2.0))
    assert doc["modes"]["eager"]["median_ms"] == pytest.approx(11.5)
