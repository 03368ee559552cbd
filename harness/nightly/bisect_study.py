"""How often ``bisect`` names the right commit: synthetic histories with one slow commit, bisected.

    python -m harness.nightly.bisect_study --slowdowns 0.03,0.05 --histories 8 \\
        --out results/paired-noise/bisect-study.json

WHY a study and not one test: one history bisected right says the search works; the rate over
many says how often this machine's noise sends it to the wrong commit, which is what a user
trusts when the nightly prints "first slower commit". Each history is a scratch repository of
``--commits`` commits of a stand-in project (``harness.run.synthetic_history``) whose step
busy-waits ``--step-ms``, ``1 + slowdown`` times longer from one commit on, drawn at random (not
the first). ``bisect`` (``harness.diagnose.bisect``) then runs with the paired night's
measurement (``benchmarks/nightly_thresholds.json``, section ``paired``) unless told otherwise.
A history counts as located when the first slower commit named is the drawn one.

What it measures and what it does not: the search, the paired verdicts and the machine's
scheduling noise on a busy-wait step; not a model's own noise (memory, caches, kernel choice),
which the noise study (``harness.nightly.noise_study``) measures.
"""

from __future__ import annotations

import argparse
import json
import random
import sys
import tempfile
import time
from dataclasses import replace
from pathlib import Path
from typing import Any

from scipy.stats import binomtest

from harness.diagnose.bisect import BisectError, bisect
from harness.env import collect_env
from harness.nightly.job import DEFAULT_CONFIG, load_config
from harness.run.paired import PairOptions, WorkerError
from harness.run.synthetic_history import fake_history
from harness.store.results import write_atomic

KIND = "optimus-bench-bisect-study"
CELL = ("towers", "tiny", "eager", "infer")  # the stand-in project ignores the cell; bisect needs one


def one_history(
    slowdown: float, commits: int, step_ms: float, opt: PairOptions, threshold: float, rng: random.Random,
    log: Any,
) -> dict[str, Any]:  # fmt: skip
    """Bisect one fresh history; its record (``located``: the drawn commit was named)."""
    slow_from = rng.randrange(1, commits)
    with tempfile.TemporaryDirectory(prefix="optimus-bisect-study-") as tmp:
        repo = Path(tmp) / "repo"
        shas = fake_history(repo, [step_ms] * slow_from + [step_ms * (1 + slowdown)] * (commits - slow_from))
        t0 = time.perf_counter()
        rec: dict[str, Any] = {"slowdown": slowdown, "slow_from": slow_from}
        try:
            doc = bisect(repo, shas[0], shas[-1], CELL, opt, threshold=threshold, log=log)
        except BisectError as e:  # BAD measured not slower: the slowdown was missed
            rec.update(located=False, named=None, error=str(e), steps=1)
        except WorkerError as e:
            rec.update(located=None, named=None, error=str(e), steps=0)
        else:
            named = shas.index(doc["first_slower"])
            rec.update(
                located=named == slow_from, named=named, steps=len(doc["steps"]),
                ratios=[s["ratio"] for s in doc["steps"]], confidence=doc["confidence"],
            )  # fmt: skip
        rec["wall_s"] = time.perf_counter() - t0
    return rec


def summary(runs: list[dict[str, Any]]) -> dict[str, Any]:
    """Per slowdown: histories, located, the rate and its exact (Clopper-Pearson) 95% interval."""
    out: dict[str, Any] = {}
    for s in sorted({r["slowdown"] for r in runs}):
        done = [r for r in runs if r["slowdown"] == s and r["located"] is not None]
        hits = sum(1 for r in done if r["located"])
        ci = binomtest(hits, len(done)).proportion_ci() if done else None
        out[f"{s:.0%}"] = {
            "histories": len(done), "located": hits, "rate": hits / len(done) if done else None,
            "ci95": [ci.low, ci.high] if ci else None,
            "missed_bad": sum(1 for r in done if r["named"] is None),
            "median_wall_s": sorted(r["wall_s"] for r in done)[len(done) // 2] if done else None,
        }  # fmt: skip
    return out


def format_summary(doc: dict[str, Any]) -> str:
    lines = [
        "| slowdown | histories | located | rate (95% CI) | BAD not seen slower | median s per bisect |",
        "| --- | --- | --- | --- | --- | --- |",
    ]
    for size, f in doc["summary"].items():
        rate = "-" if f["rate"] is None else f"{f['rate']:.0%} ({f['ci95'][0]:.0%}-{f['ci95'][1]:.0%})"
        wall = "-" if f["median_wall_s"] is None else f"{f['median_wall_s']:.0f}"
        lines.append(f"| {size} | {f['histories']} | {f['located']} | {rate} | {f['missed_bad']} | {wall} |")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(
        prog="python -m harness.nightly.bisect_study", description=__doc__.split("\n\n")[0]
    )
    p.add_argument("--slowdowns", default="0.03,0.05", help="comma list of fractions (default: 0.03,0.05)")
    p.add_argument("--histories", type=int, default=8, help="histories per slowdown (default: 8)")
    p.add_argument("--commits", type=int, default=16, help="commits per history (default: 16)")
    p.add_argument("--step-ms", type=float, default=2.0, help="the stand-in step's busy time (default: 2)")
    p.add_argument("--threshold", type=float, default=None, help="default: the paired night's (0.02)")
    p.add_argument("--processes", type=int, default=None, help="default: the paired night's (2)")
    p.add_argument("--seed", type=int, default=0, help="draws the slow commits (default: 0)")
    p.add_argument(
        "--config", default=str(DEFAULT_CONFIG), help="the nightly config whose paired section is used"
    )
    p.add_argument("--out", help="write the study here (atomically, after every history)")
    p.add_argument("--summarize", action="store_true", help="print the summary of --out and exit")
    args = p.parse_args(argv)
    if args.summarize:
        if not args.out:
            p.error("--summarize needs --out")
        print(format_summary(json.loads(Path(args.out).read_text(encoding="utf-8"))))
        return 0
    try:
        sizes = [float(x) for x in args.slowdowns.split(",") if x.strip()]
    except ValueError:
        p.error(f"--slowdowns: expected a comma list of fractions, got {args.slowdowns!r}")
    if args.histories < 1 or args.commits < 2 or not args.step_ms > 0 or any(not s > 0 for s in sizes):
        p.error("need --histories >= 1, --commits >= 2, --step-ms > 0 and slowdowns > 0")
    night = load_config(args.config).paired
    opt = night.measure
    if args.processes is not None:
        opt = replace(opt, processes=args.processes, max_processes=max(opt.max_processes, args.processes))
    opt = replace(opt, compiles=1)  # nothing compiles: the first call is the step
    opt.check()
    threshold = night.threshold if args.threshold is None else args.threshold
    rng = random.Random(args.seed)
    doc: dict[str, Any] = {
        "kind": KIND, "env": collect_env("cpu"),
        "config": {"slowdowns": sizes, "histories": args.histories, "commits": args.commits,
                   "step_ms": args.step_ms, "threshold": threshold, "seed": args.seed, "pair": opt.__dict__},
        "runs": [],
    }  # fmt: skip
    log = lambda msg: print(msg, file=sys.stderr, flush=True)  # noqa: E731
    quiet = lambda msg: None  # noqa: E731
    for s in sizes:
        for h in range(args.histories):
            rec = one_history(s, args.commits, args.step_ms, opt, threshold, rng, quiet)
            doc["runs"].append(rec)
            doc["summary"] = summary(doc["runs"])
            log(f"[bisect-study] {s:.0%} history {h + 1}/{args.histories}: slow from commit {rec['slow_from']}, "
                f"named {rec['named']} ({'located' if rec['located'] else 'missed'}), {rec['wall_s']:.0f} s")  # fmt: skip
            if args.out:
                write_atomic(args.out, json.dumps(doc, indent=1) + "\n")
    print(format_summary(doc))
    return 0


if __name__ == "__main__":
    sys.exit(main())
