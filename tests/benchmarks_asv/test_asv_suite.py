"""The asv suite without running asv over commits: config, discovery, and what each figure reads.

``asv check`` runs against this interpreter (``-E existing``), so discovery and call
signatures are checked in seconds. The compiled-cell figures are checked on a hand-made
harness results file handed over the way the nightly hands over its cells
(``OPTIMUS_ASV_CELLS``), so each ratio is checked against numbers we chose.
"""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from benchmarks import bench_compiled, common
from benchmarks.synthetic import build_towers

ROOT = Path(__file__).resolve().parents[2]
SHA = "0123456789abcdef0123456789abcdef01234567"


def asv_conf() -> dict[str, Any]:
    text = re.sub(r"^\s*//.*$", "", (ROOT / "asv.conf.json").read_text(), flags=re.M)
    return json.loads(text)


def test_asv_check_passes() -> None:
    out = subprocess.run(
        [sys.executable, "-m", "asv", "check", "-E", f"existing:{sys.executable}"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert out.returncode == 0, out.stdout + out.stderr
    assert "No problems found" in out.stdout


def test_asv_conf_uses_the_one_install_recipe() -> None:
    conf = asv_conf()
    assert conf["repo"] == "." and conf["dvcs"] == "git" and conf["branches"] == ["main"]
    assert conf["matrix"]["req"] == {"torch": "2.13.0"}
    assert all("--no-deps" in c for c in conf["build_command"] if "pip wheel" in c)
    assert any("pip wheel --no-deps" in c for c in conf["build_command"])
    install = " ".join(conf["install_command"])
    assert "scripts/install-deps" in install and "--no-deps" in install
    assert conf["results_dir"] == "results/asv" and conf["html_dir"] == "results/html"
    ignored = (ROOT / ".gitignore").read_text().split()
    assert "results/asv/" in ignored and "results/html/" in ignored


def harness_cell(model: str, mode: str, phase: str, median: float, mem: int, **extra: Any) -> dict[str, Any]:
    cell = {
        "model": model,
        "scale": "tiny",
        "mode": mode,
        "phase": phase,
        "status": "ok",
        "error": None,
        "latency_ms": {"median": median, "iqr": 0.0, "samples": [median]},
        "peak_mem_bytes": mem,
        "compile_s": 10.0 if mode == "compile" else 12.5,
        "optimus_s": 0.5 if mode == "compile+optimus" else None,
        "nodes_before": None,
        "nodes_after": None,
        "max_abs_err": 0.0,
    }
    cell.update(extra)
    return cell


@pytest.fixture
def given(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    cells = [
        harness_cell("towers", "compile", "infer", 2.0, 4 * 2**20),
        harness_cell("towers", "compile+optimus", "infer", 1.6, 3 * 2**20, nodes_before=40, nodes_after=25),
        harness_cell("dlrm", "compile", "infer", 1.0, 2**20),
        harness_cell(
            "dlrm",
            "compile+optimus",
            "infer",
            0.0,
            2**20,
            status="mismatch",
            error="outputs differ from eager",
            latency_ms=None,
        ),
        harness_cell("dcn", "compile+optimus", "infer", 1.0, 2**20, optimus_s=None),  # nothing recorded
    ]
    path = tmp_path / "night.json"
    path.write_text(json.dumps({"env": {"git": {"sha": SHA, "dirty": False}}, "cells": cells}))
    monkeypatch.setenv("OPTIMUS_ASV_CELLS", str(path))
    monkeypatch.setenv("ASV_COMMIT", SHA)
    monkeypatch.setenv("OPTIMUS_ASV_FAMILIES", "towers,dlrm")
    monkeypatch.setenv("OPTIMUS_ASV_PHASES", "infer")
    monkeypatch.chdir(tmp_path)
    return Path(bench_compiled.compiled_cells())


def test_compiled_figures_are_read_from_the_cells(given: Path) -> None:
    s = bench_compiled.CompiledSpeedup()
    s.setup(str(given), "towers", "tiny", "infer")
    assert s.track_speedup(str(given), "towers", "tiny", "infer") == pytest.approx(2.0 / 1.6)
    assert s.track_peak_mem_ratio(str(given), "towers", "tiny", "infer") == pytest.approx(0.75)
    c = bench_compiled.CompiledCells()
    c.setup(str(given), "towers", "tiny", "infer", "compile+optimus")
    assert c.track_compile_s(str(given), "towers", "tiny", "infer", "compile+optimus") == 12.5
    assert c.track_latency_ms(str(given), "towers", "tiny", "infer", "compile+optimus") == 1.6
    assert c.track_peak_mem_mb(str(given), "towers", "tiny", "infer", "compile+optimus") == 3.0
    g = bench_compiled.OptimizedGraph()
    g.setup(str(given), "towers", "tiny", "infer")
    assert g.track_nodes_after(str(given), "towers", "tiny", "infer") == 25
    assert g.track_optimus_s(str(given), "towers", "tiny", "infer") == 0.5
    assert bench_compiled.CompiledSpeedup.track_speedup.unit == "x"  # type: ignore[attr-defined]
    assert bench_compiled.CompiledCells.track_compile_s.unit == "s"  # type: ignore[attr-defined]


def test_dashboard_summaries_count_the_mismatch_against_the_pass_rate(given: Path) -> None:
    """towers passes (2.0 / 1.6 ms, 4 / 3 MiB, 12.5 s); dlrm's compile+optimus mismatched; dcn is
    outside the grid (families towers,dlrm)."""
    d = bench_compiled.DashboardSummaries()
    d.setup(str(given), "infer")
    assert d.track_pass_rate(str(given), "infer") == pytest.approx(50.0)
    assert d.track_geomean_speedup(str(given), "infer") == pytest.approx(2.0 / 1.6)
    assert d.track_geomean_speedup_unclipped(str(given), "infer") == pytest.approx(2.0 / 1.6)
    assert d.track_compile_latency_geomean_s(str(given), "infer") == pytest.approx(12.5)
    assert d.track_compile_latency_max_s(str(given), "infer") == pytest.approx(12.5)
    assert d.track_peak_mem_compression_mean(str(given), "infer") == pytest.approx(4 / 3)
    assert d.track_peak_mem_compression_min(str(given), "infer") == pytest.approx(4 / 3)
    assert bench_compiled.DashboardSummaries.track_pass_rate.unit == "%"  # type: ignore[attr-defined]


def test_failed_cell_fails_the_benchmark_instead_of_a_number(given: Path) -> None:
    with pytest.raises(RuntimeError, match="mismatch: outputs differ"):
        bench_compiled.CompiledSpeedup().setup(str(given), "dlrm", "tiny", "infer")


def test_missing_node_counts_are_skipped_not_zero(given: Path) -> None:
    with pytest.raises(NotImplementedError, match="no node counts for dcn/tiny/infer"):
        bench_compiled.OptimizedGraph().setup(str(given), "dcn", "tiny", "infer")


@pytest.mark.parametrize(
    ("env", "why"),
    [
        ({"ASV_COMMIT": "f" * 40}, "other commit"),
        ({"OPTIMUS_ASV_FAMILIES": "towers,dcn"}, "cells missing"),
    ],
)
def test_cells_from_another_commit_or_incomplete_are_not_used(
    given: Path, monkeypatch: pytest.MonkeyPatch, env: dict[str, str], why: str
) -> None:
    for k, v in env.items():
        monkeypatch.setenv(k, v)
    assert common.given_cells(common.families(), ["tiny"], common.COMPILED_MODES, ["infer"]) is None, why


def test_grid_env_rejects_unknown_values(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("OPTIMUS_ASV_FAMILIES", "towers,bert")
    with pytest.raises(ValueError, match=r"OPTIMUS_ASV_FAMILIES: unknown value\(s\) \['bert'\]"):
        common.families()
    monkeypatch.setenv("OPTIMUS_ASV_WIDTHS", "64,x")
    with pytest.raises(ValueError, match="OPTIMUS_ASV_WIDTHS must be integers"):
        common.widths()
    monkeypatch.delenv("OPTIMUS_ASV_FAMILIES")
    assert common.families() == ["towers", "dlrm"]


def test_synthetic_graph_is_seeded() -> None:
    import torch

    m4, (x4,) = build_towers(4)
    assert m4(x4).shape == (32, 1) and x4.shape == (32, 32)
    again, (y4,) = build_towers(4)
    assert torch.equal(x4, y4) and torch.equal(m4(x4), again(y4))
    with pytest.raises(ValueError, match="branches must be >= 1"):
        build_towers(0)


def test_optimizer_benchmark_graph_grows_with_branches_and_is_optimized() -> None:
    import optimus

    reports = {n: optimus.optimize(*build_towers(n)).optimus_report for n in (4, 16)}
    assert reports[16].nodes_before > 3 * reports[4].nodes_before  # the graph scales with width
    assert 0 < reports[16].nodes_after < reports[16].nodes_before  # wide enough to be worth fusing
    from benchmarks.bench_optimizer import OptimizeSynthetic

    b = OptimizeSynthetic()
    b.setup(2)
    b.time_optimize(2)
    assert b.track_nodes_after(2) > 0


@pytest.fixture
def given_sharded(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    ranks = [{"rank": 0, "latency_ms": {"median": 4.0}}, {"rank": 1, "latency_ms": {"median": 5.0}}]
    cell = harness_cell(
        "towers", "compile+optimus", "train", 5.5, 3 * 2**20, nproc=2, sharding="auto", ranks=ranks
    )
    path = tmp_path / "night.sharded.json"
    path.write_text(json.dumps({"env": {"git": {"sha": SHA, "dirty": False}}, "cells": [cell]}))
    monkeypatch.setenv("OPTIMUS_ASV_SHARDED_CELLS", str(path))
    monkeypatch.setenv("ASV_COMMIT", SHA)
    monkeypatch.chdir(tmp_path)
    from benchmarks import bench_sharded

    return Path(bench_sharded.sharded_cells())


def test_sharded_figures_are_read_from_the_cells(given_sharded: Path) -> None:
    from benchmarks import bench_sharded

    args = (str(given_sharded), "towers", "train", "compile+optimus")
    b = bench_sharded.ShardedCells()
    b.setup(*args)
    assert b.track_slowest_rank_ms(*args) == 5.5
    assert b.track_rank_imbalance(*args) == pytest.approx(5.0 / 4.0)
    assert b.track_peak_mem_mb(*args) == 3.0
    assert b.track_compile_s(*args) == 12.5


def test_sharded_cells_need_the_rank_count(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    single = harness_cell("towers", "compile+optimus", "train", 9.0, 2**20)  # nproc 1: not a sharded cell
    path = tmp_path / "night.json"
    path.write_text(json.dumps({"env": {"git": {"sha": SHA, "dirty": False}}, "cells": [single]}))
    monkeypatch.setenv("OPTIMUS_ASV_SHARDED_CELLS", str(path))
    monkeypatch.setenv("ASV_COMMIT", SHA)
    got = common.given_cells(
        ["towers"], ["tiny"], ["compile+optimus"], ["train"], "OPTIMUS_ASV_SHARDED_CELLS", 2
    )
    assert got is None


def test_sharded_off_is_not_applicable(monkeypatch: pytest.MonkeyPatch) -> None:
    from benchmarks import bench_sharded

    monkeypatch.setenv("OPTIMUS_ASV_SHARDED", "off")
    assert bench_sharded.sharded_cells() == ""
    with pytest.raises(NotImplementedError, match="OPTIMUS_ASV_SHARDED=off"):
        bench_sharded.ShardedCells().setup("", "towers", "train", "compile+optimus")
    monkeypatch.setenv("OPTIMUS_ASV_SHARDED_NPROC", "1")
    with pytest.raises(ValueError, match="OPTIMUS_ASV_SHARDED_NPROC must be an integer >= 2"):
        common.sharded_nproc()
