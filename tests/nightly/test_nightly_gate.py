"""The nightly gate: lost data is red with its own code, and inputs are checked before measuring.

No measurement: ``runner.run_suite`` / ``run_one`` are replaced by fakes returning seeded cells.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from harness import cli, exit_codes, nightly, results, runner
from tests.harness import synthetic

ARGV = ["nightly", "--models", "towers", "--modes", "compile", "--phases", "infer", "--no-asv",
        "--no-progress"]  # fmt: skip


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

    def fake_one(key: Any, cfg: Any, timeout: float) -> dict[str, Any]:
        calls.append("rerun")
        return cell()

    monkeypatch.setattr(runner, "run_suite", fake_suite)
    monkeypatch.setattr(runner, "run_one", fake_one)
    monkeypatch.setattr(nightly, "git_info", lambda: {"sha": "b" * 40, "dirty": False, "branch": "main"})
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
    assert nightly.last_good(history, tmp_path / "store") is None


def test_first_night_with_a_failed_cell_is_not_a_baseline(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    _fake_night(monkeypatch, "timeout")
    assert cli.main([*ARGV, "--store", str(tmp_path)]) == exit_codes.INCOMPLETE
    assert nightly.last_good(nightly.load_history(tmp_path), tmp_path) is None


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
    assert calls == []
