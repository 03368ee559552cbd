"""compare: a 10% slowdown in realistic noise is flagged, the same distribution is not."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from harness import cli, stats
from harness.gate import compare
from tests.harness import synthetic


def _pair(base_ms: float, new_ms: float, seed: int, **kw) -> tuple[dict, dict]:
    base = synthetic.doc([synthetic.cell("towers", "compile", "infer", base_ms, seed=seed, **kw)])
    new = synthetic.doc([synthetic.cell("towers", "compile", "infer", new_ms, seed=seed + 1000, **kw)])
    return base, new


def _latency_verdict(rows: list[compare.Row]) -> str:
    return next(r.verdict for r in rows if r.metric == "latency_ms")


def test_mann_whitney_matches_known_values() -> None:
    # Identical samples: no evidence of a difference.
    assert stats.mann_whitney_u([1, 2, 3, 4], [1, 2, 3, 4])[1] == pytest.approx(1.0)
    # Complete separation of 10 vs 10: U = 0 and a tiny two-sided p (exact ~1.1e-5, normal approx ~1.8e-4).
    u, p = stats.mann_whitney_u(list(range(10)), list(range(10, 20)))
    assert u == 0.0
    assert p < 5e-4
    with pytest.raises(ValueError, match="at least one sample"):
        stats.mann_whitney_u([], [1.0])


@pytest.mark.parametrize("seed", range(10))
def test_ten_percent_slowdown_is_flagged(seed: int) -> None:
    base, new = _pair(5.0, 5.5, seed)
    rows = compare.compare_docs(base, new)
    assert _latency_verdict(rows) == "regression"
    assert compare.has_regression(rows)


def test_same_distribution_is_not_flagged() -> None:
    flagged = 0
    for seed in range(40):
        base, new = _pair(5.0, 5.0, seed)
        rows = compare.compare_docs(base, new)
        flagged += compare.has_regression(rows)
    assert flagged == 0


def test_small_real_change_below_threshold_is_not_flagged() -> None:
    base, new = _pair(5.0, 5.1, 3, n=400)  # 2%: significant with 400 samples, but below the 5% effect
    rows = compare.compare_docs(base, new)
    row = next(r for r in rows if r.metric == "latency_ms")
    assert row.p_value is not None and row.p_value < 0.01
    assert row.verdict == "no change"


def test_speedup_is_an_improvement_and_ci_brackets_ratio() -> None:
    base, new = _pair(5.0, 4.0, 7)
    row = next(r for r in compare.compare_docs(base, new) if r.metric == "latency_ms")
    assert row.verdict == "improvement"
    assert row.ci is not None and row.ci[0] < 0.8 < row.ci[1] + 0.03


def test_memory_compile_and_status_rules() -> None:
    base, new = _pair(5.0, 5.0, 1)
    new["cells"][0]["peak_mem_bytes"] = int(base["cells"][0]["peak_mem_bytes"] * 1.10)
    new["cells"][0]["compile_s"] = base["cells"][0]["compile_s"] * 0.5
    rows = {r.metric: r for r in compare.compare_docs(base, new)}
    assert rows["peak_mem_bytes"].verdict == "regression"
    assert rows["compile_s"].verdict == "improvement"
    new["cells"][0].update(status="mismatch", error="outputs differ")
    rows2 = compare.compare_docs(base, new)
    assert [(r.metric, r.verdict) for r in rows2] == [("status", "failed")]  # lost data, not a verdict
    rows3 = compare.compare_docs(base, synthetic.doc([]))
    assert [r.verdict for r in rows3] == ["missing"]


def test_compare_cli_exit_status(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    base, new = _pair(5.0, 5.5, 11)
    same = _pair(5.0, 5.0, 11)[1]
    for name, d in (("base", base), ("new", new), ("same", same)):
        (tmp_path / f"{name}.json").write_text(json.dumps(d))
    assert cli.main(["compare", str(tmp_path / "base.json"), str(tmp_path / "new.json")]) == 1
    assert "**regression**" in capsys.readouterr().out
    assert cli.main(["compare", str(tmp_path / "base.json"), str(tmp_path / "same.json")]) == 0
    (tmp_path / "bad.json").write_text("{")
    assert cli.main(["compare", str(tmp_path / "base.json"), str(tmp_path / "bad.json")]) == 2
    assert "corrupt results file" in capsys.readouterr().err


def test_bootstrap_is_seeded() -> None:
    rng = np.random.default_rng(0)
    a, b = list(rng.normal(10, 1, 30)), list(rng.normal(11, 1, 30))
    assert stats.bootstrap_median_ratio(a, b) == stats.bootstrap_median_ratio(a, b)


def _paired(new: dict, lo: float, hi: float, stable: bool = True) -> dict:
    """``new`` with its cell given a pair's figures (ratio is new time over base time)."""
    cell = new["cells"][0]
    cell.update(
        base_sha="a" * 40, new_sha="b" * 40, paired_ratio=(lo + hi) / 2, paired_ci95=[lo, hi],
        paired={"threshold": 0.02, "stable": stable, "verdict": "x", "base": {"ms": [5.0, 5.0], "compile_s": [10.0, 11.0, 12.0]},
                "new": {"ms": [5.5, 5.5], "compile_s": [30.0, 31.0, 32.0]}},
    )  # fmt: skip
    return new


@pytest.mark.parametrize(
    ("lo", "hi", "stable", "verdict"),
    [(1.03, 1.06, True, "regression"), (1.01, 1.04, True, "no change"), (0.95, 0.97, True, "improvement"),
     (1.03, 1.06, False, "unstable")],
)  # fmt: skip
def test_a_paired_cell_is_judged_by_its_interval_not_by_the_two_files(
    lo: float, hi: float, stable: bool, verdict: str
) -> None:
    """The two files' samples are identical here: only the pair's interval can flag the cell."""
    base, new = _pair(5.0, 5.0, 0)
    rows = compare.compare_docs(base, _paired(new, lo, hi, stable))
    row = next(r for r in rows if r.metric == "latency_ms")
    assert row.verdict == verdict and row.ci == (lo, hi) and row.p_value is None
    assert "| paired |" in compare.format_rows(rows)


def test_a_paired_cell_s_compile_time_is_the_pair_s() -> None:
    base, new = _pair(5.0, 5.0, 0, compile_s=10.0)
    new["cells"][0]["compile_s"] = 10.0  # the files agree; the pair's compiles (11 -> 31 s) do not
    rows = compare.compare_docs(base, _paired(new, 0.99, 1.01))
    row = next(r for r in rows if r.metric == "compile_s")
    assert (row.base, row.new, row.verdict) == (11.0, 31.0, "regression")
