"""`optimus-bench targets --goals cpu-large` (harness/gate/targets_cpu_large.py): the CPU goals at
large scale judged from results files, including the limit-relative inference goal and the memory
ceiling and floor."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import synthetic

from harness import cli, exit_codes
from harness.gate import targets_cpu_large


def _cells(model: str, phase: str, opt_ms: float, *, scale: str = "large", opt_mem: int = 10_000_000,
           peak_at: str = "compiled graph", ideal_ms: float | None = None) -> list[dict[str, Any]]:  # fmt: skip
    out = []
    modes = [("eager", 12.0, 0.0), ("eager+optimus", 7.0, 5.0), ("compile", 10.0, 100.0),
             ("compile+peer", 11.0, 120.0), ("compile+optimus", opt_ms, 40.0)]  # fmt: skip
    for i, (mode, ms, cs) in enumerate(modes):
        mem = opt_mem if mode == "compile+optimus" else 10_000_000
        c = synthetic.cell(model, mode, phase, ms, seed=i, scale=scale, compile_s=cs, mem=mem)
        c["peak_mem_at"] = peak_at
        if mode == "compile" and ideal_ms is not None:
            c["limit"] = {"ideal_ms": ideal_ms, "ideal_speedup": 10.0 / ideal_ms, "groups": 1, "members": 4}
        out.append(c)
    return out


def _got(cells: list[dict[str, Any]], cell: str) -> dict[str, bool | None]:
    found = targets_cpu_large.verdicts([synthetic.doc(cells)])
    return {v.target: v.met for v in found if v.cell == cell}


INFER = "infer >= 1.6x, or >= 90% of the headroom under a lower limit"


def test_a_fast_inference_cell_meets_its_goals_and_equal_memory_misses_the_floor() -> None:
    got = _got(_cells("towers", "infer", 5.0), "towers large infer")
    assert got[INFER] is True  # 10 / 5 = 2x
    assert got["compile time <= 0.5x of compile"] is True  # 40 s vs 100 s
    assert got["eager+optimus >= 1.5x eager"] is True  # 12 / 7
    assert got["ahead of compile+peer (peer matches eager)"] is True
    assert got["no cell below 0.97x of compile"] is True
    assert got["peak memory <= 1.02x of compile"] is True
    assert got["peak memory <= 0.94x of compile (dense peak)"] is False  # the same bytes


def test_inference_under_a_lower_limit_is_judged_by_the_headroom_captured() -> None:
    # limit 10 / 8 = 1.25x: 8.05 ms captures ~97% of the 2 ms headroom, 9.0 ms ~50%
    assert _got(_cells("mmoe", "infer", 8.05, ideal_ms=8.0), "mmoe large infer")[INFER] is True
    assert _got(_cells("mmoe", "infer", 9.0, ideal_ms=8.0), "mmoe large infer")[INFER] is False
    # no limit measured: 1.1x cannot meet the goal
    assert _got(_cells("mmoe", "infer", 9.0), "mmoe large infer")[INFER] is False


def test_training_goals_differ_by_family() -> None:
    assert _got(_cells("dlrm", "train", 8.3), "dlrm large train")["train >= 1.15x"] is True  # 1.2x
    assert _got(_cells("towers", "train", 8.3), "towers large train")["train >= 1.3x"] is False


def test_memory_ceiling_everywhere_and_no_floor_when_the_peak_is_in_an_embedding() -> None:
    cells = _cells("dlrm", "train", 8.0, opt_mem=10_300_000, peak_at="EmbeddingBagBackward0 > aten::resize_")
    got = _got(cells, "dlrm large train")
    assert got["peak memory <= 1.02x of compile"] is False  # +3%
    assert "peak memory <= 0.94x of compile (dense peak)" not in got
    lower = _got(_cells("dcn", "infer", 8.0, opt_mem=9_000_000), "dcn large infer")
    assert lower["peak memory <= 0.94x of compile (dense peak)"] is True  # -10%


def test_cli_judges_cpu_large_and_medium_gets_only_memory_goals(tmp_path: Path, capsys: Any) -> None:
    path = tmp_path / "r.json"
    path.write_text(json.dumps(synthetic.doc(_cells("towers", "infer", 5.0, scale="medium"))))
    out_json = tmp_path / "verdicts.json"
    assert cli.main(["targets", "--goals", "cpu-large", str(path), "--json", str(out_json)]) == exit_codes.OK
    assert "| peak memory <= 1.02x of compile | towers medium infer |" in capsys.readouterr().out
    saved = json.loads(out_json.read_text())
    assert {v["target"] for v in saved} == {
        "peak memory <= 1.02x of compile",
        "peak memory <= 0.94x of compile (dense peak)",
    }
