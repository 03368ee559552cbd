"""`optimus-bench nightly`: the nightly regression job (``harness.nightly.job``)."""

from __future__ import annotations

import argparse

NAME = "nightly"
HELP = "run the suite, compare with the last good nightly; exit 1 on a regression"


def add_arguments(p: argparse.ArgumentParser) -> None:
    from harness.nightly.job import add_arguments as add_nightly_arguments

    add_nightly_arguments(p)


def main(args: argparse.Namespace) -> int:
    from harness.nightly.job import main_from_args

    return main_from_args(args)
