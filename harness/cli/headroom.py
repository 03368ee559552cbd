"""`optimus-bench headroom`: the micro-benchmark of one fused tower group
(``harness.diagnose.headroom``)."""

from __future__ import annotations

import argparse

NAME = "headroom"
HELP = "micro-benchmark of one fused tower group: separate, runtime stack, ideal, re-layout"


def add_arguments(p: argparse.ArgumentParser) -> None:
    from harness.diagnose.headroom import add_arguments as add_headroom_arguments

    add_headroom_arguments(p)


def main(args: argparse.Namespace) -> int:
    from harness.diagnose.headroom import main_from_args

    return main_from_args(args)
