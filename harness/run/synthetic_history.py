"""Synthetic commit histories: a stand-in project whose step takes a time fixed per commit.

WHY: the paired protocol and ``bisect`` must be judged on histories whose slow commit is known.
Each commit holds only what a pair's worker asks of a checkout
(``harness.run.interleaved.contender``); its step busy-waits ``step_ms``, so a commit can be made
slower by a known fraction. Model names make a worker crash or hang on purpose (in the commit
``faulty``), or run its first steps after idling (blocking for its turn) slower (``cold``). Used by the bisect study
(``harness.diagnose.bisect_study``) and the paired-measurement tests.
"""

from __future__ import annotations

from pathlib import Path

from harness.run.checkouts import git

FAKE_CONTENDER = """
import os, resource, time
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

    # the process's voluntary context switches when the last step ended; steps since it idled.
    # Idling is blocking (waiting for its turn), not a gap in wall time: on a loaded machine
    # the scheduler preempts a busy worker between two steps, and that is not idling.
    last = [-1, 0]

    def step():
        if CRASH and model == "crash":
            os._exit(7)
        if HANG and model == "hang":
            time.sleep(3600)
        start = time.perf_counter()
        if resource.getrusage(resource.RUSAGE_SELF).ru_nvcsw != last[0]:
            last[1] = 0
        last[1] += 1
        # "cold": the first 8 steps after the worker idled run 3x slower, as caches and clocks warm up
        slow = 3.0 if model == "cold" and last[1] <= 8 else 1.0
        end = start + slow * STEP_MS / 1e3
        while time.perf_counter() < end:
            pass
        last[0] = resource.getrusage(resource.RUSAGE_SELF).ru_nvcsw
        return torch.ones(3)

    return Contender(mode, step, 0.01, torch.full((3,), float(seed)))
"""


def init(repo: Path) -> None:
    repo.mkdir(parents=True, exist_ok=True)
    git(repo, "init", "-q", "-b", "main")
    git(repo, "config", "user.email", "bench@example.com")
    git(repo, "config", "user.name", "bench")
    git(repo, "config", "commit.gpgsign", "false")


def fake_history(repo: Path, step_ms: list[float], faulty: int | None = None) -> list[str]:
    """One commit per entry of ``step_ms`` (the step's busy time in that commit); their shas.
    In commit ``faulty`` the models named ``crash`` and ``hang`` do so at their first step.
    ``repo`` is created (it must not hold a repository yet)."""
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
