"""The newest-Triton job (scripts/test-newest-triton, ``tox -e triton-newest``) stays wired up.

Why: the job installs into its own venv, so the default run never executes it; these checks (no
install, no network) catch the script naming a test file that moved, installing triton with its
dependencies (which may pull another torch), or the tox env slipping into the default envlist.
"""

from __future__ import annotations

import configparser
import re
import subprocess
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = ROOT / "scripts" / "test-newest-triton"


def test_script_is_valid_bash_and_executable() -> None:
    subprocess.run(["bash", "-n", str(SCRIPT)], check=True)
    assert SCRIPT.stat().st_mode & 0o111


def test_script_runs_test_files_that_exist() -> None:
    named = re.findall(r"tests/\S+\.py", SCRIPT.read_text())
    assert "tests/optimus/kernels/test_grouped_linear_kernel.py" in named
    for path in named:
        assert (ROOT / path).is_file(), path


def test_script_keeps_the_pinned_torch() -> None:
    text = SCRIPT.read_text()
    assert "pin torch cpu.txt" in text  # the torch pin is read from the recipe, not copied
    assert re.search(r'--no-deps "triton==', text)


def test_tox_env_runs_the_script_outside_the_default_envlist() -> None:
    tox = configparser.ConfigParser(interpolation=None)
    tox.read(ROOT / "tox.ini")
    assert "triton-newest" not in tox["tox"]["envlist"]
    env = tox["testenv:triton-newest"]
    assert "scripts/test-newest-triton" in env["commands"]
    assert env["commands_pre"].strip() == ""  # not the project's install recipe
