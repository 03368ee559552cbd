"""The paired noise of this machine, measured: A/A pairs and injected slowdowns, side by side.

    python -m harness.nightly.noise_study --models towers,dlrm --modes compile,compile+optimus \\
        --phases infer,train --scale tiny --reps 2 --out results/paired-noise/study.json

Why measured and not assumed: the paired night's thresholds (``paired.threshold``, the
process-spread limit) are only as good as the noise they are set against, and that noise is a
property of the machine and its load. One measurement per cell and repetition times, side by
side in alternating rounds (``harness.run.paired.measure_sides``), the same commit and mode as
several sides: the base, an A/A copy, and copies whose every timed step is made longer by 1%,
2%, 3% and 5% (``OPTIMUS_BENCH_INJECT_SLOWDOWN``, a busy-wait inside the timed region). Every
side is paired with the base from the same rounds, so one compile-heavy measurement gives the
false-alert rate and the recall at each size.

The study file keeps, per cell and repetition, every side's ratio, interval, verdict and per-round
ratios; ``summary`` pools them: the share of A/A pairs flagged, the share of each injected size
caught, and the paired noise (sd of the log per-round ratio, and sd of the A/A pairs' log median
ratio between repetitions) per family, mode and phase. ``optimus-bench replay --noise-from`` reads
the pooled figures to replay the paired policy on synthetic histories.
"""

from __future__ import annotations

import argparse
import json
import math
import sys
import time
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np

from harness.env import collect_env
from harness.measure.timing import INJECT_SLOWDOWN_ENV
from harness.run.pair_grid import verdict
from harness.run.paired import PairOptions, SideSpec, WorkerError, measure_sides
from harness.run.paired_modes import this_checkout
from harness.spec import PHASES, parse_list, provider_families, resolve_device
from harness.store.results import write_atomic

KIND = "optimus-bench-paired-noise"
INJECTIONS = (0.01, 0.02, 0.03, 0.05)


def side_labels(injections: Sequence[float]) -> list[str]:
    return ["base", "a/a", *(f"+{x:.0%}" for x in injections)]


def study_cell(
    cell: tuple[str, str, str, str], opt: PairOptions, threshold: float, injections: Sequence[float],
    log: Callable[[str], None],
) -> dict[str, Any]:  # fmt: skip
    """One measurement of one cell: every side's figures against the base."""
    model, scale, mode, phase = cell
    here = this_checkout()
    labels = side_labels(injections)
    envs = [{}, {}, *({INJECT_SLOWDOWN_ENV: repr(x)} for x in injections)]
    sides = [SideSpec(label.replace("/", "-").replace("+", "inject-").replace("%", "pct"), here, mode, env)
             for label, env in zip(labels, envs, strict=True)]  # fmt: skip
    t0 = time.perf_counter()
    m = measure_sides((model, scale, phase), sides, opt, log=log)
    out: dict[str, Any] = {"model": model, "scale": scale, "mode": mode, "phase": phase,
                           "rounds": m["rounds"], "processes": m["processes"], "wall_s": time.perf_counter() - t0}  # fmt: skip
    for label, injected, fig in zip(labels[1:], [0.0, *injections], m["figures"], strict=True):
        out[label] = {
            "injected": injected, "ratio": fig["ratio"], "ci95": fig["ci95"], "stable": fig["stable"],
            "verdict": verdict(fig, threshold), "round_ratios": fig["round_ratios"],
            "process_spread": fig["process_spread"],
        }  # fmt: skip
    return out


def summary(doc: dict[str, Any]) -> dict[str, Any]:
    """Pooled figures of a study file (see the module docstring)."""
    runs = [r for r in doc["runs"] if "error" not in r]
    labels = side_labels(doc["config"]["injections"])[1:]
    out: dict[str, Any] = {"pairs": len(runs)}
    for label in labels:
        figs = [r[label] for r in runs]
        judged = [f for f in figs if f["verdict"] != "unstable"]
        out[label] = {
            "flagged": sum(f["verdict"] == "slower" for f in figs),
            "judged": len(judged),
            "unstable": len(figs) - len(judged),
            "share_flagged": (sum(f["verdict"] == "slower" for f in judged) / len(judged))
            if judged
            else None,
            "median_ratio": float(np.median([f["ratio"] for f in figs])) if figs else None,
        }
    logs = [math.log(x) - math.log(r["a/a"]["ratio"]) for r in runs for x in r["a/a"]["round_ratios"]]
    out["sd_round"] = float(np.std(logs, ddof=1)) if len(logs) > 1 else None
    aa = [math.log(r["a/a"]["ratio"]) for r in runs]
    out["sd_pair"] = float(np.std(aa, ddof=1)) if len(aa) > 1 else None
    out["rounds"] = int(np.median([r["rounds"] for r in runs])) if runs else None
    groups: dict[str, list[float]] = {}
    for r in runs:
        groups.setdefault(f"{r['model']}/{r['mode']}/{r['phase']}", []).append(math.log(r["a/a"]["ratio"]))
    out["a/a_log_ratio_by_cell"] = groups
    return out


def format_summary(s: dict[str, Any], threshold: float) -> str:
    lines = [
        f"{s['pairs']} paired measurements; a side is flagged when its whole 95% interval lies above "
        f"{1 + threshold:.3f}",
        "",
        "| side | flagged / judged | unstable | median ratio |",
        "| --- | --- | --- | --- |",
    ]
    for label, v in s.items():
        if isinstance(v, dict) and "flagged" in v:
            share = "-" if v["share_flagged"] is None else f"{v['share_flagged']:.0%}"
            lines.append(
                f"| {label} | {v['flagged']} / {v['judged']} ({share}) | {v['unstable']} | {v['median_ratio']:.4f} |"
            )
    sd_r = "-" if s["sd_round"] is None else f"{s['sd_round']:.2%}"
    sd_p = "-" if s["sd_pair"] is None else f"{s['sd_pair']:.2%}"
    lines += [
        "",
        f"Paired noise: sd of the log per-round ratio {sd_r}; sd of the A/A pairs' log median ratio {sd_p}.",
    ]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(
        prog="python -m harness.nightly.noise_study", description=__doc__.split("\n\n")[0]
    )
    p.add_argument("--models", default="towers,dlrm")
    p.add_argument("--modes", default="compile,compile+optimus")
    p.add_argument("--phases", default=",".join(PHASES))
    p.add_argument("--scale", default="tiny")
    p.add_argument("--reps", type=int, default=2, help="measurements per cell (default: 2)")
    p.add_argument("--rounds", type=int, default=15)
    p.add_argument("--processes", type=int, default=2)
    p.add_argument("--threshold", type=float, default=0.02)
    p.add_argument("--round-warmup-ms", type=float, default=50.0,
                   help="untimed steps at the start of each worker's turn (harness.run.paired.PairOptions)")  # fmt: skip
    p.add_argument("--out", required=True)
    p.add_argument("--summarize", action="store_true", help="print the summary of --out and exit")
    args = p.parse_args(argv)
    if args.summarize:
        with open(args.out, encoding="utf-8") as f:
            done = json.load(f)
        print(format_summary(summary(done), done["config"]["threshold"]))
        return 0
    from harness.modes import mode_registry

    families = tuple(provider_families("models:build"))
    cells = [(m, args.scale, mode, ph) for m in parse_list(args.models, "models", families)
             for mode in parse_list(args.modes, "modes", tuple(mode_registry.names()))
             for ph in parse_list(args.phases, "phases", PHASES)]  # fmt: skip
    opt = PairOptions(rounds=args.rounds, max_rounds=args.rounds, processes=args.processes,
                      max_processes=args.processes, compiles=1, device=resolve_device("cpu"),
                      round_warmup_ms=args.round_warmup_ms)  # fmt: skip
    config = {"cells": [list(c) for c in cells], "reps": args.reps, "threshold": args.threshold,
              "injections": list(INJECTIONS), "rounds": args.rounds, "processes": args.processes,
              "round_warmup_ms": args.round_warmup_ms}  # fmt: skip
    doc: dict[str, Any] = {"kind": KIND, "env": collect_env("cpu"), "config": config, "runs": []}
    log = lambda msg: print(msg, file=sys.stderr, flush=True)  # noqa: E731
    t0 = time.perf_counter()
    for rep in range(args.reps):
        for cell in cells:
            log(f"[study] rep {rep + 1}/{args.reps}: {'/'.join(cell)}")
            try:
                doc["runs"].append({"rep": rep, **study_cell(cell, opt, args.threshold, INJECTIONS, log)})
            except WorkerError as e:
                doc["runs"].append({"rep": rep, "cell": list(cell), "error": str(e)})
            doc["wall_s"] = time.perf_counter() - t0
            doc["summary"] = summary(doc)
            write_atomic(args.out, json.dumps(doc, indent=1) + "\n")
    print(format_summary(doc["summary"], args.threshold))
    return 0


if __name__ == "__main__":
    sys.exit(main())
