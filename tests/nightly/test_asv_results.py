"""The nightly reads asv's results files (fixture written by asv's own ``Results.save``, see
``fixtures/make_asv_results.py``), compares two commits with asv compare's marks, and judges
each figure in its direction."""

from __future__ import annotations

import json
import math
import shutil
from pathlib import Path

import pytest

from harness.nightly import asv_results, job

FIXTURE = Path(__file__).resolve().parent / "fixtures" / "asv_results"
MACHINE = "fixture-machine"
BEFORE, AFTER = "a" * 40, "b" * 40


def rows(results_dir: Path = FIXTURE) -> dict[str, asv_results.AsvRow]:
    before = asv_results.read_commit(results_dir, MACHINE, BEFORE)
    after = asv_results.read_commit(results_dir, MACHINE, AFTER)
    out = asv_results.compare(before, after, factor=1.1)
    job.classify_asv(out, ["track_speedup"], ["bench_compiled.CompiledCells."])
    return {r.name: r for r in out}


def test_results_files_are_compared_and_directions_respected() -> None:
    by_name = rows()
    verdicts = {
        name.split("(")[0].rsplit(".", 1)[1] + name[name.index("(") :]: r.verdict
        for name, r in by_name.items()
    }
    assert verdicts == {
        "time_optimize(64)": "regression",  # '+': 20% slower, significant by its samples
        "track_speedup('towers', 'tiny', 'infer')": "regression",  # '-': a smaller speedup is worse
        "track_speedup('towers', 'tiny', 'train')": "no change",
        "track_compile_s('towers', 'tiny', 'infer', 'compile')": "regression (report only)",
        "track_nodes_after('towers', 'tiny', 'infer')": "no change",
        "peakmem_train_step('dlrm', 'tiny')": "regression",  # '!': fails now
        "track_peak_mem_ratio('towers', 'tiny', 'train')": "not comparable",  # 'x': version changed
    }
    peak = by_name["bench_memory.EagerTrainStep.peakmem_train_step('dlrm', 'tiny')"]
    assert (peak.mark, peak.before, peak.after, peak.ratio) == ("!", "5000000", "failed", "n/a")
    speed = by_name["bench_compiled.CompiledSpeedup.track_speedup('towers', 'tiny', 'infer')"]
    assert (speed.mark, float(speed.before), float(speed.after), speed.ratio) == ("-", 1.3, 1.1, "0.85")


def test_reader_agrees_with_asvs_own_loader() -> None:
    """Every figure asv's ``Results.load`` + ``unroll_result`` sees, with the same value."""
    from asv.commands.compare import unroll_result
    from asv.results import Results

    path = next((FIXTURE / MACHINE).glob("bbbbbbbb-*.json"))
    theirs = {}
    res = Results.load(str(path))
    for key in res.get_all_result_keys():
        params = res.get_result_params(key)
        for name, value in unroll_result(key, params, res.get_result_value(key, params)):
            theirs[name] = value
    ours = {n: f.value for n, f in asv_results.load_figures(path).items()}
    assert ours.keys() == theirs.keys()
    for name, value in theirs.items():
        assert (ours[name] is None and value is None) or ours[name] == value or math.isnan(value)


def test_an_insignificant_change_is_not_flagged(tmp_path: Path) -> None:
    """Past the factor but within the noise of the samples: no mark, ratio prefixed '~'."""
    shutil.copytree(FIXTURE, tmp_path / "r")
    path = next((tmp_path / "r" / MACHINE).glob("bbbbbbbb-*.json"))
    doc = json.loads(path.read_text())
    row = doc["results"]["bench_optimizer.OptimizeSynthetic.time_optimize"]
    cols = doc["result_columns"]
    row[cols.index("samples")] = [[0.006, 0.018] * 5]  # median 0.012, but all over the place
    for stat in ("stats_ci_99_a", "stats_ci_99_b"):
        row[cols.index(stat)] = [0.001 if stat.endswith("_a") else 0.1]
    path.write_text(json.dumps(doc))
    r = rows(tmp_path / "r")["bench_optimizer.OptimizeSynthetic.time_optimize(64)"]
    assert r.mark == "" and r.ratio.startswith("~") and r.verdict == "no change"


def test_missing_results_and_other_formats_are_refused(tmp_path: Path) -> None:
    with pytest.raises(RuntimeError, match="no asv results for cccccccccc"):
        asv_results.read_commit(FIXTURE, MACHINE, "c" * 40)
    bad = tmp_path / MACHINE / "cccccccc-env.json"
    bad.parent.mkdir()
    bad.write_text(json.dumps({"version": 1, "results": {}}))
    with pytest.raises(RuntimeError, match="asv results version 1"):
        asv_results.read_commit(tmp_path, MACHINE, "c" * 40)


def test_asv_compare_reads_the_results_dir_of_the_config(tmp_path: Path) -> None:
    """``Asv.compare`` finds the files through asv.conf.json's ``results_dir`` (relative to it)."""
    shutil.copytree(FIXTURE, tmp_path / "res")
    conf = tmp_path / "asv.conf.json"
    conf.write_text('{\n// a comment asv allows\n"version": 1, "results_dir": "res"}\n')
    logged: list[str] = []
    got = job.Asv(conf, logged.append, MACHINE).compare(BEFORE, AFTER, 1.1)
    assert {r.name for r in got} == set(rows())
    assert "res/fixture-machine" in logged[-1]
