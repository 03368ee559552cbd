"""`optimus-bench compare BASE NEW`: the regression gate between two results files.

Beside the cell-by-cell verdicts it judges the pass rate of every mode (a fall is a regression,
``harness.gate.compare.pass_rate_rows``) and prints the dashboard summary of compile+optimus
against compile in both files, one line per phase (``harness.report.summaries``).

The thresholds' defaults are the metric registry's (``harness.metric_registry``), the same
the nightly config starts from."""

from __future__ import annotations

import argparse
import sys

from harness import exit_codes, metric_registry
from harness.cli.common import finite_float
from harness.outputs import check_output_file

NAME = "compare"
HELP = "compare two results files; exit 1 on a significant regression, 3 on missing/failed/non-finite cells"


def add_arguments(p: argparse.ArgumentParser) -> None:
    from harness.gate.compare import DEFAULT_ALPHA

    limits = metric_registry.threshold_defaults()
    p.add_argument("base")
    p.add_argument("new")
    p.add_argument("--alpha", type=finite_float, default=DEFAULT_ALPHA,
                   help=f"significance level of Mann-Whitney U (default {DEFAULT_ALPHA})")  # fmt: skip
    p.add_argument("--latency-threshold", type=finite_float, default=limits["latency"],
                   help=f"min relative latency change (default {limits['latency']:.2f})")  # fmt: skip
    p.add_argument("--memory-threshold", type=finite_float, default=limits["memory"],
                   help=f"min relative peak-memory change (default {limits['memory']:.2f})")  # fmt: skip
    p.add_argument("--compile-threshold", type=finite_float, default=limits["compile"],
                   help=f"min relative compile-time change (default {limits['compile']:.2f})")  # fmt: skip
    p.add_argument("--compile-abs-s", type=finite_float, default=limits["compile_abs"],
                   help=f"min absolute compile-time change, s (default {limits['compile_abs']:.1f})")  # fmt: skip
    p.add_argument("--out", help="also write the markdown table here")


def main(args: argparse.Namespace) -> int:
    from harness.gate import compare
    from harness.report import summaries
    from harness.store import results

    th = compare.Thresholds(
        alpha=args.alpha,
        latency=args.latency_threshold,
        memory=args.memory_threshold,
        compile=args.compile_threshold,
        compile_abs=args.compile_abs_s,
    )
    if args.out:
        check_output_file(args.out)
    base, new = results.load(args.base), results.load(args.new)
    rows = compare.compare_docs(base, new, th) + compare.pass_rate_rows(base, new)
    text = "\n".join([compare.format_rows(rows), "", *summaries.change_lines(base, new)]).rstrip()
    print(text)
    if args.out:
        results.write_atomic(args.out, text + "\n")
    rc = compare.exit_code(rows)
    fell = [r for r in rows if r.metric == "pass_rate" and r.verdict == "regression"]
    for r in fell:
        print(f"optimus-bench compare: {r.cell} fell from {r.base} to {r.new}", file=sys.stderr)
    # the last line says why the gate failed: lost data wins over a regression
    if rc == exit_codes.INCOMPLETE:
        lost = compare.incomplete(rows)
        print(f"optimus-bench compare: incomplete: {len(lost)} cell(s) of {args.base} are missing, "
              f"failed or non-finite in {args.new} (first: {lost[0].cell}, {lost[0].verdict})", file=sys.stderr)  # fmt: skip
    return rc
