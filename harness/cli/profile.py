"""`optimus-bench profile`: where one cell's step time and peak memory go, per mode
(``harness.diagnose.profile_cell``; also ``python -m harness.diagnose.profile_cell``)."""

from __future__ import annotations

import argparse

NAME = "profile"
HELP = "profile one cell per mode: the ops that take its time and the tensors live at its memory peak"


def add_arguments(p: argparse.ArgumentParser) -> None:
    from harness.diagnose.profile_cell import add_arguments as add_profile_arguments

    add_profile_arguments(p)


def main(args: argparse.Namespace) -> int:
    from harness.diagnose.profile_cell import main_from_args

    return main_from_args(args)
