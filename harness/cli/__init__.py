"""`optimus-bench`: the command line of the harness.

Why one entry point: nightly CI, asv and people at a terminal all drive the same code, so a
figure printed by one is the figure measured by the others.

Each command is one module of this package with the same small interface (as asv's commands):
``NAME``, ``HELP``, ``add_arguments(parser)`` and ``main(args) -> int``. ``COMMANDS`` lists them
in the order ``--help`` shows them; a new command is a new module and one line there.
"""

from __future__ import annotations

import argparse
import sys
from types import ModuleType

from harness import exit_codes
from harness.cli import (
    ab,
    bisect,
    changes,
    compare,
    corpus_ab,
    headroom,
    listing,
    models,
    nightly,
    outside_gain,
    pair,
    profile,
    replay,
    report,
    reproduce,
    run,
    targets,
)
from harness.cli.common import version
from harness.store.results import ResultsError

COMMANDS: tuple[ModuleType, ...] = (
    listing, models, run, compare, report, reproduce, targets, ab, pair, bisect, nightly, replay, headroom, changes,
    profile, outside_gain, corpus_ab,
)  # fmt: skip


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="optimus-bench",
        description="Benchmark and regression harness for the Optimus graph optimizer.",
    )
    parser.add_argument("--version", action="version", version=f"%(prog)s {version()}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    for command in COMMANDS:
        command.add_arguments(sub.add_parser(command.NAME, help=command.HELP))
    return parser


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    if args.command is None:
        parser.print_help()
        return exit_codes.OK
    command = {c.NAME: c for c in COMMANDS}[args.command]
    try:
        return command.main(args)
    except (
        ValueError,
        ResultsError,
    ) as e:  # NonFiniteError too: a NaN/inf figure is a malformed file  # OutputPathError is a ValueError
        print(f"optimus-bench {args.command}: error: {e}", file=sys.stderr)
        return exit_codes.BAD_INPUT
    except KeyboardInterrupt:
        print(
            f"optimus-bench {args.command}: interrupted; finished cells are saved (use --resume)",
            file=sys.stderr,
        )
        return exit_codes.INTERRUPTED
