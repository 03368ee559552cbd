"""`optimus-bench report RESULTS.json`: markdown tables and PNG plots of a results file."""

from __future__ import annotations

import argparse
from pathlib import Path

from harness import exit_codes
from harness.cli.common import RESULTS_DIR
from harness.outputs import check_output_dir, check_output_file, check_stem

NAME = "report"
HELP = "markdown tables and PNG plots of a results file"


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("results")
    p.add_argument("--out-dir", default=str(RESULTS_DIR), help="where to write (default: results/)")
    p.add_argument("--stem", help="file name stem (default: the results file's stem)")


def main(args: argparse.Namespace) -> int:
    from harness.report.markdown import write_report
    from harness.store import results

    stem = check_stem(args.stem) if args.stem is not None else Path(args.results).stem
    doc = results.load(args.results)
    if not doc["cells"]:
        raise ValueError(f"{args.results}: no cells to report")
    out_dir = check_output_dir(args.out_dir)
    check_output_file(out_dir / f"{stem}.md", "--out-dir/--stem")
    for p in write_report(doc, out_dir, stem):
        print(f"wrote {p}")
    return exit_codes.OK
