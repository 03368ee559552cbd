"""A scratch copy of the repository, and the how-to snippets the docs hold, for the how-to tests.

Why a copy: the how-to tests perform the addition a doc describes (a mode, a metric, a rule, a
model family) by editing files, then run the real command in that copy. Editing this checkout
would leave the addition behind; the copy holds exactly the tracked files (``git ls-files``).

Why snippets are read out of the docs: a test that carried its own copy of the example would
keep passing after the doc drifted. Each snippet is the fenced block after an HTML comment
``<!-- howto:NAME -->`` in a doc, so the doc shows it as ordinary code.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
# the smallest real harness run: the stand-in towers model, one phase, a few timed steps
HARNESS_RUN = ("run", "--provider", "tests.harness.fakes:build", "--models", "towers",
       "--scale", "small", "--phases", "infer", "--warmup", "1", "--min-iters", "3", "--max-iters", "5",
       "--budget-s", "0.1", "--no-progress")  # fmt: skip


def copy_repo(dest: Path) -> Path:
    """Copy every tracked file of this checkout (as it is on disk) to ``dest``; return ``dest``."""
    names = (
        subprocess.run(["git", "ls-files", "-z"], cwd=ROOT, capture_output=True, check=True)
        .stdout.decode()
        .split("\0")
    )
    for name in filter(None, names):
        src = ROOT / name
        if not src.is_file():  # deleted in the working tree
            continue
        target = dest / name
        target.parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(src, target)
    return dest


def snippet(doc: str, name: str) -> str:
    """The fenced code block that follows ``<!-- howto:NAME -->`` in ``doc`` (a path under docs/)."""
    text = (ROOT / doc).read_text()
    m = re.search(rf"<!-- howto:{re.escape(name)} -->\s*```[a-z]*\n(.*?)```", text, re.S)
    if m is None:
        raise AssertionError(f"{doc}: no code block after <!-- howto:{name} -->")
    return m.group(1)


def append(path: Path, text: str) -> None:
    path.write_text(path.read_text().rstrip("\n") + "\n" + text)


def insert_after(path: Path, anchor: str, text: str) -> None:
    """Insert ``text`` (lines, indented like ``anchor``) after the one line holding ``anchor``."""
    lines = path.read_text().splitlines(keepends=True)
    hits = [i for i, line in enumerate(lines) if anchor in line]
    if len(hits) != 1:
        raise AssertionError(f"{path}: {anchor!r} found {len(hits)} times, expected once")
    line = lines[hits[0]]
    indent = line[: len(line) - len(line.lstrip())]
    block = "".join(indent + s + "\n" if s.strip() else "\n" for s in text.rstrip("\n").split("\n"))
    lines.insert(hits[0] + 1, block)
    path.write_text("".join(lines))


def run(repo: Path, *args: str, timeout: float = 120) -> subprocess.CompletedProcess[str]:
    """``python ARGS`` in the scratch copy, importing the copy's packages (not this checkout's)."""
    env = {**os.environ, "PYTHONPATH": str(repo), "PYTHONDONTWRITEBYTECODE": "1"}
    return subprocess.run(
        [sys.executable, *args], cwd=repo, env=env, capture_output=True, text=True, timeout=timeout
    )


_CLI = """
import contextlib, io, json, sys
from harness import cli
done = []
for argv in json.loads(sys.argv[1]):
    buf = io.StringIO()
    with contextlib.redirect_stdout(buf):
        try:
            rc = cli.main(argv)
        except SystemExit as e:  # --help
            rc = e.code
    done.append({"argv": argv, "rc": rc, "stdout": buf.getvalue()})
print(json.dumps(done))
"""


def cli(repo: Path, *commands: list[str], timeout: float = 120) -> list[dict[str, object]]:
    """Run ``optimus-bench`` subcommands one after another in one process of the scratch copy
    (one interpreter start instead of one per command: each start imports torch, ~5-15 s here).
    Returns ``{"argv", "rc", "stdout"}`` per command; stderr of all of them is in the error."""
    done = run(repo, "-c", _CLI, json.dumps(list(commands)), timeout=timeout)
    if done.returncode != 0:
        raise AssertionError(done.stdout + done.stderr)
    results: list[dict[str, object]] = json.loads(done.stdout.strip().splitlines()[-1])
    for r in results:
        r["stderr"] = done.stderr
    return results
