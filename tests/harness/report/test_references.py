"""The reproduce report shows the committed reference runs (harness/report/references.py) beside the fresh one."""

from __future__ import annotations

import datetime as dt
import json
from pathlib import Path

import pytest
import synthetic

from harness.report import references
from harness.spec import CellKey, RunConfig
from harness.store import results


def _write_run(
    root: Path, folder: str, stem: str, sha: str, compile_s: tuple[float, float], when: float
) -> None:
    cells = [
        synthetic.cell("dcn", "compile", "train", 10.0, seed=1, scale="large", compile_s=compile_s[0]),
        synthetic.cell("dcn", "compile+optimus", "train", 8.0, seed=2, scale="large", compile_s=compile_s[1]),
    ]
    for c in cells:
        c["finished_at"] = when
    doc = synthetic.doc(cells)
    doc["env"]["git"]["sha"] = sha
    doc["config"]["scale"] = "large"
    (root / folder).mkdir(parents=True)
    (root / folder / f"{stem}.json").write_text(json.dumps(doc))


def test_section_shows_each_reference_run_with_its_commit_date_and_figures(tmp_path: Path) -> None:
    when = dt.datetime(2026, 3, 4, 12, tzinfo=dt.UTC).timestamp()
    _write_run(tmp_path, "large", "reproduce-large", "abcdef1" + "0" * 33, (500.0, 20.0), when)
    text = references.section(tmp_path)
    assert "scale large, commit abcdef1, measured 2026-03-04" in text
    assert "| dcn | large | train |" in text and "500.0 s -> 20.0 s (-480.0 s)" in text
    assert "reproduce-medium" not in text  # only runs that are present


def test_section_says_so_when_no_reference_run_is_committed(tmp_path: Path) -> None:
    assert "No reference runs found" in references.section(tmp_path)


def test_the_committed_reference_runs_are_read_not_hard_coded() -> None:
    refs = references.load_references()
    assert [(p.parent.name, p.stem) for p, _ in refs] == list(references.REFERENCE_RUNS)
    text = references.section()
    for _path, doc in refs:
        sha, day = references.measured_at(doc)
        assert f"commit {sha}, measured {day}" in text and sha != "?" and day != "?"
    large = next(doc for path, doc in refs if path.parent.name == "large")
    cells = results.cell_map(large)
    c = cells[CellKey("dcn", "large", "compile", "train")]["compile_s"]
    o = cells[CellKey("dcn", "large", "compile+optimus", "train")]["compile_s"]
    assert f"{c:.1f} s -> {o:.1f} s ({o - c:+.1f} s)" in text  # the compile time saved on dcn large train
    assert "- dashboard summary, train, compile+optimus vs compile: pass rate 100%, 4/4" in text


def test_a_noisy_reference_speedup_is_marked() -> None:
    row = {
        "model": "mmoe", "scale": "medium", "phase": "infer",
        "vs compile": {"x": 0.73, "lo": 0.71, "hi": 0.87},
        "compile ms": 48.7, "compile iqr": 2.0, "compile+optimus ms": 66.8, "compile+optimus iqr": 18.7,
        "compile_s": None, "compile_change_s": None, "mem_change_pct": None,
    }  # fmt: skip
    assert "0.73x (0.71-0.87) † |" in references._figure(row)
    row["compile+optimus iqr"] = 3.0
    assert "†" not in references._figure(row)


def test_the_committed_mlperf_dlrmv2_run_is_shown_beside_ours() -> None:
    """The reference model's committed run is read like ours: its rows, at its own scale."""
    text = references.section()
    assert "### `results/mlperf-dlrmv2/mlperf-dlrmv2.json`: scale cpu, commit " in text
    assert "| mlperf_dlrmv2 | cpu | infer |" in text and "| mlperf_dlrmv2 | cpu | train |" in text


def test_reference_names_are_checked_in_one_line() -> None:
    assert references.reference_models("") == [] and references.reference_models(None) == []
    assert [m.name for m in references.reference_models("mlperf_dlrmv2")] == ["mlperf_dlrmv2"]
    with pytest.raises(ValueError, match=r"^reference: unknown 'nope'; allowed values: mlperf_dlrmv2$"):
        references.reference_models("mlperf_dlrmv2,nope")


def test_a_reference_model_runs_with_reproduces_options_at_its_own_scale(tmp_path: Path) -> None:
    from harness.cli import reproduce

    ours = RunConfig(models=["towers", "dcn"], modes=["eager", "compile"], phases=["train"], budget_s=0.5,
                     min_iters=7, timeout_s=30.0)  # fmt: skip
    ref = references.REFERENCE_MODELS["mlperf_dlrmv2"]
    cfg = reproduce.reference_config(ours, ref)
    assert (cfg.provider, cfg.models, cfg.scale) == (ref.provider, ["mlperf_dlrmv2"], "cpu")
    assert (cfg.modes, cfg.phases, cfg.budget_s, cfg.min_iters) == (["eager", "compile"], ["train"], 0.5, 7)
    assert cfg.timeout_s == reproduce.REFERENCE_TIMEOUT_S  # its compiles outlast tiny's timeout
    assert ref.out_path(tmp_path / "reproduce.json") == tmp_path / "reproduce-mlperf_dlrmv2.json"


def test_a_fresh_reference_run_renders_its_rows_and_names_its_report() -> None:
    cells = [
        synthetic.cell("mlperf_dlrmv2", mode, "infer", ms, seed=i, scale="cpu")
        for i, (mode, ms) in enumerate(
            [("compile", 100.0), ("compile+peer", 100.0), ("compile+optimus", 80.0)]
        )
    ]
    text = references.reference_section(
        references.REFERENCE_MODELS["mlperf_dlrmv2"], synthetic.doc(cells), "reproduce-mlperf_dlrmv2.md"
    )
    assert text.startswith("## Reference model: mlperf_dlrmv2, scale cpu")
    assert "`reproduce-mlperf_dlrmv2.md`" in text and "| mlperf_dlrmv2 | cpu | infer |" in text
    assert "- dashboard summary, infer, compile+optimus vs compile: pass rate 100%, 1/1" in text
