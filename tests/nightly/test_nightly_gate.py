"""The nightly gate: lost data is red with its own code, and inputs are checked before measuring.

No measurement: ``runner.run_suite`` / ``run_one`` are replaced by fakes returning seeded cells.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from harness import cli, exit_codes
from harness.nightly import job
from harness.run import runner
from harness.store import results
from tests.harness import synthetic

ARGV = ["nightly", "--models", "towers", "--modes", "compile", "--phases", "infer", "--no-asv", "--no-sharded",
        "--no-quality", "--no-progress"]  # fmt: skip


def _fake_night(monkeypatch: pytest.MonkeyPatch, status: str) -> list[str]:
    calls: list[str] = []

    def cell() -> dict[str, Any]:
        c = synthetic.cell("towers", "compile", "infer", 5.0, seed=len(calls), status=status)
        if status != "ok":
            c["latency_ms"] = None
        return c

    def fake_suite(cfg: Any, out: Any, **kw: Any) -> dict[str, Any]:
        calls.append("suite")
        d = {**synthetic.doc([cell()]), "config": cfg.as_dict()}
        results.save_atomic(out, d)
        return d

    def fake_one(key: Any, cfg: Any, timeout: float, peaks: Any = None) -> dict[str, Any]:
        calls.append("rerun")
        return cell()

    monkeypatch.setattr(runner, "run_suite", fake_suite)
    monkeypatch.setattr(runner, "run_one", fake_one)
    monkeypatch.setattr(job, "git_info", lambda: {"sha": "b" * 40, "dirty": False, "branch": "main"})
    return calls


def test_failed_cell_makes_an_incomplete_night_never_a_base(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    base = tmp_path / "base.json"
    base.write_text(json.dumps(synthetic.doc([synthetic.cell("towers", "compile", "infer", 5.0, seed=9)])))
    calls = _fake_night(monkeypatch, "failed")
    rc = cli.main([*ARGV, "--store", str(tmp_path / "store"), "--base", str(base)])
    assert rc == exit_codes.INCOMPLETE
    assert calls == ["suite", "rerun"]  # a failed cell is measured again before it counts
    history = json.loads((tmp_path / "store" / "history.json").read_text())
    assert [r["status"] for r in history["runs"]] == ["incomplete"]
    assert job.last_good(history, tmp_path / "store") is None


def test_first_night_with_a_failed_cell_is_not_a_baseline(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    _fake_night(monkeypatch, "timeout")
    assert cli.main([*ARGV, "--store", str(tmp_path)]) == exit_codes.INCOMPLETE
    assert job.last_good(job.load_history(tmp_path), tmp_path) is None


def test_bad_base_and_store_are_refused_before_measuring(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    calls = _fake_night(monkeypatch, "ok")
    (tmp_path / "bad.json").write_text("{")
    assert cli.main([*ARGV, "--store", str(tmp_path / "s"), "--base", str(tmp_path / "bad.json")]) == 2
    assert "bad.json: corrupt results file" in capsys.readouterr().err
    (tmp_path / "plain").write_text("x")
    assert cli.main([*ARGV, "--store", str(tmp_path / "plain" / "store")]) == exit_codes.BAD_INPUT
    assert "--store" in capsys.readouterr().err
    (tmp_path / "s2").mkdir()
    (tmp_path / "s2" / "history.jsonl").write_text('{"schema": 9, "kind": "optimus-bench-night"}\n')
    assert cli.main([*ARGV, "--store", str(tmp_path / "s2")]) == exit_codes.BAD_INPUT
    assert "history.jsonl:1: history schema 9 is not supported" in capsys.readouterr().err
    assert calls == []


# --------------------------------------------------------------------------- change points in the nightly


def _history(store: Path, medians: list[float], flagged_from: int | None = None) -> None:
    """Nights of one machine (synthetic.doc's env) with the given towers medians."""
    from harness.store import history_store

    for i, m in enumerate(medians):
        doc = synthetic.doc([synthetic.cell("towers", "compile", "infer", m, seed=100 + i)])
        flagged = (
            [["towers/tiny/compile/infer", "latency_ms"]]
            if flagged_from is not None and i >= flagged_from
            else []
        )
        history_store.append(
            store / "history.jsonl", doc, {"sha": f"{i:02d}" * 20, "status": "pass", "flagged": flagged}
        )


def _tonight(monkeypatch: pytest.MonkeyPatch, median: float) -> None:
    def cell() -> dict[str, Any]:
        return synthetic.cell("towers", "compile", "infer", median, seed=7)

    def fake_suite(cfg: Any, out: Any, **kw: Any) -> dict[str, Any]:
        d = {**synthetic.doc([cell()]), "config": cfg.as_dict()}
        results.save_atomic(out, d)
        return d

    monkeypatch.setattr(runner, "run_suite", fake_suite)
    monkeypatch.setattr(runner, "run_one", lambda *a: cell())
    monkeypatch.setattr(job, "git_info", lambda: {"sha": "c" * 40, "dirty": False, "branch": "main"})


def _base(tmp_path: Path) -> str:
    p = tmp_path / "base.json"
    p.write_text(json.dumps(synthetic.doc([synthetic.cell("towers", "compile", "infer", 5.0, seed=99)])))
    return str(p)


def test_pairwise_flag_alone_with_enough_history_is_recorded_not_alerted(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    store = tmp_path / "store"
    _history(store, [5.0] * 12)
    _tonight(monkeypatch, 6.5)  # +30% tonight only: one night is no change point yet
    assert cli.main([*ARGV, "--store", str(store), "--base", _base(tmp_path)]) == exit_codes.OK
    out = capsys.readouterr().out
    assert "# Nightly FLAGGED" in out and "## Change points over the history" in out
    history = job.load_history(store)
    assert [r["status"] for r in history["runs"]] == ["flagged"]
    assert job.last_good(history, store) is None  # never a base: the next night is judged against 5.0


def test_short_history_keeps_the_pairwise_gate(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    store = tmp_path / "store"
    _history(store, [5.0] * 2)
    _tonight(monkeypatch, 6.5)
    assert cli.main([*ARGV, "--store", str(store), "--base", _base(tmp_path)]) == exit_codes.REGRESSION


def test_step_seen_by_detector_and_pairwise_gate_alerts(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    store = tmp_path / "store"
    _history(store, [5.0] * 14 + [6.5], flagged_from=14)  # last night already +30% and flagged
    _tonight(monkeypatch, 6.5)
    assert cli.main([*ARGV, "--store", str(store), "--base", _base(tmp_path)]) == exit_codes.REGRESSION
    out = capsys.readouterr().out
    assert "**ALERT tonight (agree)**" in out
    assert "1313131313..1414141414" in out  # the commit range where it starts
    from harness.store import history_store

    nights = history_store.read(store / "history.jsonl")
    assert len(nights) == 16 and nights[-1].night["status"] == "regression"
