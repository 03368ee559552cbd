"""Every example in the README runs as written.

WHY: the README is what a newcomer copies first; an example that drifted from the code is the
first thing they trip over. The python blocks run in order in one namespace (the second uses the
first's model); each command of the bash blocks after the first (the two README commands, which CI
itself runs) runs in a scratch directory, with ``optimus-bench`` the venv's own. Commands that
launch torchrun jobs take minutes and run with the slow tests.
"""

from __future__ import annotations

import os
import re
import shlex
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
README = (ROOT / "README.md").read_text()


def _blocks(lang: str) -> list[str]:
    return re.findall(rf"```{lang}\n(.*?)```", README, flags=re.S)


def _commands() -> list[str]:
    return [line for block in _blocks("bash")[1:] for line in block.splitlines() if line.strip()]


def test_the_python_examples_run(capsys: pytest.CaptureFixture[str]) -> None:
    blocks = _blocks("python")
    assert len(blocks) >= 2, "README must show optimize and the dry run"
    namespace: dict = {}
    for block in blocks:
        exec(compile(block, str(ROOT / "README.md"), "exec"), namespace)
    report = namespace["gm"].optimus_report
    for rule in ("batch_linear", "batch_layer_norm", "batch_unary", "unbind_cat"):
        assert report.rules_fired.get(rule) == 1, report.rules_fired
    rewrites = namespace["plan"].rewrites
    assert rewrites and {r.rule for r in rewrites} >= {"batch_linear"}
    assert "us saved" in capsys.readouterr().out


@pytest.mark.parametrize(
    "command",
    [pytest.param(c, marks=pytest.mark.slow) if "--nproc" in c else c for c in _commands()],
)
def test_the_commands_run(command: str, tmp_path: Path) -> None:
    argv = shlex.split(command)
    assert argv[0] == "optimus-bench", f"README example is not an optimus-bench command: {command}"
    argv[0] = str(Path(sys.executable).with_name("optimus-bench"))
    (tmp_path / "results").mkdir()
    for earlier in _commands()[: _commands().index(command)]:  # made the file this one reads
        made = re.search(r"--out (\S+)", earlier)
        if made and made.group(1) in command and "--nproc" not in earlier:
            _run([argv[0], *shlex.split(earlier)[1:]], tmp_path)
    _run(argv, tmp_path)


def _run(argv: list[str], cwd: Path) -> None:
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    done = subprocess.run(argv, cwd=cwd, env=env, capture_output=True, text=True, timeout=900)
    assert done.returncode == 0, f"{shlex.join(argv)}\n{done.stdout[-2000:]}\n{done.stderr[-2000:]}"
