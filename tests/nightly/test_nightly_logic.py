"""The nightly's decisions without measuring: config validation, reruns, asv table reading.

Seeded synthetic samples stand in for cells, and a scripted ``rerun`` stands in for a fresh
measurement, so each rule (confirm only what every measurement flags; a speedup that drops
is the regression; report-only figures never gate) is checked exactly.
"""

from __future__ import annotations

import copy
import json
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from harness import exit_codes
from harness.gate import compare
from harness.measure import timing
from harness.nightly import job
from harness.spec import CellKey

TH = compare.Thresholds()


def cell(model: str, median_ms: float, seed: int, n: int = 120, mode: str = "eager") -> dict[str, Any]:
    rng = np.random.default_rng(seed)
    samples = [float(v) for v in median_ms * (1 + 0.03 * rng.standard_normal(n))]
    return {
        "model": model,
        "scale": "tiny",
        "mode": mode,
        "phase": "infer",
        "status": "ok",
        "error": None,
        "latency_ms": {"median": float(np.median(samples)), "iqr": 0.0, "samples": samples},
        "peak_mem_bytes": 1_000_000,
        "compile_s": 0.0,
        "optimus_s": None,
        "nodes_before": None,
        "nodes_after": None,
        "max_abs_err": 0.0,
    }


def doc(*cells: dict[str, Any]) -> dict[str, Any]:
    return {"schema": 1, "kind": "optimus-bench-results", "env": {}, "config": {}, "cells": list(cells)}


def scripted(replies: dict[str, list[dict[str, Any]]]) -> Any:
    calls: list[str] = []

    def rerun(key: CellKey) -> dict[str, Any]:
        calls.append(key.label())
        return replies[key.label()].pop(0)

    rerun.calls = calls  # type: ignore[attr-defined]
    return rerun


def test_unchanged_cells_are_not_flagged_and_not_rerun() -> None:
    base, new = doc(cell("a", 1.0, 1), cell("b", 2.0, 2)), doc(cell("a", 1.0, 3), cell("b", 2.0, 4))
    rerun = scripted({})
    out = job.confirm_regressions(base, new, TH, rerun, max_reruns=1)
    assert out.first_flagged == set() and out.confirmed == set()
    assert rerun.calls == []


def test_slowdown_flagged_twice_is_confirmed() -> None:
    base, new = doc(cell("a", 1.0, 1), cell("b", 2.0, 2)), doc(cell("a", 1.15, 3), cell("b", 2.0, 4))
    rerun = scripted({"a/tiny/eager/infer": [cell("a", 1.15, 5)]})
    out = job.confirm_regressions(base, new, TH, rerun, max_reruns=1)
    assert out.confirmed == {("a/tiny/eager/infer", "latency_ms")}
    assert rerun.calls == ["a/tiny/eager/infer"]
    assert [r.verdict for r in out.rows if r.metric == "latency_ms" and r.cell.startswith("a/")] == [
        "regression"
    ]


def test_flag_that_a_rerun_does_not_repeat_is_not_a_regression() -> None:
    base, new = doc(cell("a", 1.0, 1)), doc(cell("a", 1.3, 3))  # a noisy night
    rerun = scripted({"a/tiny/eager/infer": [cell("a", 1.0, 6)]})
    out = job.confirm_regressions(base, new, TH, rerun, max_reruns=1)
    assert out.first_flagged == {("a/tiny/eager/infer", "latency_ms")}
    assert out.confirmed == set()
    assert out.reruns[0].flagged == []
    # the stored cell is the re-measurement
    assert abs(new["cells"][0]["latency_ms"]["median"] - 1.0) < 0.05


def test_metric_must_be_flagged_by_every_measurement() -> None:
    base = doc(cell("a", 1.0, 1))
    slow = cell("a", 1.2, 2)
    slow_mem = copy.deepcopy(cell("a", 1.0, 3))
    slow_mem["peak_mem_bytes"] = 2_000_000  # the rerun flags memory, not latency
    rerun = scripted({"a/tiny/eager/infer": [slow_mem]})
    out = job.confirm_regressions(base, doc(slow), TH, rerun, max_reruns=1)
    assert out.confirmed == set()
    assert {r.verdict for r in out.rows if r.metric == "peak_mem_bytes"} == {"not confirmed"}


def test_no_reruns_means_first_flag_counts() -> None:
    rerun = scripted({})
    out = job.confirm_regressions(doc(cell("a", 1.0, 1)), doc(cell("a", 1.2, 2)), TH, rerun, 0)
    assert out.confirmed == {("a/tiny/eager/infer", "latency_ms")}


def test_failed_cell_is_a_regression_after_rerun() -> None:
    broken = cell("a", 1.0, 2)
    broken.update(status="failed", error="RuntimeError: boom", latency_ms=None)
    rerun = scripted({"a/tiny/eager/infer": [copy.deepcopy(broken)]})
    out = job.confirm_regressions(doc(cell("a", 1.0, 1)), doc(broken), TH, rerun, 1)
    assert out.confirmed == {("a/tiny/eager/infer", "status")}


def test_config_file_in_repo_loads() -> None:
    cfg = job.load_config()
    assert cfg.thresholds.latency > 0 and cfg.max_reruns >= 1
    assert "track_speedup" in cfg.higher_is_better


@pytest.mark.parametrize(
    ("patch", "message"),
    [
        ({"harness": {"latency": -1}}, "cfg.json: harness.latency: threshold must be a finite number >= 0"),
        ({"harness": {"latency": float("nan")}}, "cfg.json: harness.latency: threshold must be a finite"),
        ({"harness": {"alpha": "0.01"}}, "cfg.json: harness.alpha: threshold must be a finite number"),
        ({"asv": {"factor": "big"}}, "cfg.json: asv.factor must be >= 1.0"),
        ({"asv": {"factor": float("inf")}}, "cfg.json: asv.factor must be >= 1.0"),
        ({"harness": {"latncy": 0.1}}, "unknown field(s) ['latncy']"),
        ({"asv": {"factor": 0.9}}, "asv.factor must be >= 1.0"),
        ({"rerun": {"max_reruns": -1}}, "rerun.max_reruns must be an integer >= 0"),
        ({"suite": {"model": ["x"]}}, "suite: unknown field(s) ['model']"),
        ({"extra": 1}, "unknown field(s) ['extra']"),
    ],
)
def test_bad_config_names_the_field(tmp_path: Path, patch: dict[str, Any], message: str) -> None:
    cfg = json.loads(job.DEFAULT_CONFIG.read_text())
    for k, v in patch.items():
        if isinstance(v, dict) and isinstance(cfg.get(k), dict):
            cfg[k].update(v)
        else:
            cfg[k] = v
    p = tmp_path / "cfg.json"
    p.write_text(json.dumps(cfg))
    with pytest.raises(ValueError) as e:
        job.load_config(p)
    assert message in str(e.value)


def test_cell_params_of_asv_names() -> None:
    assert job.cell_params("b.C.track_speedup('towers', 'tiny', 'infer')") == ("towers", "tiny", "infer")
    assert job.cell_params("b.C.time_optimize(64)") == ("64",)
    assert job.cell_params("b.C.time_x") is None


@pytest.mark.parametrize("raw", ["abc", "-0.1", "nan", "inf"])
def test_injected_slowdown_rejects_bad_values(monkeypatch: pytest.MonkeyPatch, raw: str) -> None:
    monkeypatch.setenv(timing.INJECT_SLOWDOWN_ENV, raw)
    with pytest.raises(ValueError, match="OPTIMUS_BENCH_INJECT_SLOWDOWN"):
        timing.injected_slowdown()


def test_injected_slowdown_lengthens_each_sample(monkeypatch: pytest.MonkeyPatch) -> None:
    """On a fake clock (every read advances 1 us; a step advances 2 ms) the sample is exact."""
    clock = [0.0]

    def perf_counter() -> float:
        clock[0] += 1e-6
        return clock[0]

    def step() -> None:
        clock[0] += 2e-3

    monkeypatch.setattr(timing.time, "perf_counter", perf_counter)
    monkeypatch.delenv(timing.INJECT_SLOWDOWN_ENV, raising=False)
    plain = timing.time_iterations(step, warmup=1, min_iters=20, max_iters=20, budget_s=0)
    monkeypatch.setenv(timing.INJECT_SLOWDOWN_ENV, "0.15")
    slowed = timing.time_iterations(step, warmup=1, min_iters=20, max_iters=20, budget_s=0)
    assert np.median(plain) == pytest.approx(2.0, rel=0.01)
    assert np.median(slowed) / np.median(plain) == pytest.approx(1.15, rel=0.01)


def test_publish_config_lists_only_existing_branches_plus_the_current_one(tmp_path: Path) -> None:
    import shutil
    import subprocess

    def git(*args: str) -> None:
        subprocess.run(["git", "-c", "user.email=t@t", "-c", "user.name=t", *args], cwd=tmp_path,
                       check=True, capture_output=True)  # fmt: skip

    shutil.copy(job.REPO_ROOT / "asv.conf.json", tmp_path / "asv.conf.json")
    git("init", "-q", "-b", "feature")
    git("add", "asv.conf.json")
    git("commit", "-q", "-m", "c")
    conf = tmp_path / "asv.conf.json"
    out = job.asv_config_for_branch(conf, "feature", tmp_path / "tmp")
    doc = json.loads(out.read_text())
    assert doc["branches"] == ["feature"]  # main does not exist here: asv publish would fail on it
    assert doc["results_dir"] == str(tmp_path / "results" / "asv") and doc["repo"] == str(tmp_path)
    git("branch", "main")
    doc = json.loads(job.asv_config_for_branch(conf, "feature", tmp_path / "tmp").read_text())
    assert doc["branches"] == ["main", "feature"]
    assert job.asv_config_for_branch(conf, "main", tmp_path / "tmp") == conf


def test_asv_failure_records_an_error_night_that_is_never_a_base(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    from harness import cli
    from harness.run import runner
    from harness.store import results

    def fake_suite(cfg: Any, out: Any, **kw: Any) -> dict[str, Any]:
        d = {**doc(cell("towers", 1.0, 1, mode="eager")), "config": cfg.as_dict()}
        results.save_atomic(out, d)
        return d

    def broken_asv(*args: Any, **kw: Any) -> Any:
        raise RuntimeError("asv run failed (exit 1): build error")

    monkeypatch.setattr(runner, "run_suite", fake_suite)
    monkeypatch.setattr(job, "git_info", lambda: {"sha": "a" * 40, "dirty": False, "branch": "main"})
    monkeypatch.setattr(job, "_asv_part", broken_asv)
    argv = [
        "nightly",
        "--store",
        str(tmp_path),
        "--models",
        "towers",
        "--modes",
        "eager",
        "--phases",
        "infer",
        "--no-quality",
    ]
    assert cli.main(argv) == exit_codes.TOOL_FAILED  # not BAD_INPUT: the input was fine
    assert "**asv part failed**: asv run failed (exit 1): build error" in capsys.readouterr().out
    history = json.loads((tmp_path / "history.json").read_text())
    assert [r["status"] for r in history["runs"]] == ["error"]
    assert job.last_good(history, tmp_path) is None
