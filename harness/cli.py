"""`optimus-bench`: the command line of the harness.

Why one entry point: nightly CI, asv and people at a terminal all drive the same code, so a
figure printed by one is the figure measured by the others.
"""

from __future__ import annotations

import argparse
import sys
from importlib import metadata


def _version() -> str:
    try:
        return metadata.version("optimus-bench")
    except metadata.PackageNotFoundError:
        return "0.0.0+unknown"


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="optimus-bench",
        description="Benchmark and regression harness for the Optimus graph optimizer.",
    )
    parser.add_argument("--version", action="version", version=f"%(prog)s {_version()}")
    parser.add_subparsers(dest="command", metavar="COMMAND")
    return parser


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    if args.command is None:
        parser.print_help()
        return 0
    return 0


if __name__ == "__main__":
    sys.exit(main())
