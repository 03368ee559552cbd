"""The nightly history store: torn write, concurrent writers, machine and schema mismatch.

Each case ends in a clear message and loses nothing: a torn line is moved aside byte for
byte, two writers in two processes both land, another machine is named and left out, and a
line of another schema is refused without touching the file.
"""

from __future__ import annotations

import json
import multiprocessing
import warnings
from pathlib import Path
from typing import Any

import pytest

from harness import cli, exit_codes
from harness.store import cell_record, history_store
from tests.harness import synthetic


def _doc(
    median_ms: float = 5.0, seed: int = 1, cpu: str = "cpu A", torch: str = "2.13.0+cpu"
) -> dict[str, Any]:
    d = synthetic.doc([synthetic.cell("towers", "compile", "infer", median_ms, seed=seed)])
    d["env"].update(cpu=cpu, cpu_count=2, python="3.11.7", versions={"torch": torch})
    return d


def _night(sha: str) -> dict[str, Any]:
    return {"sha": sha, "date": "2026-12-01", "status": "pass"}


def test_append_and_read_round_trip(tmp_path: Path) -> None:
    path = tmp_path / "history.jsonl"
    for i in range(3):
        history_store.append(path, _doc(seed=i), _night(f"{i}" * 40))
    nights = history_store.read(path)
    assert [n.night["sha"][0] for n in nights] == ["0", "1", "2"]
    assert [n.line for n in nights] == [1, 2, 3]
    assert nights[0].results == cell_record.validate(_doc(seed=0))


def test_compare_reads_a_night_of_the_history(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = tmp_path / "history.jsonl"
    history_store.append(path, _doc(5.0, seed=1), _night("a" * 40))
    history_store.append(path, _doc(6.0, seed=2), _night("b" * 40))
    assert cli.main(["compare", f"{path}:0", f"{path}:-1"]) == exit_codes.REGRESSION
    assert "**regression**" in capsys.readouterr().out
    assert cli.main(["compare", f"{path}:0", f"{path}:5"]) == exit_codes.BAD_INPUT
    assert "no night 5 (the history holds 2)" in capsys.readouterr().err


def test_torn_last_line_is_dropped_with_a_warning_and_kept_aside(tmp_path: Path) -> None:
    path = tmp_path / "history.jsonl"
    history_store.append(path, _doc(seed=1), _night("a" * 40))
    whole = path.read_bytes()
    history_store.append(path, _doc(seed=2), _night("b" * 40))
    torn = path.read_bytes()[: len(whole) + 100]  # a crash 100 bytes into the second line
    path.write_bytes(torn)
    with pytest.warns(history_store.TornLineWarning, match="last line is torn"):
        nights = history_store.read(path)
    assert [n.night["sha"] for n in nights] == ["a" * 40]
    with pytest.warns(history_store.TornLineWarning, match="moved to"):
        history_store.append(path, _doc(seed=3), _night("c" * 40))
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # the file is whole again: no warning
        assert [n.night["sha"][0] for n in history_store.read(path)] == ["a", "c"]
    aside = list(tmp_path.glob("history.jsonl.torn-*"))
    assert len(aside) == 1 and aside[0].read_bytes() == torn[len(whole) :]  # nothing lost


def _writer(path: str, worker: int, n: int) -> None:
    for i in range(n):
        history_store.append(path, _doc(seed=worker * 100 + i), _night(f"{worker}{i:039d}"))


def test_two_processes_appending_at_once_lose_nothing(tmp_path: Path) -> None:
    path = tmp_path / "history.jsonl"
    ctx = multiprocessing.get_context("spawn")
    procs = [ctx.Process(target=_writer, args=(str(path), w, 15)) for w in (1, 2)]
    for p in procs:
        p.start()
    for p in procs:
        p.join(120)
        assert p.exitcode == 0
    nights = history_store.read(path)
    assert len(nights) == 30
    assert sorted(n.night["sha"] for n in nights) == sorted(f"{w}{i:039d}" for w in (1, 2) for i in range(15))


def test_other_machine_or_torch_never_joins_a_series_silently(tmp_path: Path) -> None:
    path = tmp_path / "history.jsonl"
    history_store.append(path, _doc(seed=1), _night("a" * 40))
    history_store.append(path, _doc(seed=2, cpu="cpu B"), _night("b" * 40))
    history_store.append(path, _doc(seed=3, torch="2.14.0+cpu"), _night("c" * 40))
    history_store.append(path, _doc(seed=4), _night("d" * 40))
    here = history_store.machine_key(_doc()["env"])
    same, left_out = history_store.select(history_store.read(path), here)
    assert [n.night["sha"][0] for n in same] == ["a", "d"]
    assert sorted(left_out) == [
        "1 night(s) left out, another machine: cpu 'cpu B' (here 'cpu A')",
        "1 night(s) left out, another machine: torch '2.14.0+cpu' (here '2.13.0+cpu')",
    ]


def test_other_schema_is_refused_and_nothing_is_changed(tmp_path: Path) -> None:
    path = tmp_path / "history.jsonl"
    history_store.append(path, _doc(seed=1), _night("a" * 40))
    rec = json.loads(path.read_text())
    rec["schema"] = history_store.SCHEMA + 1
    path.write_text(path.read_text() + json.dumps(rec) + "\n")
    before = path.read_bytes()
    with pytest.raises(
        history_store.HistoryError, match=r"history\.jsonl:2: history schema 2 is not supported"
    ):
        history_store.read(path)
    with pytest.raises(history_store.HistoryError, match="history schema 2 is not supported"):
        history_store.append(path, _doc(seed=2), _night("b" * 40))
    assert path.read_bytes() == before


def test_damage_before_the_end_is_an_error_not_a_warning(tmp_path: Path) -> None:
    path = tmp_path / "history.jsonl"
    history_store.append(path, _doc(seed=1), _night("a" * 40))
    path.write_text("{not json\n" + path.read_text())
    with pytest.raises(history_store.HistoryError, match=r"history\.jsonl:1: not a JSON line"):
        history_store.read(path)


def test_asv_reads_the_night_of_its_commit_from_the_history(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from benchmarks import common

    path = tmp_path / "history.jsonl"
    for sha, median in (("a" * 40, 5.0), ("b" * 40, 7.0), ("c" * 40, 9.0)):
        doc = _doc(median)
        doc["env"]["git"] = {"sha": sha, "dirty": False}
        history_store.append(path, doc, _night(sha))
    with path.open("ab") as f:
        f.write(b'{"schema": 1, "kind": "optimus-bench-ni')  # a torn last line
    monkeypatch.setenv("OPTIMUS_ASV_CELLS", str(path))
    monkeypatch.setenv("ASV_COMMIT", "b" * 40)
    cells = common.given_cells(["towers"], ["tiny"], ["compile"], ["infer"])
    assert cells is not None and cells[0]["latency_ms"]["median"] == pytest.approx(7.0, rel=0.1)
