"""The nightly's training-quality gate: one family a night in turn, its own results file, and a
cell that is not ok (``quality_mismatch``) keeps the night from passing.

No measurement: ``runner.run_suite`` is replaced by a fake that returns seeded cells (the real
quality cells are tested in tests/harness/run/test_quality_run.py).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from harness import cli, exit_codes
from harness.measure import quality
from harness.nightly import job
from harness.run import runner
from harness.store import results
from tests.harness import synthetic

ARGV = ["nightly", "--models", "towers", "--modes", "compile", "--phases", "infer", "--no-asv", "--no-sharded",
        "--no-progress"]  # fmt: skip


def _quality_cell(model: str, mode: str, status: str, seed: int) -> dict[str, Any]:
    c = synthetic.cell(model, mode, "train", 5.0, seed=seed)
    fig = quality.SeedFigures(seed=0, auc=0.65, logloss=0.55, eager_auc=0.65, eager_logloss=0.55,
                              eager_auc_start=0.55, drift=0.0, drift_rel=0.0, drift_param="w",
                              curve=[[10.0, 0.6]], eager_curve=[[10.0, 0.6]])  # fmt: skip
    c["quality"] = {"steps": 10, "every": 10, **quality.judge([fig])}
    if status != "ok":
        c["quality"].update(verdict=status, reasons=["seed 0: AUC 0.66 vs eager 0.65"])
        c.update(status=status, error="quality differs from eager: seed 0: AUC 0.66 vs eager 0.65")
    return c


class FakeNights:
    """The timing suite at 5 ms; the quality suite's cells ``quality_status``; records which
    family each quality suite trained."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch) -> None:
        self.trained: list[str] = []
        self.quality_status = "ok"
        self.seed = 0
        monkeypatch.setattr(runner, "run_suite", self.suite)
        monkeypatch.setattr(job, "git_info", lambda: {"sha": "d" * 40, "dirty": False, "branch": "main"})

    def suite(self, cfg: Any, out: Any, **kw: Any) -> dict[str, Any]:
        self.seed += 1
        if cfg.quality_steps:
            (model,) = cfg.models
            self.trained.append(model)
            assert cfg.phases == ["train"] and cfg.scale == "tiny" and cfg.quality_seeds == 3
            cells = [_quality_cell(model, mode, self.quality_status, self.seed) for mode in cfg.modes]
        else:
            cells = [synthetic.cell("towers", "compile", "infer", 5.0, seed=self.seed)]
        d = {**synthetic.doc(cells), "config": cfg.as_dict()}
        results.save_atomic(out, d)
        return d


def test_the_repository_config_trains_every_family_in_turn() -> None:
    cfg = job.load_config()
    assert cfg.quality is not None
    got = [job.quality_run_config(cfg.quality, job.DEFAULT_PROVIDER, "cpu", n) for n in range(5)]
    assert [c.models for c in got] == [["towers"], ["mmoe"], ["dcn"], ["dlrm"], ["towers"]]
    assert all(c.scale == "tiny" and c.quality_steps == 300 and len(c.modes) == 5 for c in got)


def test_one_family_a_night_recorded_beside_the_night(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    fake = FakeNights(monkeypatch)
    store = tmp_path / "store"
    for _ in range(3):
        assert cli.main([*ARGV, "--store", str(store)]) == exit_codes.OK
    assert fake.trained == ["towers", "mmoe", "dcn"]
    runs = job.load_history(store)["runs"]
    assert [r["status"] for r in runs] == ["pass", "pass", "pass"]
    doc = results.load(store / runs[-1]["quality_results"])
    assert {c["model"] for c in doc["cells"]} == {"dcn"} and len(doc["cells"]) == 5
    summary = (store / runs[-1]["summary"]).read_text()
    assert "Training quality (dcn/tiny, family 3 of 4 in turn; 300 steps x 3 seeds per mode" in summary
    assert "all 5 cell(s) train like eager" in summary


def test_a_quality_mismatch_makes_the_night_incomplete(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    fake = FakeNights(monkeypatch)
    store = tmp_path / "store"
    assert cli.main([*ARGV, "--store", str(store)]) == exit_codes.OK  # the baseline
    fake.quality_status = "quality_mismatch"
    assert cli.main([*ARGV, "--store", str(store)]) == exit_codes.INCOMPLETE
    last = job.load_history(store)["runs"][-1]
    assert last["status"] == "incomplete"
    summary = (store / last["summary"]).read_text()
    assert "**5 of 5 cell(s) not ok** (lost data)" in summary
    assert "- mmoe/tiny/eager/train: **quality_mismatch**: quality differs from eager" in summary


def test_no_quality_skips_the_gate(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    fake = FakeNights(monkeypatch)
    assert cli.main([*ARGV, "--no-quality", "--store", str(tmp_path)]) == exit_codes.OK
    assert fake.trained == []
    assert "quality_results" not in job.load_history(tmp_path)["runs"][-1]


@pytest.mark.parametrize(
    ("section", "message"),
    [
        ({"families": []}, "quality.families must be a non-empty list of family names"),
        ({"stepz": 3}, "unknown field(s) ['stepz']"),
    ],
)
def test_bad_quality_section_is_one_line(tmp_path: Path, section: dict[str, Any], message: str) -> None:
    doc = json.loads(job.DEFAULT_CONFIG.read_text())
    doc["quality"] = {**doc["quality"], **section}
    p = tmp_path / "cfg.json"
    p.write_text(json.dumps(doc))
    with pytest.raises(ValueError) as e:
        job.load_config(p)
    assert message in str(e.value) and "\n" not in str(e.value)
