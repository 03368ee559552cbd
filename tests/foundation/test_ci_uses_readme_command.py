"""CI runs the README's test command itself, not a copy that can drift."""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def readme_commands() -> list[str]:
    text = (ROOT / "README.md").read_text()
    block = re.search(r"```bash\n(.*?)```", text, re.S)
    assert block, "README must open with a ```bash block holding its two commands"
    return [line for line in block.group(1).splitlines() if line.strip() and not line.startswith("#")]


def test_readme_has_exactly_two_commands() -> None:
    cmds = readme_commands()
    assert len(cmds) == 2, cmds


def test_ci_reads_the_second_command_from_readme() -> None:
    ci = (ROOT / ".ci" / "run").read_text()
    assert "README.md" in ci and "sed -n" in ci
    assert readme_commands()[1] not in ci, "CI must read the command from README, not hold a copy"
