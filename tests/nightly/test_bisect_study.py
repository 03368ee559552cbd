"""The bisect study (harness.nightly.bisect_study): one synthetic history bisected for real, the
pooled rate and its interval, and bad arguments refused."""

from __future__ import annotations

import json
import random
from pathlib import Path

import pytest

from harness.nightly import bisect_study
from harness.run.paired import PairOptions

FAST = PairOptions(rounds=6, max_rounds=6, steps=3, warmup=1, processes=1, max_processes=1, compiles=1,
                   process_spread=10.0)  # fmt: skip


def test_a_large_slowdown_is_located_in_a_real_history() -> None:
    # 2x: six rounds must tell it from GOOD on a loaded machine too (the study's 3% and 5% are
    # what results/paired-noise measures)
    rec = bisect_study.one_history(1.0, 5, 2.0, FAST, 0.02, random.Random(3), lambda _: None)
    assert 1 <= rec["slow_from"] <= 4
    assert rec["located"] is True and rec["named"] == rec["slow_from"], rec
    assert rec["steps"] >= 2 and all(r > 0 for r in rec["ratios"])


def test_summary_counts_located_histories_with_an_exact_interval() -> None:
    runs = [{"slowdown": 0.03, "located": x, "named": n, "wall_s": 10.0}
            for x, n in [(True, 3), (True, 5), (False, 2), (False, None), (None, None)]]  # fmt: skip
    s = bisect_study.summary(runs)["3%"]
    assert (s["histories"], s["located"], s["missed_bad"]) == (4, 2, 1)  # the worker failure is not counted
    assert s["rate"] == 0.5
    lo, hi = s["ci95"]
    assert 0.05 < lo < 0.5 < hi < 0.95


def test_summarize_reads_a_study_file(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    runs = [{"slowdown": 0.05, "located": True, "named": 4, "wall_s": 12.0}]
    out = tmp_path / "study.json"
    out.write_text(json.dumps({"summary": bisect_study.summary(runs)}))
    assert bisect_study.main(["--summarize", "--out", str(out)]) == 0
    assert "| 5% | 1 | 1 | 100%" in capsys.readouterr().out


@pytest.mark.parametrize("argv", [["--histories", "0"], ["--slowdowns", "fast"], ["--slowdowns", "-0.1"]])
def test_bad_arguments_are_refused(argv: list[str]) -> None:
    with pytest.raises(SystemExit) as e:
        bisect_study.main(argv)
    assert e.value.code == 2
