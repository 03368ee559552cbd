"""Malformed results files (tests/harness/store/malformed/): one line naming the field, a non-zero exit
that says what went wrong, and never a traceback, for every command that reads them.

Each file is ``good.json`` with one thing broken. A NaN or inf figure is lost data (exit 3, as
docs/harness.md "Exit codes" says for any command reading a file holding NaN/inf); every other
problem is bad input (exit 2).
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from harness import cli, exit_codes
from harness.env import REPO_ROOT
from harness.run import runner
from harness.store import history_store

HERE = Path(__file__).parent / "malformed"
GOOD = str(HERE / "good.json")

# file -> (exit status, what the one line must say)
CASES: dict[str, tuple[int, str]] = {
    "string-median.json": (
        exit_codes.BAD_INPUT,
        "cells[0].latency_ms.median: has type str, must be a number",
    ),
    "missing-field.json": (exit_codes.BAD_INPUT, "cells[0]: missing field 'status'"),
    "wrong-nesting-latency.json": (
        exit_codes.BAD_INPUT,
        "cells[0].latency_ms: has type list, must be an object",
    ),
    "wrong-nesting-cells.json": (exit_codes.BAD_INPUT, "field 'cells' must be a list, got dict"),
    "wrong-nesting-cell.json": (exit_codes.BAD_INPUT, "cells[0]: missing field 'model'"),
    "bool-figure.json": (exit_codes.BAD_INPUT, "cells[0].compile_s: has type bool, must be a number"),
    "string-samples.json": (
        exit_codes.BAD_INPUT,
        "cells[0].latency_ms.samples: must be a list of finite numbers",
    ),
    "env-git-string.json": (exit_codes.BAD_INPUT, "env.git: has type str, must be an object"),
    "schema-2.json": (exit_codes.BAD_INPUT, "schema version 2 is not supported"),
    "top-level-list.json": (exit_codes.BAD_INPUT, "top level must be a JSON object, got list"),
    "not-json.json": (exit_codes.BAD_INPUT, "corrupt results file (not valid JSON"),
    "non-finite-median.json": (exit_codes.BAD_INPUT, "cells[0].latency_ms.median: must be a finite number"),
    "non-finite-overflow.json": (exit_codes.BAD_INPUT, "cells[0].compile_s: must be a finite number"),
}

# the same files as the results document of a history line (``changes``, ``nightly``): always exit 2
IN_HISTORY: dict[str, str] = {
    "string-median.json": "results.cells[0].latency_ms.median: has type str, must be a number",
    "missing-field.json": "results.cells[0]: missing field 'status'",
    "wrong-nesting-latency.json": "results.cells[0].latency_ms: has type list, must be an object",
    "wrong-nesting-cells.json": "results.cells: has type dict, must be a list",
    "wrong-nesting-cell.json": "results.cells[0]: missing field 'model'",
    "bool-figure.json": "results.cells[0].compile_s: has type bool, must be a number",
    "string-samples.json": "results.cells[0].latency_ms.samples: must be a list of finite numbers",
    "env-git-string.json": "results.env.git: has type str, must be an object",
    "schema-2.json": "results: schema version 2 is not supported",
    "top-level-list.json": "field 'results' must be an object, got list",
    "not-json.json": "not a JSON line",
    "non-finite-median.json": "results.cells[0].latency_ms.median: must be a finite number",
    "non-finite-overflow.json": "results.cells[0].compile_s: must be a finite number",
}


def _one_line(err: str) -> str:
    lines = err.strip().splitlines()
    assert len(lines) == 1, err
    assert "Traceback" not in err
    return lines[0]


def _check(rc: int, err: str, name: str, command: str) -> None:
    code, says = CASES[name]
    line = _one_line(err)
    assert rc == code, line
    assert line.startswith(f"optimus-bench {command}: ") and says in line, line


def test_every_fixture_has_a_case() -> None:
    names = sorted(p.name for p in HERE.glob("*.json") if p.name != "good.json")
    assert sorted(CASES) == names == sorted(IN_HISTORY)


@pytest.mark.parametrize("name", sorted(CASES))
@pytest.mark.parametrize("side", ["new", "base"])
def test_compare(name: str, side: str, capsys: pytest.CaptureFixture[str]) -> None:
    bad = str(HERE / name)
    rc = cli.main(["compare", GOOD, bad] if side == "new" else ["compare", bad, GOOD])
    captured = capsys.readouterr()
    _check(rc, captured.err, name, "compare")
    assert name in captured.err and not captured.out


@pytest.mark.parametrize("name", sorted(CASES))
def test_report(name: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    bad = tmp_path / name
    bad.write_bytes((HERE / name).read_bytes())
    rc = cli.main(["report", str(bad)])
    _check(rc, capsys.readouterr().err, name, "report")
    assert [p.name for p in tmp_path.iterdir()] == [name], "nothing written"


def _history(tmp_path: Path, name: str) -> Path:
    """A history whose one line holds the malformed document as its results (a line that is not
    JSON stays not JSON)."""
    text = (HERE / name).read_text()
    try:
        doc: Any = json.loads(text)
    except json.JSONDecodeError:
        line = text.replace("\n", " ")
    else:
        machine = {k: None for k in history_store.MACHINE_FIELDS}
        rec = {"schema": 1, "kind": history_store.KIND, "machine": machine, "night": {"sha": "0" * 40},
               "results": doc}  # fmt: skip
        line = json.dumps(rec)
    path = tmp_path / "store" / "history.jsonl"
    path.parent.mkdir()
    path.write_text(line + "\n")
    return path


@pytest.mark.parametrize("name", sorted(CASES))
def test_changes_reading_history(name: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    rc = cli.main(["changes", str(_history(tmp_path, name))])
    line = _one_line(capsys.readouterr().err)
    assert rc == exit_codes.BAD_INPUT and f"history.jsonl:1: {IN_HISTORY[name]}" in line, line


@pytest.mark.parametrize("name", ["string-median.json", "missing-field.json", "non-finite-median.json"])
def test_nightly_reading_history(
    name: str, tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    def measured(*args: Any, **kw: Any) -> Any:
        raise AssertionError("measured before the history was checked")

    monkeypatch.setattr(runner, "run_suite", measured)
    store = _history(tmp_path, name).parent
    argv = ["nightly", "--models", "towers", "--modes", "compile", "--phases", "infer", "--no-asv",
            "--no-sharded", "--no-progress", "--store", str(store)]  # fmt: skip
    rc = cli.main(argv)
    line = _one_line(capsys.readouterr().err)
    assert rc == exit_codes.BAD_INPUT and f"history.jsonl:1: {IN_HISTORY[name]}" in line, line


@pytest.mark.parametrize("name", ["string-median.json", "non-finite-median.json"])
def test_nightly_base(name: str, tmp_path: Path, capsys: pytest.CaptureFixture[str],
                      monkeypatch: pytest.MonkeyPatch) -> None:  # fmt: skip
    monkeypatch.setattr(
        runner, "run_suite", lambda *a, **k: pytest.fail("measured before --base was checked")
    )
    argv = ["nightly", "--models", "towers", "--modes", "compile", "--phases", "infer", "--no-asv",
            "--no-sharded", "--no-progress", "--store", str(tmp_path / "store"), "--base", str(HERE / name)]  # fmt: skip
    _check(cli.main(argv), capsys.readouterr().err, name, "nightly")


def test_the_installed_command_says_one_line() -> None:
    """The real entry point, in its own process: what CI sees."""
    proc = subprocess.run(
        [sys.executable, "-m", "harness.cli", "compare", GOOD, str(HERE / "string-median.json")],
        cwd=REPO_ROOT, capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    _check(proc.returncode, proc.stderr, "string-median.json", "compare")
    assert proc.stdout == ""
