"""The CLI end to end on the real models at tiny scale: two models, every mode, one phase.

Kept short (minimal iterations; infer only: the train path is covered with one compiled
cell in test_harness_runner.py); the Inductor compiles make it the most expensive test.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from harness import cli
from harness.env import REPO_ROOT
from harness.spec import MODES
from harness.store import results

models = pytest.importorskip("models")


def _cli(*args: str, timeout: float = 900) -> subprocess.CompletedProcess[str]:
    # One compile thread: no worker pool to start per cell (tests check the harness, not figures).
    env = {**os.environ, "PYTHONPATH": str(REPO_ROOT), "TORCHINDUCTOR_COMPILE_THREADS": "1"}
    return subprocess.run([sys.executable, "-m", "harness.cli", *args], env=env, cwd=REPO_ROOT,
                          capture_output=True, text=True, timeout=timeout)  # fmt: skip


def test_list_and_models(capsys: pytest.CaptureFixture[str]) -> None:
    assert cli.main(["list"]) == 0
    out = capsys.readouterr().out
    assert "models: dlrm, dcn, towers, mmoe" in out
    assert "modes:  eager, eager+optimus, compile, compile+peer, compile+optimus" in out
    assert "rules:  " in out and "unavailable" not in out
    assert cli.main(["models", "--scales", "tiny"]) == 0
    assert capsys.readouterr().out.count("| tiny |") == len(models.FAMILIES)
    assert cli.main(["run", "--models", "towers,nope"]) == 2
    assert "models: unknown 'nope'; allowed values: dlrm, dcn, towers, mmoe" in capsys.readouterr().err


@pytest.mark.compile
def test_run_report_compare_end_to_end(tmp_path: Path) -> None:
    """Every mode on one real model (towers; dlrm's compiled cells doubled CI's longest test, 410 s
    under load, and torchrec models run end to end in test_provider.py)."""
    out = tmp_path / "run.json"
    run = _cli("run", "--models", "towers", "--scale", "tiny", "--modes", ",".join(MODES), "--phases", "infer",
               "--warmup", "1", "--min-iters", "3", "--max-iters", "5", "--budget-s", "0.05", "--out", str(out))  # fmt: skip
    assert run.returncode == 0, run.stderr[-3000:]
    assert "cells [" in run.stderr  # the progress bar: done/total, elapsed<remaining
    doc = results.load(out)
    assert len(doc["cells"]) == len(MODES)
    bad = [(c["model"], c["mode"], c["status"], c["error"]) for c in doc["cells"] if c["status"] != "ok"]
    assert not bad, bad
    env = doc["env"]
    assert len(env["git"]["sha"]) == 40 and isinstance(env["git"]["dirty"], bool)
    assert env["versions"]["torch"].startswith("2.13.0") and env["versions"]["torchrec"] and env["cpu"]
    assert "batch_linear" in doc["config"]["peer_options"]
    by_mode = {(c["model"], c["mode"]): c for c in doc["cells"]}
    for model in ("towers",):
        opt = by_mode[(model, "compile+optimus")]
        assert opt["optimus_s"] is not None and opt["optimus_s"] > 0 and opt["nodes_before"] > 0
        assert opt["compile_s"] > opt["optimus_s"]
        eo = by_mode[(model, "eager+optimus")]
        assert eo["nodes_before"] > 0 and eo["nodes_after"] > 0 and eo["optimus_s"] is not None  # recorded
        for mode in ("compile", "compile+peer", "compile+optimus"):
            c = by_mode[(model, mode)]
            assert c["recompiles"] == 0 and c["graphs"] == 1 and c["max_abs_err"] < 1e-4
            assert c["peak_mem_bytes"] > c["peak_mem_static_bytes"] > 0

    rep = _cli("report", str(out), "--out-dir", str(tmp_path / "rep"))
    assert rep.returncode == 0, rep.stderr
    md = (tmp_path / "rep" / "run.md").read_text()
    assert "speedup vs compile" in md and "| towers | tiny | infer |" in md
    assert len(list((tmp_path / "rep").glob("run_*.png"))) == 6
    assert (tmp_path / "rep" / "run_floor.png").exists()  # every cell carries its roofline floor

    same = _cli("compare", str(out), str(out))
    assert same.returncode == 0, same.stdout
    slower = json.loads(out.read_text())
    for c in slower["cells"]:
        c["latency_ms"]["samples"] = [s * 1.5 for s in c["latency_ms"]["samples"]] * 4
        c["latency_ms"]["median"] *= 1.5
    (tmp_path / "slower.json").write_text(json.dumps(slower))
    base = json.loads(out.read_text())
    for c in base["cells"]:
        c["latency_ms"]["samples"] = c["latency_ms"]["samples"] * 4
    (tmp_path / "base.json").write_text(json.dumps(base))
    reg = _cli("compare", str(tmp_path / "base.json"), str(tmp_path / "slower.json"))
    assert reg.returncode == 1 and "**regression**" in reg.stdout


def test_reproduce_writes_table_report_and_plots(tmp_path: Path) -> None:
    """The reproduce command's plumbing (suite -> paper table -> report), on stand-in models
    and eager modes only, so no compile is paid here (the compiled path is tested above)."""
    out = _cli("reproduce", "--provider", "tests.harness.fakes:build", "--models", "mlp,towers", "--modes",
               "eager", "--phases", "infer", "--warmup", "1", "--min-iters", "3", "--max-iters", "5",
               "--budget-s", "0.05", "--out", str(tmp_path / "repro.json"), "--out-dir", str(tmp_path))  # fmt: skip
    assert out.returncode == 0, out.stderr[-2000:]
    assert "| model | scale | phase | compile ms |" in out.stdout and "up to 63% faster" in out.stdout
    assert "reproduce took" in out.stdout
    assert (tmp_path / "repro.md").exists() and len(list(tmp_path.glob("repro_*.png"))) == 4
    assert (tmp_path / "repro_floor.png").exists()
    beside = "## Beside the committed reference runs"  # the paper-scale figures next to this tiny run
    assert beside in out.stdout and beside in (tmp_path / "repro.md").read_text()
    assert "### `results/large/reproduce-large.json`: scale large, commit " in out.stdout
    assert "- dashboard summary, train, compile+optimus vs compile: pass rate " in out.stdout


def test_reproduce_runs_a_reference_model_beside_ours(tmp_path: Path) -> None:
    """`--reference mlperf_dlrmv2`: MLPerf's DLRMv2 at its own scale (cpu), in reproduce's modes and
    phases (here one eager cell, so no compile is paid), into its own file and report, and its rows
    in ours."""
    out = _cli("reproduce", "--provider", "tests.harness.fakes:build", "--models", "mlp", "--modes", "eager",
               "--phases", "infer", "--warmup", "1", "--min-iters", "2", "--max-iters", "3", "--budget-s", "0.05",
               "--reference", "mlperf_dlrmv2", "--out", str(tmp_path / "repro.json"), "--out-dir", str(tmp_path))  # fmt: skip
    assert out.returncode == 0, out.stderr[-2000:]
    ref = results.load(tmp_path / "repro-mlperf_dlrmv2.json")
    [cell] = ref["cells"]
    assert (cell["model"], cell["scale"], cell["mode"], cell["phase"], cell["status"]) == (
        "mlperf_dlrmv2", "cpu", "eager", "infer", "ok"
    )  # fmt: skip
    assert (
        cell["meta"]["row_cap"] == 100_000
        and ref["config"]["provider"] == "harness.providers.mlperf_dlrmv2:build"
    )
    assert {c["model"] for c in results.load(tmp_path / "repro.json")["cells"]} == {"mlp"}
    section = "## Reference model: mlperf_dlrmv2, scale cpu"
    assert section in out.stdout and section in (tmp_path / "repro.md").read_text()
    assert "`repro-mlperf_dlrmv2.md`" in out.stdout and (tmp_path / "repro-mlperf_dlrmv2.md").exists()
    assert "| mlperf_dlrmv2 | cpu | infer |" in out.stdout
