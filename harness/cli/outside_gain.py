"""`optimus-bench outside-gain`: Optimus's gain on the outside model corpus
(``harness.diagnose.outside_gain``; also ``python -m harness.diagnose.outside_gain``)."""

from __future__ import annotations

import argparse

NAME = "outside-gain"
HELP = "the rules' own gain (eager, side by side with plain capture) on the outside corpus, per zoo"


def add_arguments(p: argparse.ArgumentParser) -> None:
    from harness.diagnose.outside_gain import add_arguments as add_outside_arguments

    add_outside_arguments(p)


def main(args: argparse.Namespace) -> int:
    from harness.diagnose.outside_gain import main_from_args

    return main_from_args(args)
