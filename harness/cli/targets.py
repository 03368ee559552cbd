"""`optimus-bench targets RESULTS.json...`: a set of performance goals judged from results files
(met / missed / no data). ``--goals paper`` (``harness.gate.targets``, the default) or
``--goals cpu-large`` (``harness.gate.targets_cpu_large``)."""

from __future__ import annotations

import argparse
import json

from harness import exit_codes
from harness.outputs import check_output_file

NAME = "targets"
HELP = "a set of performance goals judged from results files (met / missed)"
GOALS = ("paper", "cpu-large")


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("results", nargs="+", help="harness results JSON files")
    p.add_argument(
        "--goals",
        choices=GOALS,
        default="paper",
        help="which goals: paper (the paper's claims at every scale, harness/gate/targets.py, the default) "
        "or cpu-large (the CPU goals at large scale, with the limit, harness/gate/targets_cpu_large.py)",
    )
    p.add_argument("--json", default=None, help="also write the verdicts here (atomically)")


def main(args: argparse.Namespace) -> int:
    from harness.gate import targets, targets_cpu_large
    from harness.store import results

    if args.json:
        check_output_file(args.json, "--json")
    judge = targets_cpu_large.verdicts if args.goals == "cpu-large" else targets.verdicts
    found = judge(results.load(p) for p in args.results)
    print(targets.render(found))
    if args.json:
        results.write_atomic(args.json, json.dumps(targets.as_json(found), indent=1) + "\n")
    return exit_codes.OK
