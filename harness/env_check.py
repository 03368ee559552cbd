"""Check that an environment holds the stack the install recipe promises.

Why: torchrec's own requirements pull the ~500 MB CUDA ``fbgemm-gpu`` and a newer torch;
if either slips in, every number this project measures is measured on the wrong stack.
The install recipe runs this after installing, and the test suite runs it again.
"""

from __future__ import annotations

import argparse
import importlib.metadata as md
import re
import sys
from dataclasses import dataclass

TORCH_VERSION = "2.13.0"
FBGEMM_VERSION = "1.8.0"
TRITON_VERSION = "3.6.0"  # CPU recipe's pin (the CUDA torch brings the triton it was built with)


@dataclass(frozen=True)
class Problem:
    """One way the environment differs from the recipe."""

    message: str


def installed_distributions() -> dict[str, str]:
    """Map normalized distribution name -> version for everything installed."""
    out: dict[str, str] = {}
    for dist in md.distributions():
        name = dist.metadata["Name"]
        if name:
            out[re.sub(r"[-_.]+", "-", name).lower()] = dist.version
    return out


def find_problems(variant: str = "cpu", installed: dict[str, str] | None = None) -> list[Problem]:
    """Return every mismatch between the installed packages and the recipe for ``variant``."""
    if variant not in ("cpu", "gpu"):
        raise ValueError(f"variant must be 'cpu' or 'gpu', got {variant!r}")
    pkgs = installed_distributions() if installed is None else installed
    problems: list[Problem] = []
    torch_v = pkgs.get("torch")
    if torch_v is None:
        problems.append(Problem("torch is not installed"))
    elif torch_v.split("+")[0] != TORCH_VERSION:
        problems.append(Problem(f"torch {torch_v} installed, recipe pins {TORCH_VERSION}"))
    elif variant == "cpu" and not torch_v.endswith("+cpu"):
        problems.append(Problem(f"torch {torch_v} is not the CPU build ({TORCH_VERSION}+cpu)"))
    if variant == "cpu":
        if "fbgemm-gpu" in pkgs:
            problems.append(
                Problem(
                    f"CUDA fbgemm-gpu {pkgs['fbgemm-gpu']} is installed; the CPU recipe uses fbgemm-gpu-cpu"
                )
            )
        if pkgs.get("fbgemm-gpu-cpu") != FBGEMM_VERSION:
            problems.append(
                Problem(
                    f"fbgemm-gpu-cpu {pkgs.get('fbgemm-gpu-cpu')} installed, recipe pins {FBGEMM_VERSION}"
                )
            )
        if pkgs.get("triton") != TRITON_VERSION:
            problems.append(Problem(f"triton {pkgs.get('triton')} installed, recipe pins {TRITON_VERSION}"))
        cuda = sorted(n for n in pkgs if n.startswith("nvidia-"))
        if cuda:
            problems.append(Problem(f"CUDA packages installed in a CPU environment: {', '.join(cuda)}"))
    elif pkgs.get("fbgemm-gpu") != FBGEMM_VERSION:
        problems.append(
            Problem(f"fbgemm-gpu {pkgs.get('fbgemm-gpu')} installed, recipe pins {FBGEMM_VERSION}")
        )
    if variant == "gpu" and "triton" not in pkgs and "pytorch-triton" not in pkgs:
        problems.append(Problem("triton is not installed (the CUDA torch should bring it)"))
    if "torchrec" not in pkgs:
        problems.append(Problem("torchrec is not installed"))
    return problems


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--variant", choices=("cpu", "gpu"), default="cpu")
    args = parser.parse_args(argv)
    problems = find_problems(args.variant)
    for p in problems:
        print(f"env-check: {p.message}", file=sys.stderr)
    if not problems:
        print(f"env-check: ok ({args.variant})")
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
