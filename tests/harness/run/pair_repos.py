"""Scratch git repositories for the paired-measurement tests.

``fake_history``: commits of a stand-in project whose only code is what a pair's worker asks of a
checkout (``harness.run.interleaved.contender``). Its step busy-waits for a time fixed in the
commit, so a commit can be made slower by a known fraction; model names make a worker crash,
hang or fail on purpose, or run its first steps after idling slower (``cold``). ``copy_of_this_repo``: the tracked files of this checkout as a new
repository, for a real pair of two commits of this project.
"""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

REPO = Path(__file__).resolve().parents[3]

FAKE_CONTENDER = """
import os, time
from dataclasses import dataclass
from typing import Any

STEP_MS = {step_ms!r}
CRASH = {crash!r}
HANG = {hang!r}


@dataclass
class Contender:
    mode: str
    step: Any
    first_call_s: float
    first_out: Any
    module: Any = None
    optimizer: Any = None


def contender(model, scale, mode, phase, *, device, seed, provider):
    import torch

    last = [0.0, 0]  # when the last step ended; steps since the last idle gap

    def step():
        if CRASH and model == "crash":
            os._exit(7)
        if HANG and model == "hang":
            time.sleep(3600)
        start = time.perf_counter()
        if start - last[0] > 0.02:
            last[1] = 0
        last[1] += 1
        # "cold": the first 8 steps after the worker idled run 3x slower, as caches and clocks warm up
        slow = 3.0 if model == "cold" and last[1] <= 8 else 1.0
        end = start + slow * STEP_MS / 1e3
        while time.perf_counter() < end:
            pass
        last[0] = time.perf_counter()
        return torch.ones(3)

    return Contender(mode, step, 0.01, torch.full((3,), float(seed)))
"""


def break_imports(repo: Path) -> str:
    """A commit on top whose checkout cannot import the worker's contender; its sha."""
    (repo / "harness" / "run" / "interleaved.py").write_text("raise ImportError('half-finished refactor')\n")
    git(repo, "commit", "-q", "-am", "break the import")
    return git(repo, "rev-parse", "HEAD")


def git(repo: Path, *args: str) -> str:
    r = subprocess.run(["git", "-C", str(repo), *args], capture_output=True, text=True, check=True)
    return r.stdout.strip()


def init(repo: Path) -> None:
    repo.mkdir(parents=True, exist_ok=True)
    git(repo, "init", "-q", "-b", "main")
    git(repo, "config", "user.email", "bench@example.com")
    git(repo, "config", "user.name", "bench")
    git(repo, "config", "commit.gpgsign", "false")


def fake_history(repo: Path, step_ms: list[float], faulty: int | None = None) -> list[str]:
    """One commit per entry of ``step_ms`` (the step's busy time in that commit); their shas.
    In commit ``faulty`` the models named ``crash`` and ``hang`` do so at their first step."""
    init(repo)
    shas = []
    for i, ms in enumerate(step_ms):
        pkg = repo / "harness" / "run"
        pkg.mkdir(parents=True, exist_ok=True)
        (repo / "harness" / "__init__.py").write_text("")
        (pkg / "__init__.py").write_text("")
        (pkg / "interleaved.py").write_text(
            FAKE_CONTENDER.format(step_ms=ms, crash=i == faulty, hang=i == faulty)
        )
        git(repo, "add", "-A")
        git(repo, "commit", "-q", "--allow-empty", "-m", f"commit {i}: step {ms} ms")
        shas.append(git(repo, "rev-parse", "HEAD"))
    return shas


def copy_of_this_repo(repo: Path) -> list[str]:
    """This checkout's tracked files as a new repository with two commits (the second only
    touches a text file); their shas."""
    init(repo)
    files = subprocess.run(["git", "-C", str(REPO), "ls-files", "-z"], capture_output=True, check=True).stdout
    for name in files.decode().split("\0"):
        src = REPO / name
        if name and src.is_file():
            dst = repo / name
            dst.parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(src, dst)
    git(repo, "add", "-A")
    git(repo, "commit", "-q", "-m", "this checkout")
    first = git(repo, "rev-parse", "HEAD")
    (repo / "NOTES.txt").write_text("a change that touches no code\n")
    git(repo, "add", "-A")
    git(repo, "commit", "-q", "-m", "a note")
    return [first, git(repo, "rev-parse", "HEAD")]
