"""The dashboard summaries on a results file built by hand, against figures worked out by hand.

The expected numbers below are computed from the dashboard's definitions (docs/harness.md,
"Dashboard summaries"), written as the arithmetic on the cells, never read back from the code.
The file holds, in inference, five rows (a-e) with every figure chosen:

| row | eager ms | compile ms, peak, compile s | compile+optimus ms, peak, compile s |
| --- | --- | --- | --- |
| a | 10, 100 | 5, 80, 20 | 4, 50, 10 |
| b | 10, 100 | 8, 100, 40 | 10, 125, 5 (a slowdown against compile) |
| c | 10, 100 | 4, 100, 30 | mismatch |
| d | 10, 100 | failed | 5, 40, 8 |
| e | 10, 100 | 2, 100, 10 | missing |

and in training one row, a, with no eager cell.
"""

from __future__ import annotations

import dataclasses
import json
import math
from pathlib import Path
from typing import Any

import pytest

from harness import cli, exit_codes
from harness.gate import compare
from harness.report import markdown, summaries
from tests.harness import synthetic

MIB = 2**20


def cell(model: str, mode: str, ms: float | None, mem_mib: float = 100, compile_s: float | None = None,
         status: str = "ok", phase: str = "infer") -> dict[str, Any]:  # fmt: skip
    lat = {"median": ms, "q1": ms, "q3": ms, "iqr": 0.0, "n": 3, "samples": [ms] * 3} if ms else None
    return {
        "model": model,
        "scale": "tiny",
        "mode": mode,
        "phase": phase,
        "status": status,
        "error": None if status == "ok" else f"by hand: {status}",
        "latency_ms": lat,
        "peak_mem_bytes": int(mem_mib * MIB),
        "compile_s": compile_s,
        "optimus_s": None,
        "nodes_before": None,
        "nodes_after": None,
        "max_abs_err": 0.0,
    }


def hand_doc() -> dict[str, Any]:
    cells = [cell(m, "eager", 10.0) for m in "abcde"]
    cells += [
        cell("a", "compile", 5.0, 80, 20.0),
        cell("b", "compile", 8.0, 100, 40.0),
        cell("c", "compile", 4.0, 100, 30.0),
        cell("d", "compile", None, status="failed"),
        cell("e", "compile", 2.0, 100, 10.0),
        cell("a", "compile+optimus", 4.0, 50, 10.0),
        cell("b", "compile+optimus", 10.0, 125, 5.0),
        cell("c", "compile+optimus", None, status="mismatch"),
        cell("d", "compile+optimus", 5.0, 40, 8.0),
        cell("a", "compile", 10.0, 100, 60.0, phase="train"),
        cell("a", "compile+optimus", 5.0, 100, 15.0, phase="train"),
    ]
    return synthetic.doc(cells)


def get(phase: str, mode: str, against: str) -> summaries.Summary:
    found = summaries.find(summaries.summaries(hand_doc()), phase, mode, against)
    assert found is not None
    return found


def test_target_against_compile_leaves_out_the_failing_mismatched_and_missing_rows() -> None:
    s = get("infer", "compile+optimus", "compile")
    assert s.pass_text() == "40%, 2/5"  # a and b pass; c mismatch, d's compile failed, e missing
    assert s.passing == ("a/tiny", "b/tiny")
    assert s.left_out == (("c/tiny", "mismatch"), ("d/tiny", "compile failed"), ("e/tiny", "missing"))
    # speedups a 5/4 = 1.25, b 8/10 = 0.8 (a slowdown, clipped to 1.0 by the dashboard)
    assert s.geomean_clipped == pytest.approx(math.sqrt(1.25 * 1.0))
    assert s.geomean == pytest.approx(math.sqrt(1.25 * 0.8))  # = 1.0: the slowdown cancels the gain
    assert s.compile_geomean_s == pytest.approx(math.sqrt(10.0 * 5.0))
    assert s.compile_max_s == 10.0
    # compression: compile peak / compile+optimus peak, a 80/50, b 100/125
    assert s.mem_ratio_mean == pytest.approx((1.6 + 0.8) / 2)
    assert s.mem_ratio_min == pytest.approx(0.8)


def test_target_against_eager_counts_the_row_whose_compile_cell_failed() -> None:
    s = get("infer", "compile+optimus", "eager")
    assert s.pass_text() == "60%, 3/5"  # a, b, d
    # speedups 10/4, 10/10, 10/5: no slowdown, so clipped and unclipped agree
    assert s.geomean_clipped == pytest.approx((2.5 * 1.0 * 2.0) ** (1 / 3))
    assert s.geomean == pytest.approx((2.5 * 1.0 * 2.0) ** (1 / 3))
    assert s.compile_geomean_s == pytest.approx((10.0 * 5.0 * 8.0) ** (1 / 3))
    assert s.compile_max_s == 10.0
    assert s.mem_ratio_mean == pytest.approx((100 / 50 + 100 / 125 + 100 / 40) / 3)
    assert s.mem_ratio_min == pytest.approx(0.8)


def test_compile_against_eager_and_eager_against_compile() -> None:
    s = get("infer", "compile", "eager")
    assert s.pass_text() == "80%, 4/5"  # d failed
    assert s.geomean == pytest.approx((2.0 * 1.25 * 2.5 * 5.0) ** 0.25)
    assert s.compile_geomean_s == pytest.approx((20.0 * 40.0 * 30.0 * 10.0) ** 0.25)
    assert s.compile_max_s == 40.0
    assert s.mem_ratio_mean == pytest.approx((1.25 + 1 + 1 + 1) / 4) and s.mem_ratio_min == pytest.approx(1.0)
    back = get("infer", "eager", "compile")
    assert back.pass_text() == "80%, 4/5"
    assert back.geomean_clipped == pytest.approx(1.0)  # every row a slowdown: the dashboard reads 1.0x
    assert back.geomean == pytest.approx((0.5 * 0.8 * 0.4 * 0.2) ** 0.25)
    assert back.compile_geomean_s is None and back.compile_max_s is None  # eager compiles nothing


def test_phases_are_summarized_apart() -> None:
    s = get("train", "compile+optimus", "compile")
    assert s.pass_text() == "100%, 1/1" and s.geomean == pytest.approx(2.0)
    no_eager = get("train", "compile+optimus", "eager")
    assert no_eager.pass_text() == "0%, 0/1" and no_eager.left_out == (("a/tiny", "eager missing"),)
    assert no_eager.geomean is None and no_eager.mem_ratio_mean is None


def test_the_percentage_is_rounded_as_the_dashboard_rounds() -> None:
    s = get("infer", "compile+optimus", "compile")
    five_of_eight = dataclasses.replace(s, total=8, passing=tuple("abcde"))
    seven_of_eight = dataclasses.replace(s, total=8, passing=tuple("abcdefg"))
    assert five_of_eight.pass_text() == "62%, 5/8"  # round(62.5) = 62, half to even
    assert seven_of_eight.pass_text() == "88%, 7/8"


def test_the_report_shows_the_section() -> None:
    text = markdown.render(hand_doc(), "t", [])
    assert "## Dashboard summaries" in text
    assert "| compile+optimus | compile | 40%, 2/5 | 1.12x | 1.00x | 7.1 s | 10.0 s | 1.20x | 0.80x |" in text
    assert "c/tiny (mismatch), d/tiny (compile failed), e/tiny (missing)" in text
    assert "the unclipped geomean is the honest one" in text


def test_a_file_without_a_baseline_has_no_section() -> None:
    only = synthetic.doc([cell("a", "compile+optimus", 4.0)])
    assert summaries.section(only) == ""


# --------------------------------------------------------------------------- the compare gate


def two_rows() -> list[dict[str, Any]]:
    return [cell(m, mode, ms) for m in "ab" for mode, ms in (("compile", 5.0), ("compile+optimus", 4.0))]


def _files(tmp_path: Path, base: list[dict[str, Any]], new: list[dict[str, Any]]) -> tuple[str, str]:
    paths = []
    for name, cells in (("base", base), ("new", new)):
        path = tmp_path / f"{name}.json"
        path.write_text(json.dumps(synthetic.doc(cells)))
        paths.append(str(path))
    return paths[0], paths[1]


def test_a_fall_in_pass_rate_is_a_regression_naming_the_cell(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    # every base cell is in the new run, unchanged: only the new row f, which mismatches, lowers it
    new = [*two_rows(), cell("f", "compile", 5.0), cell("f", "compile+optimus", None, status="mismatch")]
    rows = compare.pass_rate_rows(synthetic.doc(two_rows()), synthetic.doc(new))
    fell = [r for r in rows if r.verdict == "regression"]
    assert [r.cell for r in fell] == ["pass rate compile+optimus vs compile, infer"]
    assert fell[0].base == "100%, 2/2"
    assert fell[0].new == "67%, 2/3; stopped passing: f/tiny/compile+optimus/infer (mismatch)"
    base_path, new_path = _files(tmp_path, two_rows(), new)
    assert cli.main(["compare", base_path, new_path]) == exit_codes.REGRESSION
    out = capsys.readouterr()
    assert "f/tiny/compile+optimus/infer (mismatch)" in out.out and "**regression**" in out.out
    assert "pass rate 100%, 2/2 -> 67%, 2/3" in out.out  # the summary line
    assert "pass rate compile+optimus vs compile, infer fell" in out.err


def test_an_equal_pass_rate_is_not_a_regression(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    same = compare.pass_rate_rows(synthetic.doc(two_rows()), synthetic.doc(two_rows()))
    assert [r.verdict for r in same] == ["no change"]
    # a new row that passes keeps 100%: equal, not a regression
    more = [*two_rows(), cell("g", "compile", 5.0), cell("g", "compile+optimus", 4.0)]
    rows = compare.pass_rate_rows(synthetic.doc(two_rows()), synthetic.doc(more))
    assert [(r.base, r.new, r.verdict) for r in rows] == [("100%, 2/2", "100%, 3/3", "no change")]
    base_path, new_path = _files(tmp_path, two_rows(), more)
    assert cli.main(["compare", base_path, new_path]) == exit_codes.OK
    assert "dashboard summary, infer, compile+optimus vs compile" in capsys.readouterr().out


def test_a_base_cell_that_stops_passing_is_named_and_lost_data_still_wins(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    new = two_rows()
    new[3] = cell("b", "compile+optimus", None, status="mismatch")
    rows = compare.pass_rate_rows(synthetic.doc(two_rows()), synthetic.doc(new))
    assert rows[0].verdict == "regression" and "b/tiny/compile+optimus/infer (mismatch)" in rows[0].new
    base_path, new_path = _files(tmp_path, two_rows(), new)
    assert cli.main(["compare", base_path, new_path]) == exit_codes.INCOMPLETE
    err = capsys.readouterr().err.strip().splitlines()
    assert "fell from 100%, 2/2 to 50%, 1/2" in err[0] and "incomplete" in err[-1]


@pytest.mark.parametrize("run", ["medium/reproduce-medium", "large/reproduce-large", "tiny/reproduce-tiny"])
def test_the_committed_reference_reports_show_the_summaries_of_their_json(run: str) -> None:
    """Each committed report was regenerated from its JSON, so it holds the section as the JSON gives it."""
    from harness.env import REPO_ROOT
    from harness.store import results

    root = REPO_ROOT / "results"
    section = summaries.section(results.load(root / f"{run}.json"))
    assert section and section in (root / f"{run}.md").read_text()
