"""`optimus-bench replay`: the detection quality of the nightly gates on synthetic histories
(``harness.nightly.replay``)."""

from __future__ import annotations

import argparse

NAME = "replay"
HELP = "detection quality of the nightly gates on synthetic histories (false alerts, recall, nights to catch)"


def add_arguments(p: argparse.ArgumentParser) -> None:
    from harness.nightly.replay import add_arguments as add_replay_arguments

    add_replay_arguments(p)


def main(args: argparse.Namespace) -> int:
    from harness.nightly.replay import main_from_args

    return main_from_args(args)
