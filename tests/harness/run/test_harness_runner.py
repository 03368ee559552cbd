"""Cells in subprocesses: crashes, hangs and errors are recorded while the others finish;
a killed run resumes without redoing finished cells; parity failures are marked."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from harness.env import REPO_ROOT
from harness.modes import builtin, mode_registry
from harness.run.runner import run_suite
from harness.spec import RunConfig
from harness.store import results
from tests.harness import synthetic

FAKES = "tests.harness.fakes:build"
QUICK = {"warmup": 1, "min_iters": 3, "max_iters": 5, "budget_s": 0.05, "provider": FAKES}


def _statuses(doc: dict) -> dict[tuple[str, str, str], str]:
    return {(c["model"], c["mode"], c["phase"]): c["status"] for c in doc["cells"]}


def test_crash_hang_and_error_are_recorded_while_others_finish(tmp_path: Path) -> None:
    cfg = RunConfig(models=["crash", "mlp", "hang", "error"], modes=["eager"], phases=["infer"],
                    timeout_s=20.0, **QUICK).validate()  # fmt: skip
    out = tmp_path / "r.json"
    doc = run_suite(cfg, out, progress=False)
    assert _statuses(doc) == {
        ("crash", "eager", "infer"): "failed",
        ("mlp", "eager", "infer"): "ok",
        ("hang", "eager", "infer"): "timeout",
        ("error", "eager", "infer"): "failed",
    }
    cells = {c["model"]: c for c in doc["cells"]}
    assert "crashed (killed by signal 6)" in cells["crash"]["error"]
    assert "did not finish within 20 s" in cells["hang"]["error"]
    assert cells["error"]["error"] == "RuntimeError: deliberate error while building the model"
    assert cells["mlp"]["latency_ms"]["n"] >= 3 and cells["mlp"]["peak_mem_bytes"] > 0
    assert results.load(out) == doc  # what is on disk is what was returned


def test_resume_after_killed_run_does_not_redo_cells(tmp_path: Path) -> None:
    out, log = tmp_path / "r.json", tmp_path / "builds.log"
    cmd = [sys.executable, "-m", "harness.cli", "run", "--provider", FAKES, "--models", "mlp,towers,wrong",
           "--modes", "eager", "--phases", "infer", "--warmup", "1", "--min-iters", "3",
           "--max-iters", "5", "--budget-s", "0.05", "--no-progress", "--out", str(out)]  # fmt: skip
    env = {**os.environ, "PYTHONPATH": str(REPO_ROOT), "FAKES_BUILD_LOG": str(log)}
    proc = subprocess.Popen(cmd, env=env, cwd=REPO_ROOT, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    deadline = time.time() + 120
    while time.time() < deadline:
        if out.exists() and len(results.load(out)["cells"]) >= 1:
            break
        time.sleep(0.1)
    proc.send_signal(signal.SIGKILL)  # kill -9: no cleanup runs in the parent
    proc.wait()
    before = {c["model"]: c["finished_at"] for c in results.load(out)["cells"]}
    assert 1 <= len(before) < 3, "killed mid-run"
    resumed = subprocess.Popen(
        [*cmd, "--resume"], env=env, cwd=REPO_ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE
    )
    _, err = resumed.communicate(timeout=120)
    assert resumed.returncode == 0, err
    doc = results.load(out)
    after = {c["model"]: c["finished_at"] for c in doc["cells"]}
    assert set(after) == {"mlp", "towers", "wrong"}
    assert all(after[k] == v for k, v in before.items()), "finished cells were not rerun"
    builds = [line.split() for line in log.read_text().splitlines()]
    assert sum(int(pid) == resumed.pid for _, pid in builds) == 3 - len(before), builds
    assert all(c["status"] == "ok" for c in doc["cells"])


def test_resume_refuses_a_different_configuration(tmp_path: Path) -> None:
    out = tmp_path / "r.json"
    doc = results.new_results({}, RunConfig(models=["mlp"], **QUICK).validate().as_dict())
    results.save_atomic(out, doc)
    cfg = RunConfig(models=["mlp"], **{**QUICK, "scale": "small"}).validate()
    with pytest.raises(
        ValueError, match=r"--resume: .* different configuration \(scale: 'tiny' in file vs 'small' now\)"
    ):
        run_suite(cfg, out, resume=True, progress=False)


def test_missing_optimus_is_a_clear_error(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "optimus", None)
    with pytest.raises(RuntimeError, match="needs the optimus package, which is not importable"):
        mode_registry.prepare("eager+optimus", None, ())


def test_peer_options_cover_every_inductor_pre_grad_pass() -> None:
    from torch._inductor.fx_passes import group_batch_fusion, split_cat

    opts = builtin.peer_fusion_options()
    assert set(opts) == set(group_batch_fusion.PRE_GRAD_FUSIONS) | set(split_cat.PRE_GRAD_PATTERNS)
    assert "batch_linear" in opts and all(v == {} for v in opts.values())


def test_parity_failure_is_marked_mismatch_and_gradients_are_matched(tmp_path: Path) -> None:
    """eager+optimus (no Inductor, so cheap): a faithful model passes forward and gradient
    parity with every parameter matched; the ``wrong`` stand-in adds 1 whenever it is traced
    by Dynamo (as optimus.optimize captures it), and is marked mismatch, never timed as a win."""
    pytest.importorskip("optimus")
    cfg = RunConfig(models=["mlp", "wrong"], modes=["eager+optimus"], phases=["train"], **QUICK).validate()
    doc = run_suite(cfg, tmp_path / "r.json", progress=False)
    cells = {c["model"]: c for c in doc["cells"]}
    ok, bad = cells["mlp"], cells["wrong"]
    assert ok["status"] == "ok", ok["error"]
    assert ok["parity"]["grads_compared"] == ok["parity"]["grads_total"] > 0
    assert ok["max_abs_err"] < 1e-4 and ok["optimus_s"] is not None
    assert bad["status"] == "mismatch"
    assert "outputs differ from eager" in bad["error"] and "gradients differ" in bad["error"]


@pytest.mark.slow
@pytest.mark.compile
def test_compiled_train_cell_checks_parity(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The same through Inductor, training (two compiles, so not in CI)."""
    monkeypatch.setenv("TORCHINDUCTOR_COMPILE_THREADS", "1")  # no compile worker pool per cell
    cfg = RunConfig(
        models=["mlp", "wrong"], modes=["compile"], phases=["train"], timeout_s=600.0, **QUICK
    ).validate()
    doc = run_suite(cfg, tmp_path / "r.json", progress=False)
    cells = {c["model"]: c for c in doc["cells"]}
    ok, bad = cells["mlp"], cells["wrong"]
    assert ok["status"] == "ok", ok["error"]
    assert ok["parity"]["grads_compared"] == ok["parity"]["grads_total"] > 0
    assert ok["max_abs_err"] < 1e-4 and ok["compile_s"] > 0 and ok["recompiles"] == 0
    assert bad["status"] == "mismatch"
    assert "outputs differ from eager" in bad["error"] and "gradients differ" in bad["error"]


def test_retry_failed_reruns_only_failed_cells(tmp_path: Path) -> None:
    out = tmp_path / "r.json"
    cfg = RunConfig(models=["mlp", "towers"], modes=["eager"], phases=["infer"], **QUICK).validate()
    doc = results.new_results({}, cfg.as_dict())
    failed = {**synthetic.cell("mlp", "eager", "infer", 1.0, seed=0, status="failed"), "latency_ms": None}
    kept = {**synthetic.cell("towers", "eager", "infer", 1.0, seed=1), "finished_at": 123.0}
    doc["cells"] = [failed, kept]
    results.save_atomic(out, doc)
    new = run_suite(cfg, out, resume=True, retry_failed=True, progress=False)
    cells = {c["model"]: c for c in new["cells"]}
    assert cells["mlp"]["status"] == "ok" and cells["mlp"]["error"] is None
    assert cells["towers"]["finished_at"] == 123.0  # the ok cell was kept, not rerun


def test_run_measures_peaks_once_and_every_cell_records_its_floor(tmp_path: Path) -> None:
    cfg = RunConfig(models=["mlp"], modes=["eager"], phases=["infer", "train"], timeout_s=60.0,
                    **QUICK).validate()  # fmt: skip
    doc = run_suite(cfg, tmp_path / "r.json", progress=False)
    peaks = doc["env"]["peaks"]
    assert peaks["threads"] == 1 and peaks["gemm_flops_per_s"] > 0 and peaks["bandwidth_bytes_per_s"] > 0
    floors = {c["phase"]: c["floor"] for c in doc["cells"]}
    assert floors["train"]["flops"] > floors["infer"]["flops"] > 0  # backward's matmuls
    assert floors["train"]["grad_bytes"] > 0 and floors["infer"]["grad_bytes"] == 0
    for c in doc["cells"]:
        assert c["of_floor"] == c["floor_ms"] / c["latency_ms"]["median"]
        assert 0 < c["of_floor"] <= 1.0
