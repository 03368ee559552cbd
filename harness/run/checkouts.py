"""Checkouts of the commits a pair or a bisect measures: git worktrees that share this venv.

Why worktrees and ``PYTHONPATH``: the harness, the optimizer and the models are pure Python, so a
commit's code runs in this environment once its checkout is first on the path and is the working
directory. A worktree is a cheap checkout (no copy of the history), and the installed
dependencies (torch, torchrec, fbgemm) are the environment's, the same for both sides: a pair
measures the commits, not two installs. The editable install of this project points at this
checkout; ``PYTHONPATH`` comes before it on the path, so the worker imports the other commit.
"""

from __future__ import annotations

import os
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

WORKER = Path(__file__).with_name("pair_worker.py")
IMPORT_CHECK = "from harness.run.interleaved import contender"


class CheckoutError(ValueError):
    """A revision that names no commit, or a checkout whose harness cannot run a pair's worker."""


@dataclass(frozen=True)
class Checkout:
    """A commit's code on disk: its full sha (``-dirty`` when a directory has local changes)."""

    sha: str
    root: Path


def git(repo: Path, *args: str) -> str:
    r = subprocess.run(["git", "-C", str(repo), *args], capture_output=True, text=True, check=False)
    if r.returncode != 0:
        last = (r.stderr.strip().splitlines() or ["git failed"])[-1]
        raise CheckoutError(f"git {' '.join(args)}: {last}")
    return r.stdout.strip()


def repo_root(path: str | os.PathLike[str]) -> Path:
    """The top of the git repository at ``path`` (one-line error when there is none)."""
    p = Path(path)
    if not p.is_dir():
        raise CheckoutError(f"--repo: {p} is not a directory")
    try:
        return Path(git(p, "rev-parse", "--show-toplevel"))
    except CheckoutError:
        raise CheckoutError(f"--repo: {p} is not inside a git repository") from None


def resolve(repo: Path, rev: str) -> str:
    """The full sha of ``rev`` in ``repo``."""
    try:
        return git(repo, "rev-parse", "--verify", "--quiet", f"{rev}^{{commit}}")
    except CheckoutError:
        raise CheckoutError(f"{rev!r} is not a commit of {repo}") from None


def commits_between(repo: Path, good: str, bad: str) -> list[str]:
    """The commits after ``good`` up to ``bad``, oldest first, along the first-parent line."""
    g, b = resolve(repo, good), resolve(repo, bad)
    r = subprocess.run(["git", "-C", str(repo), "merge-base", "--is-ancestor", g, b], check=False)
    if r.returncode != 0:
        raise CheckoutError(f"GOOD {good!r} is not an ancestor of BAD {bad!r}")
    out = git(repo, "rev-list", "--first-parent", "--reverse", f"{g}..{b}")
    return [line for line in out.splitlines() if line]


def git_worktrees(repo: Path) -> list[str]:
    """The paths of ``repo``'s worktrees (the main one first)."""
    out = git(repo, "worktree", "list", "--porcelain")
    return [line.removeprefix("worktree ") for line in out.splitlines() if line.startswith("worktree ")]


def check_importable(checkout: Checkout, python: str = sys.executable) -> None:
    """Refuse, in one line, a checkout whose harness cannot build a pair's contender."""
    env = dict(os.environ, PYTHONPATH=str(checkout.root))
    r = subprocess.run(
        [python, "-c", IMPORT_CHECK], cwd=checkout.root, env=env, capture_output=True, text=True,
        timeout=300, check=False,
    )  # fmt: skip
    if r.returncode != 0:
        last = (r.stderr.strip().splitlines() or ["no error text"])[-1]
        raise CheckoutError(
            f"commit {checkout.sha[:12]}: its checkout cannot be paired ({IMPORT_CHECK!r}: {last})"
        )


@contextmanager
def checked_out(repo: Path, revs: list[str]) -> Iterator[list[Checkout]]:
    """A checkout per revision: a directory is used as it is, a commit gets a temporary worktree
    (removed afterwards, whatever happens). Each is checked to import before any is measured."""
    made: list[Path] = []
    with tempfile.TemporaryDirectory(prefix="optimus-pair-") as tmp:
        try:
            outs: list[Checkout] = []
            for i, rev in enumerate(revs):
                if Path(rev).is_dir():
                    root = Path(rev).resolve()
                    sha = git(root, "rev-parse", "HEAD")
                    dirty = git(root, "status", "--porcelain", "--untracked-files=no")
                    outs.append(Checkout(sha + ("-dirty" if dirty else ""), root))
                    continue
                sha = resolve(repo, rev)
                path = Path(tmp) / f"{i}-{sha[:12]}"
                git(repo, "worktree", "add", "--detach", "--quiet", str(path), sha)
                made.append(path)
                outs.append(Checkout(sha, path))
            for c in outs:
                check_importable(c)
            yield outs
        finally:
            for path in made:
                subprocess.run(["git", "-C", str(repo), "worktree", "remove", "--force", str(path)],
                               capture_output=True, check=False)  # fmt: skip
            if made:
                subprocess.run(
                    ["git", "-C", str(repo), "worktree", "prune"], capture_output=True, check=False
                )
