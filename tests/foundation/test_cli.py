"""The console script answers --version and --help."""

from __future__ import annotations

import subprocess
import sys

import pytest

from harness import cli


def test_version(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exc:
        cli.main(["--version"])
    assert exc.value.code == 0
    assert capsys.readouterr().out.startswith("optimus-bench ")


def test_help_runs_as_module() -> None:
    out = subprocess.run(
        [sys.executable, "-m", "harness.cli", "--help"], capture_output=True, text=True, check=True
    )
    assert "optimus-bench" in out.stdout
