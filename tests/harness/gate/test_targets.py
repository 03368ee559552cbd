"""`optimus-bench targets` (harness/gate/targets.py) judges the issue-7 goals from results files: met, missed, no data."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import synthetic

from harness import cli, exit_codes
from harness.gate import targets as perf_targets


def _cells(scale: str, opt_ms: float, opt_compile_s: float, peer_status: str = "ok") -> list[dict[str, Any]]:
    out = []
    for i, (mode, ms, cs) in enumerate(
        [
            ("eager", 12.0, 0.0),
            ("eager+optimus", 8.0, 5.0),
            ("compile", 10.0, 100.0),
            ("compile+peer", 11.0, 120.0),
            ("compile+optimus", opt_ms, opt_compile_s),
        ]
    ):
        status = peer_status if mode == "compile+peer" else "ok"
        out.append(
            synthetic.cell("towers", mode, "infer", ms, seed=i, scale=scale, compile_s=cs, status=status)
        )
    return out


def _by_target(found: list[perf_targets.Verdict], cell: str) -> dict[str, bool | None]:
    return {v.target: v.met for v in found if v.cell == cell}


def test_fast_optimus_meets_and_slow_optimus_misses() -> None:
    fast = synthetic.doc(_cells("large", 5.0, 40.0))
    got = _by_target(perf_targets.verdicts([fast]), "towers large infer")
    assert got["speedup vs compile >= 1.6x"] is True  # 10 / 5 = 2x
    assert got["compile time <= 50% of compile"] is True  # 40 s vs 100 s
    assert got["ahead of compile+peer (latency)"] is True
    assert got["eager+optimus >= 1.3x eager"] is True  # 12 / 8

    slow = synthetic.doc(_cells("large", 10.6, 90.0))
    got = _by_target(perf_targets.verdicts([slow]), "towers large infer")
    assert got["speedup vs compile >= 1.6x"] is False
    assert got["compile time <= 50% of compile"] is False
    assert got["no cell below 0.97x of compile"] is False  # 10 / 10.6 = 0.94x


def test_a_peer_that_did_not_match_eager_gives_no_verdict(tmp_path: Path, capsys: Any) -> None:
    doc = synthetic.doc(_cells("medium", 5.0, 40.0, peer_status="mismatch"))
    path = tmp_path / "r.json"
    path.write_text(json.dumps(doc))
    out_json = tmp_path / "verdicts.json"
    assert cli.main(["targets", str(path), "--json", str(out_json)]) == exit_codes.OK
    text = capsys.readouterr().out
    assert "| ahead of compile+peer (latency) | towers medium infer | peer mismatch | no data |" in text
    saved = json.loads(out_json.read_text())
    assert {"target", "cell", "figure", "met"} <= set(saved[0])
    assert not any(v["target"].startswith("compile time") for v in saved)  # a large-scale goal only


def test_targets_refuses_an_unreadable_results_file(tmp_path: Path, capsys: Any) -> None:
    assert cli.main(["targets", str(tmp_path / "missing.json")]) == exit_codes.BAD_INPUT
    assert "optimus-bench targets: error:" in capsys.readouterr().err
