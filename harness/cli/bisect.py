"""`optimus-bench bisect GOOD BAD --cell model/scale/mode/phase`: the first commit where the cell
got slower, each step a paired measurement against GOOD (``harness.diagnose.bisect``)."""

from __future__ import annotations

import argparse
import json
import sys

from harness import exit_codes
from harness.cli.pair import add_pair_options, options_of
from harness.outputs import check_output_file
from harness.spec import PHASES, load_provider, provider_families

NAME = "bisect"
HELP = "find the first commit where a cell got slower: a binary search of paired measurements against GOOD"


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("good", metavar="GOOD", help="a commit where the cell is fast")
    p.add_argument("bad", metavar="BAD", help="a later commit where it is slower")
    p.add_argument("--cell", required=True, metavar="MODEL/SCALE/MODE/PHASE",
                   help="the cell, e.g. dlrm/tiny/compile+optimus/train")  # fmt: skip
    p.add_argument("--out", help="also write the steps and the answer as JSON here (atomically)")
    add_pair_options(p)


def parse_cell(text: str, provider: str) -> tuple[str, str, str, str]:
    from harness.modes import mode_registry

    parts = text.split("/")
    if len(parts) != 4 or not all(parts):
        raise ValueError(f"--cell: expected MODEL/SCALE/MODE/PHASE, got {text!r}")
    model, scale, mode, phase = parts
    families = provider_families(provider)
    if families and model not in families:
        raise ValueError(f"--cell: unknown model {model!r}; allowed values: {', '.join(families)}")
    if mode not in mode_registry.names():
        raise ValueError(f"--cell: unknown mode {mode!r}; allowed values: {', '.join(mode_registry.names())}")
    if phase not in PHASES:
        raise ValueError(f"--cell: unknown phase {phase!r}; allowed values: {', '.join(PHASES)}")
    return model, scale, mode, phase


def main(args: argparse.Namespace) -> int:
    from harness.diagnose.bisect import StepFailed, bisect, format_bisect
    from harness.run import checkouts
    from harness.store import results

    load_provider(args.provider)
    key = parse_cell(args.cell, args.provider)
    opt = options_of(args)
    if args.out:
        check_output_file(args.out)
    repo = checkouts.repo_root(args.repo)
    try:
        doc = bisect(repo, args.good, args.bad, key, opt, threshold=args.threshold,
                     log=lambda msg: print(msg, file=sys.stderr, flush=True))  # fmt: skip
    except StepFailed as e:
        print(f"optimus-bench bisect: {e}", file=sys.stderr)
        return exit_codes.INCOMPLETE
    print(format_bisect(doc))
    if args.out:
        results.write_atomic(args.out, json.dumps(doc, indent=1) + "\n")
        print(f"wrote {args.out}")
    return exit_codes.OK
