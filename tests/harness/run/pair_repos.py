"""Scratch git repositories for the paired-measurement tests.

``fake_history`` (``harness.run.synthetic_history``): commits of a stand-in project whose step
takes a time fixed per commit. ``break_imports``: a commit whose checkout cannot import.
``copy_of_this_repo``: the tracked files of this checkout as a new repository, for a real pair
of two commits of this project.
"""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

from harness.run.checkouts import git
from harness.run.synthetic_history import fake_history, init

__all__ = ["break_imports", "copy_of_this_repo", "fake_history"]

REPO = Path(__file__).resolve().parents[3]


def break_imports(repo: Path) -> str:
    """A commit on top whose checkout cannot import the worker's contender; its sha."""
    (repo / "harness" / "run" / "interleaved.py").write_text("raise ImportError('half-finished refactor')\n")
    git(repo, "commit", "-q", "-am", "break the import")
    return git(repo, "rev-parse", "HEAD")


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
