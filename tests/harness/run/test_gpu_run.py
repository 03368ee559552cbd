"""scripts/gpu-run, the prepared GPU run, on this CPU machine: its dry run (``--device cpu``) goes
the whole way (harness run of the dense-only provider, results file, report, log) at a tiny size
with torchrec and fbgemm unimportable, as on the GPU machine; every way it refuses is one line
with the harness's exit codes."""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

import pytest
import torch

from harness import exit_codes
from harness.store import results

ROOT = Path(__file__).resolve().parents[3]
SCRIPT = ROOT / "scripts" / "gpu-run"
BLOCKED = ROOT / "tests" / "blocked_imports"


def _gpu_run(*args: str, timeout: float = 150) -> subprocess.CompletedProcess[str]:
    """The script as the GPU machine runs it: torchrec and fbgemm_gpu cannot be imported
    (tests/blocked_imports first on the path, for the harness's cell processes too)."""
    env = {k: v for k, v in os.environ.items() if k != "OUT"}
    env["PYTHONPATH"] = os.pathsep.join([str(BLOCKED), *filter(None, [env.get("PYTHONPATH")])])
    return subprocess.run(
        ["bash", str(SCRIPT), *args], cwd=ROOT, env=env, capture_output=True, text=True, timeout=timeout
    )


def test_cpu_dry_run_writes_a_results_file_its_report_and_a_log(tmp_path: Path) -> None:
    out = tmp_path / "gpu"
    run = _gpu_run(str(out), "--device", "cpu", "--", "--models", "towers", "--modes", "eager,eager+optimus",
                   "--phases", "infer,train", "--min-iters", "3", "--max-iters", "5", "--budget-s", "0.05")  # fmt: skip
    assert run.returncode == 0, run.stderr[-3000:]
    doc = results.load(out / "gpu-run.json")
    assert doc["config"]["provider"] == "models.dense_only:build"
    assert doc["config"]["device"] == "cpu" and doc["config"]["scale"] == "tiny"
    assert doc["config"]["timeout_s"] == 120  # the script's own settings reached the harness
    cells = {(c["mode"], c["phase"]): c for c in doc["cells"]}
    assert set(cells) == {(m, p) for m in ("eager", "eager+optimus") for p in ("infer", "train")}
    for key, c in cells.items():
        assert c["status"] == "ok", (key, c["error"])
        assert c["meta"]["provider"] == "dense_only" and 3 <= c["latency_ms"]["n"] <= 5, key
    assert cells["eager+optimus", "infer"]["nodes_before"] > 0
    report = (out / "gpu-run.md").read_text()
    assert "towers" in report and "eager+optimus" in report
    log = (out / "gpu-run.log").read_text()
    assert "4/4 cells [" in log and "towers/tiny/eager+optimus/train: ok" in log  # one line per cell
    assert "\r" not in log  # no progress-bar redraws in a log
    assert "gpu-run: sharded NCCL cell skipped: --device cpu: the 2-rank NCCL cell runs on CUDA only" in log
    grouped = json.loads((out / "grouped-linear.json").read_text())  # the grouped-linear report, one small G
    assert grouped["complete"] and grouped["config"]["groups"] == [2]
    assert any(r["variant"] == "foreach_mm" and r.get("median_ms", 0) > 0 for r in grouped["rows"])
    assert "exit 0" in run.stdout.splitlines()[-1]


@pytest.mark.skipif(torch.cuda.is_available(), reason="this host has CUDA")
def test_without_cuda_it_is_refused_with_one_line(tmp_path: Path) -> None:
    out = tmp_path / "gpu"
    run = _gpu_run(str(out), timeout=60)
    assert run.returncode == exit_codes.BAD_INPUT
    lines = run.stderr.strip().splitlines()
    assert len(lines) == 1 and "device: 'cuda' requested" in lines[0] and "--device cpu" in lines[0]
    assert not (out / "gpu-run.json").exists()


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (("--device", "tpu"), "--device: unknown 'tpu'"),
        (("--limit-s", "0"), "--limit-s: must be a whole number"),
        (("--limit-s", "nan"), "--limit-s: must be a whole number"),
        (("--grouped-limit-s", "-1"), "--grouped-limit-s: must be a whole number"),
        (("--fast",), "unknown option --fast"),
        ((), "no output folder"),
    ],
)
def test_bad_options_are_one_line(tmp_path: Path, args: tuple[str, ...], message: str) -> None:
    folder = () if args == () else (str(tmp_path / "gpu"),)
    run = _gpu_run(*folder, *args, timeout=30)
    assert run.returncode == exit_codes.BAD_INPUT
    lines = run.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("gpu-run: error: ") and message in lines[0], lines


def test_the_time_limit_stops_the_run_and_says_so(tmp_path: Path) -> None:
    run = _gpu_run(str(tmp_path / "gpu"), "--device", "cpu", "--limit-s", "2", timeout=60)
    assert run.returncode == exit_codes.INCOMPLETE, run.stderr[-2000:]
    assert "gpu-run: stopped at the time limit (2 s)" in run.stderr


def test_defaults_cover_every_family_in_the_pair_that_fits(tmp_path: Path) -> None:
    """The command the script builds, read through a stand-in interpreter that records its
    arguments: every family of the registry, compile against compile+optimus in inference (the
    8 cells that fit the lent machine's budget; a cell costs about 33 s there), and options after
    ``--`` still win over those defaults."""
    import models
    from harness import cli
    from harness.modes import mode_registry

    argv_file = tmp_path / "argv"
    fake = tmp_path / "python"
    fake.write_text(f'#!/usr/bin/env bash\nprintf "%s\\n" "$@" --END-- >> {argv_file}\n')
    fake.chmod(0o755)
    env = {**os.environ, "PYTHON": str(fake), "OUT": str(tmp_path / "out")}
    run = subprocess.run(["bash", str(SCRIPT)], cwd=ROOT, env=env, capture_output=True, text=True, timeout=30)
    assert run.returncode == 0, run.stderr
    calls = [c.strip("\n").splitlines() for c in argv_file.read_text().split("--END--\n") if c.strip()]
    argv = calls[0]
    assert argv[:3] == ["-m", "harness.cli", "run"]  # no results file: no report afterwards
    args = cli.build_parser().parse_args(argv[2:])
    assert args.provider == "models.dense_only:build" and args.device == "cuda" and args.scale == "tiny"
    assert sorted(args.models.split(",")) == sorted(models.FAMILIES)
    assert args.modes.split(",") == ["compile", "compile+optimus"] and args.phases == "infer"
    assert set(args.modes.split(",")) <= set(mode_registry.names())
    assert args.out == str(tmp_path / "out" / "gpu-run.json")
    # then the grouped-linear report on CUDA at every G, under its own limit
    assert calls[1] == ["-m", "benchmarks.grouped_linear_report", str(tmp_path / "out" / "grouped-linear.json"),
                        "--device", "cuda", "--limit-s", "40"]  # fmt: skip
    # then the sharded check (python - cuda), which the stand-in passes, so the 2-rank NCCL run follows
    assert calls[2] == ["-", "cuda"] and len(calls) == 4
    sharded = cli.build_parser().parse_args(calls[3][2:])
    assert sharded.nproc == 2 and sharded.device == "cuda" and sharded.phases == "train"
    assert sharded.out == str(tmp_path / "out" / "gpu-run-sharded.json")
