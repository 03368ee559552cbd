"""Sharded training-quality cells (``run --quality STEPS --nproc 2``): real 2-rank gloo jobs on
CPU, dcn tiny with its tables split table-wise, 20 steps against the single-process reference.

About 20-25 s a job on a 2-core machine: one clean cell (eager+optimus, whose re-laid-out
parameters DDP must reduce member by member) and one with a rank that drifted after one step."""

from __future__ import annotations

from pathlib import Path

import pytest

from harness.gate import compare
from harness.measure import quality
from harness.report.markdown import render
from harness.run.runner import run_suite
from harness.run.sharded import faults
from harness.run.sharded import plan as planmod
from harness.spec import RunConfig
from harness.store import results

pytest.importorskip("torchrec")

STEPS = 20


def _run(tmp_path: Path, mode: str, name: str) -> dict:
    cfg = RunConfig(models=["dcn"], scale="tiny", modes=[mode], phases=["train"], nproc=2, sharding="table_wise",
                    quality_steps=STEPS, quality_seeds=1, quality_every=5, quality_heldout=8, optimus_guard="off",
                    timeout_s=240.0, pg_timeout_s=60.0).validate()  # fmt: skip
    out = tmp_path / name
    run_suite(cfg, out, progress=False)
    return results.load(out)  # the merged file passes the ordinary validation


def test_a_sharded_quality_cell_trains_like_the_single_process_reference(tmp_path: Path) -> None:
    doc = _run(tmp_path, "eager+optimus", "q.json")
    c = doc["cells"][0]
    assert c["status"] == "ok", c.get("error")
    assert c["nproc"] == 2 and c["plan_summary"] == "table_wise x4"
    assert c["optimus_gradients"].startswith("autograd (a process group of 2 ranks")
    q = c["quality"]
    assert q["verdict"] == "ok" and q["within_curve"] is True and q["seeds_run"] == 1
    assert 0 < q["loss_rel_diff"] <= quality.CURVE_RTOL  # rounding (another summation order), not nothing
    (seed,) = q["seeds"]
    assert seed["loss_check"]["first_off"] is None
    assert [p[0] for p in seed["curve"]] == [5.0, 10.0, 15.0, 20.0] == [p[0] for p in seed["eager_curve"]]
    assert seed["curve"][-1][1] < seed["curve"][0][1]  # it trained
    assert q["auc_diff"] <= quality.AUC_TOL and q["drift_rel"] <= quality.DRIFT_RTOL
    assert q["auc"] > q["eager_auc_start"]
    assert c["parity"]["outputs_compared"] == 2 and c["parity"]["max_out_err"] <= 1e-4
    assert len(c["ranks"]) == 2 and all(len(r["latency_ms"]["samples"]) == STEPS - 1 for r in c["ranks"])
    md = render(doc, "q", [])
    assert "## Training quality" in md and "| dcn/tiny | eager+optimus |" in md


def test_a_rank_that_drifted_after_one_step_is_a_quality_mismatch(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Rank 1's dense weights move by 1.6e-3 after the first step (the first step's outputs still
    match): the loss curve leaves the reference at step 2, and the cell says so in one line."""
    monkeypatch.setenv(planmod.FAULT_ENV, "drift:rank1:step1")
    doc = _run(tmp_path, "eager", "drift.json")
    c = doc["cells"][0]
    assert c["status"] == "quality_mismatch"
    assert c["error"].startswith("rank 0: quality differs from the single-process reference: seed 0: "
                                 "training loss at step 2 is ")  # fmt: skip
    assert "\n" not in c["error"]
    q = c["quality"]
    assert q["within_curve"] is False and q["loss_rel_diff"] > quality.CURVE_RTOL
    assert q["seeds"][0]["loss_check"]["first_off"]["step"] == 2
    assert c["parity"]["max_out_err"] <= 1e-4  # not a parity mismatch: the first step matched
    assert faults.DRIFT == 1.6e-3
    assert compare.exit_code(compare.compare_docs(doc, doc)) == 3  # lost data for the gate


def test_a_sharded_quality_run_validates_and_still_trains_only() -> None:
    cfg = RunConfig(models=["dcn"], nproc=2, quality_steps=5, phases=["train"]).validate()
    assert cfg.nproc == 2 and cfg.quality_steps == 5
    with pytest.raises(ValueError, match="phases: a quality run trains"):
        RunConfig(models=["dcn"], nproc=2, quality_steps=5, phases=["infer"]).validate()
