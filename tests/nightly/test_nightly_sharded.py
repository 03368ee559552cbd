"""The nightly's sharded suite: its own results file, compared with the base night's, reruns
through ``run_sharded``, and a failed sharded cell keeps the night from passing.

No measurement: ``runner.run_suite`` and ``launch.run_sharded`` are replaced by fakes that
return seeded cells (the real 2-rank jobs are tested in tests/harness/run/test_sharded.py).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from harness import cli, exit_codes
from harness.nightly import job
from harness.run import runner
from harness.run.sharded import launch
from harness.store import results
from tests.harness import synthetic

ARGV = [
    "nightly",
    "--models",
    "towers",
    "--modes",
    "compile",
    "--phases",
    "infer",
    "--no-asv",
    "--no-quality",
    "--no-progress",
]


class FakeNights:
    """Seeded cells: single-process ones at 5 ms, sharded ones at ``sharded_ms`` (status ``sharded_status``)."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch) -> None:
        self.calls: list[str] = []
        self.sharded_ms = 8.0
        self.sharded_status = "ok"
        self.seed = 0
        monkeypatch.setattr(runner, "run_suite", self.suite)
        monkeypatch.setattr(runner, "run_one", self.one)
        monkeypatch.setattr(launch, "run_sharded", self.sharded)
        monkeypatch.setattr(job, "git_info", lambda: {"sha": "c" * 40, "dirty": False, "branch": "main"})

    def _sharded_cell(self) -> dict[str, Any]:
        self.seed += 1
        c = synthetic.cell("towers", "compile+optimus", "train", self.sharded_ms, seed=self.seed,
                           status=self.sharded_status)  # fmt: skip
        c.update({"nproc": 2, "sharding": "auto", "plan": {"nproc": 2, "sharding": "auto", "modules": {}}})
        return c

    def suite(self, cfg: Any, out: Any, **kw: Any) -> dict[str, Any]:
        self.seed += 1
        if cfg.nproc > 1:
            self.calls.append("sharded suite")
            cells = [self._sharded_cell()]
        else:
            self.calls.append("suite")
            cells = [synthetic.cell("towers", "compile", "infer", 5.0, seed=self.seed)]
        d = {**synthetic.doc(cells), "config": cfg.as_dict()}
        results.save_atomic(out, d)
        return d

    def one(self, key: Any, cfg: Any, timeout: float, peaks: Any = None) -> dict[str, Any]:
        self.calls.append("rerun")
        return synthetic.cell("towers", "compile", "infer", 5.0, seed=99)

    def sharded(self, key: Any, cfg: Any, timeout: float, plan: Any) -> dict[str, Any]:
        assert plan is not None  # the rerun reuses tonight's plan instead of planning again
        self.calls.append("sharded rerun")
        return self._sharded_cell()


def test_the_repository_config_has_one_two_rank_cell() -> None:
    cfg = job.load_config()
    assert cfg.sharded is not None
    run_cfg = job.run_config(cfg.sharded, job.DEFAULT_PROVIDER, "cpu")
    assert run_cfg.nproc == 2 and len(run_cfg.cells()) == 1


def test_sharded_cells_are_recorded_compared_and_rerun(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    fake = FakeNights(monkeypatch)
    store = tmp_path / "store"
    assert cli.main([*ARGV, "--store", str(store)]) == exit_codes.OK  # the baseline
    assert fake.calls == ["suite", "sharded suite"]
    entry = job.load_history(store)["runs"][-1]
    sharded_doc = results.load(store / entry["sharded_results"])
    assert sharded_doc["cells"][0]["nproc"] == 2

    fake.calls.clear()
    assert cli.main([*ARGV, "--store", str(store)]) == exit_codes.OK  # unchanged: pass
    assert fake.calls == ["suite", "sharded suite"]
    summary = (store / job.load_history(store)["runs"][-1]["summary"]).read_text()
    assert "towers/tiny/compile+optimus/train [2 ranks, auto]" in summary
    assert f"compared with `{entry['sharded_results']}`" in summary

    fake.calls.clear()
    fake.sharded_ms = 40.0  # 5x slower sharded cell, on the first measurement and the rerun
    assert cli.main([*ARGV, "--store", str(store)]) == exit_codes.REGRESSION
    assert fake.calls == ["suite", "sharded suite", "sharded rerun"]
    last = job.load_history(store)["runs"][-1]
    assert last["status"] == "regression"
    summary = (store / last["summary"]).read_text()
    assert "| towers/tiny/compile+optimus/train [2 ranks, auto] | 1 |" in summary  # the rerun row


def test_a_failed_sharded_cell_is_no_baseline_and_no_pass(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    fake = FakeNights(monkeypatch)
    fake.sharded_status = "failed"
    store = tmp_path / "store"
    assert cli.main([*ARGV, "--store", str(store)]) == exit_codes.INCOMPLETE  # first night
    fake.sharded_status = "ok"
    assert cli.main([*ARGV, "--store", str(store)]) == exit_codes.OK  # the baseline
    fake.sharded_status = "failed"
    assert cli.main([*ARGV, "--store", str(store)]) == exit_codes.INCOMPLETE
    assert [r["status"] for r in job.load_history(store)["runs"]] == ["incomplete", "pass", "incomplete"]


def test_no_sharded_skips_the_suite(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    fake = FakeNights(monkeypatch)
    assert cli.main([*ARGV, "--no-sharded", "--store", str(tmp_path)]) == exit_codes.OK
    assert fake.calls == ["suite"]
    assert "sharded_results" not in job.load_history(tmp_path)["runs"][-1]


@pytest.mark.parametrize(
    ("section", "message"),
    [
        ({"nproc": 1}, "sharded.nproc must be an integer >= 2"),
        ({"nproc": 2, "ranks": 2}, "unknown field(s) ['ranks']"),
    ],
)
def test_bad_sharded_section_is_one_line(tmp_path: Path, section: dict[str, Any], message: str) -> None:
    doc = json.loads(job.DEFAULT_CONFIG.read_text())
    doc["sharded"] = {**doc["sharded"], **section}
    p = tmp_path / "cfg.json"
    p.write_text(json.dumps(doc))
    with pytest.raises(
        ValueError,
        match=message.replace("[", r"\[").replace("]", r"\]").replace("(", r"\(").replace(")", r"\)"),
    ):
        job.load_config(p)
