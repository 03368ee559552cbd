"""`optimus-bench corpus-ab`: compile+optimus against compile on every outside-corpus model, side by
side (``harness.diagnose.corpus_ab``; also ``python -m harness.diagnose.corpus_ab``)."""

from __future__ import annotations

import argparse

NAME = "corpus-ab"
HELP = "compile+optimus against compile (ab, side by side) on every outside-corpus model, per zoo"


def add_arguments(p: argparse.ArgumentParser) -> None:
    from harness.diagnose.corpus_ab import add_arguments as add_corpus_arguments

    add_corpus_arguments(p)


def main(args: argparse.Namespace) -> int:
    from harness.diagnose.corpus_ab import main_from_args

    return main_from_args(args)
