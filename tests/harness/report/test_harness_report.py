"""report and the paper table, from synthetic results (no benchmark run needed)."""

from __future__ import annotations

from pathlib import Path

import matplotlib.image as mpimg
import pytest

from harness import cli
from harness.report import paper
from harness.report.markdown import write_report
from harness.store import results
from tests.harness import synthetic

MODES_MS = {"eager": 9.0, "eager+optimus": 6.0, "compile": 5.0, "compile+peer": 6.0, "compile+optimus": 4.0}


def _suite(mismatch_model: str | None = None) -> dict:
    cells = []
    for i, model in enumerate(("towers", "mmoe")):
        for j, phase in enumerate(("infer", "train")):
            for k, (mode, ms) in enumerate(MODES_MS.items()):
                status = "mismatch" if (model == mismatch_model and mode == "compile+optimus") else "ok"
                mem = 9_400_000 if mode == "compile+optimus" else 10_000_000
                comp = 0.0 if mode.startswith("eager") else (6.0 if mode == "compile+optimus" else 10.0)
                cells.append(synthetic.cell(model, mode, phase, ms * (1 + j), seed=100 * i + 10 * j + k,
                                            status=status, mem=mem, compile_s=comp))  # fmt: skip
    return synthetic.doc(cells)


def test_paper_rows_compute_speedup_memory_and_compile_changes() -> None:
    rows = paper.paper_rows(_suite())
    assert [(r["model"], r["phase"]) for r in rows] == [
        ("mmoe", "infer"), ("mmoe", "train"), ("towers", "infer"), ("towers", "train"),
    ]  # fmt: skip
    for r in rows:
        assert r["vs compile"]["x"] == pytest.approx(5.0 / 4.0, rel=0.06)
        assert r["vs compile"]["lo"] < r["vs compile"]["x"] < r["vs compile"]["hi"]
        assert r["vs compile+peer"]["x"] == pytest.approx(6.0 / 4.0, rel=0.06)
        assert r["mem_change_pct"] == pytest.approx(-6.0)
        assert r["compile_change_s"] == pytest.approx(-4.0) and r["compile_change_pct"] == pytest.approx(
            -40.0
        )
    table = paper.format_paper_table(rows)
    assert (
        "up to 63% faster" in table
        and ">400 s less compile time" in table
        and "~6% less peak memory" in table
    )
    assert "-4.0 s (-40%)" in table and "-6.0%" in table


def test_mismatched_cell_is_never_reported_as_a_speedup() -> None:
    rows = paper.paper_rows(_suite(mismatch_model="towers"))
    towers = [r for r in rows if r["model"] == "towers"]
    assert all(r["vs compile"] == {"status": "mismatch"} for r in towers)
    assert all(r["mem_change_pct"] is None and r["compile_change_s"] is None for r in towers)
    table = paper.format_paper_table(rows)
    assert "| towers | tiny | infer | 5." in table and "| mismatch | mismatch |" in table


def test_report_writes_markdown_and_readable_pngs(tmp_path: Path) -> None:
    doc = _suite(mismatch_model="mmoe")
    src = tmp_path / "run.json"
    results.save_atomic(src, doc)
    assert cli.main(["report", str(src), "--out-dir", str(tmp_path / "out")]) == 0
    md = (tmp_path / "out" / "run.md").read_text()
    for heading in ("Median step latency", "Peak memory of one step", "Compile time", "Failed, timed-out"):
        assert heading in md
    assert "mmoe/tiny/compile+optimus/infer | mismatch" in md
    pngs = sorted(p.name for p in (tmp_path / "out").glob("*.png"))
    assert pngs == [
        "run_changes.png",
        "run_compile_time.png",
        "run_latency.png",
        "run_peak_memory.png",
        "run_speedup.png",
    ]
    for name in pngs:
        assert f"]({name})" in md
        img = mpimg.imread(tmp_path / "out" / name)
        assert img.shape[0] > 300 and img.shape[1] > 500  # a real figure, not an empty canvas


def test_report_of_empty_results_is_a_clear_error(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="no cells"):
        write_report(synthetic.doc([]), tmp_path, "x")


def test_report_shows_percent_of_floor_per_mode_and_the_floor_plot(tmp_path: Path) -> None:
    doc = _suite()
    doc["env"]["peaks"] = {"device": "cpu", "threads": 1, "repeats": 5, "gemm_flops_per_s": 100e9,
                           "gemm": [{"m": 8, "n": 8, "k": 8, "key_bytes": 256, "flops_per_s": 100e9}],
                           "copy_bytes": 2**26, "bandwidth_bytes_per_s": 5e9}  # fmt: skip
    for c in doc["cells"]:
        if c["status"] == "ok":  # one floor per family and phase, 1 ms; the modes read against it
            c["floor_ms"] = 1.0
            c["of_floor"] = 1.0 / c["latency_ms"]["median"]
    md_path, *pngs = write_report(doc, tmp_path, "run")
    md = md_path.read_text()
    assert "### % of floor (floor_ms / median step latency; 100% = at the roofline): infer" in md
    compile_optimus_infer = 1.0 / next(
        c["latency_ms"]["median"] for c in doc["cells"]
        if (c["model"], c["mode"], c["phase"]) == ("towers", "compile+optimus", "infer")
    )  # fmt: skip
    assert f"{100 * compile_optimus_infer:.3g}%" in md
    assert "GEMM GFLOP/s 8x8x8 100.0" in md
    floor_png = tmp_path / "run_floor.png"
    assert floor_png in pngs and "](run_floor.png)" in md
    img = mpimg.imread(floor_png)
    assert img.shape[0] > 300 and img.shape[1] > 500
