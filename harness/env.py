"""Environment metadata stored in every results file.

Why: a figure without the commit, the library versions and the hardware that produced it
cannot be compared with anything. Collected in the parent process (cheap: no torch import
needed for git and CPU info; torch is imported for versions and threads).
"""

from __future__ import annotations

import importlib.metadata as md
import os
import platform
import subprocess
from pathlib import Path
from typing import Any

REPO_ROOT = Path(__file__).resolve().parent.parent


def _git(*args: str) -> str | None:
    try:
        out = subprocess.run(
            ["git", *args], cwd=REPO_ROOT, capture_output=True, text=True, timeout=20, check=True
        )
    except (OSError, subprocess.SubprocessError):
        return None
    return out.stdout.strip()


GIT_SHA_ENV = "OPTIMUS_BENCH_GIT_SHA"


def git_info() -> dict[str, Any]:
    """Commit sha and whether the working tree has uncommitted changes (None outside git).

    Outside git (a copy of the tree without ``.git``, as on the lent GPU machine), the sha
    is taken from ``OPTIMUS_BENCH_GIT_SHA`` when set, with ``dirty`` and ``branch`` unknown:
    whoever sends the copy knows its commit, the copy cannot tell."""
    sha = _git("rev-parse", "HEAD")
    if sha is None:
        given = os.environ.get(GIT_SHA_ENV, "").strip() or None
        return {"sha": given, "dirty": None, "branch": None}
    status = _git("status", "--porcelain", "--untracked-files=no")
    return {
        "sha": sha,
        "dirty": bool(status) if status is not None else None,
        "branch": _git("rev-parse", "--abbrev-ref", "HEAD"),
    }


def _version(dist: str) -> str | None:
    try:
        return md.version(dist)
    except md.PackageNotFoundError:
        return None


def cpu_model() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def collect_env(device: str = "cpu") -> dict[str, Any]:
    import torch

    gpu = None
    if device == "cuda" and torch.cuda.is_available():
        gpu = torch.cuda.get_device_name(0)
    return {
        "git": git_info(),
        "python": platform.python_version(),
        "platform": platform.platform(),
        "versions": {
            "torch": torch.__version__,
            "torchrec": _version("torchrec"),
            "fbgemm_gpu": _version("fbgemm-gpu-cpu") or _version("fbgemm-gpu"),
            "numpy": _version("numpy"),
            "optimus_bench": _version("optimus-bench"),
        },
        "cpu": cpu_model(),
        "cpu_count": os.cpu_count(),
        "torch_threads": torch.get_num_threads(),
        "loadavg": list(os.getloadavg()),  # at the start of the run: >cpu_count means shared, noisy
        "device": device,
        "gpu": gpu,
        "cuda": torch.version.cuda,
    }
