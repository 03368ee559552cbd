"""`optimus-bench changes HISTORY.jsonl`: the change points of a nightly history, as a table and a plot.

Why a command besides the nightly: to look at the history between nights (after a red night,
before bisecting) without measuring anything. It reads the store (``harness.store.history_store``),
keeps the nights of one machine (the newest night's, unless ``--machine-of`` names a results
file), and applies the nightly config's ``alert`` section, so what it prints is what the
nightly decided.
"""

from __future__ import annotations

import argparse
from pathlib import Path

from harness import exit_codes
from harness.nightly.changes import analyse_history, format_changes
from harness.outputs import check_output_dir, check_stem
from harness.store import history_store, results

NAME = "changes"
HELP = "change points of a nightly history (table and plot)"


def add_arguments(p: argparse.ArgumentParser) -> None:
    from harness.nightly.job import DEFAULT_CONFIG

    p.add_argument("history", help="the nightly history (results/nightly/history.jsonl)")
    p.add_argument(
        "--config", default=str(DEFAULT_CONFIG), help="nightly config; its 'alert' section is used"
    )
    p.add_argument(
        "--machine-of", help="a results file: analyse the nights of its machine (default: the newest night's)"
    )
    p.add_argument("--out-dir", help="also write <stem>.md and <stem>.png here")
    p.add_argument("--stem", default="changes", help="file name stem (default: changes)")
    p.add_argument("--asv-html", metavar="DIR",
                   help="also mark the change points on the asv dashboard published in DIR (after asv publish)")  # fmt: skip


def main(args: argparse.Namespace) -> int:
    from harness.nightly.history_plots import plot_changes
    from harness.nightly.job import load_config

    cfg = load_config(args.config).changes
    stem = check_stem(args.stem)
    out_dir = check_output_dir(args.out_dir) if args.out_dir else None
    if args.asv_html and not Path(args.asv_html, "index.json").is_file():
        raise ValueError(f"--asv-html {args.asv_html}: not a published asv dashboard (no index.json)")
    found, same, left_out, machine = analyse_history(args.history, cfg, args.machine_of)
    head = [f"# Change points: {args.history}", "",
            f"{len(same)} night(s) of machine {history_store.describe_machine(machine)}; detector "
            f"{cfg.detector} (p < {cfg.max_pvalue}, window {cfg.window}); {cfg.policy}.", *left_out, ""]  # fmt: skip
    text = "\n".join(head) + "\n" + format_changes(found, cfg.policy.dedupe)
    print(text)
    if out_dir is not None:
        png = plot_changes(found, out_dir / f"{stem}.png", title=f"{args.history}: change points")
        results.write_atomic(out_dir / f"{stem}.md", text + f"\n![change points]({png.name})\n")
        print(f"wrote {out_dir / (stem + '.md')}\nwrote {png}")
    if args.asv_html:
        from harness.nightly.asv_marks import mark_dashboard, marks_of

        marked = mark_dashboard(args.asv_html, marks_of(found, dedupe=cfg.policy.dedupe))
        print(f"marked {len(marked.placed)} change point(s) on {args.asv_html}", *marked.skipped, sep="\n  ")
    return exit_codes.OK
