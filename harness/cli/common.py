"""What several commands share: option types and groups, the run configuration read from the
options, and the one-line summary of a results file."""

from __future__ import annotations

import argparse
import math
from importlib import metadata
from pathlib import Path
from typing import Any

from harness.modes import mode_registry
from harness.spec import (
    DEFAULT_PROVIDER,
    PHASES,
    RunConfig,
    load_provider,
    provider_families,
    resolve_device,
)

RESULTS_DIR = Path("results")


def version() -> str:
    try:
        return metadata.version("optimus-bench")
    except metadata.PackageNotFoundError:
        return "0.0.0+unknown"


def finite_float(text: str) -> float:
    """argparse type: a finite number (``float`` alone accepts 'nan' and 'inf')."""
    try:
        v = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a number: {text!r}") from None
    if not math.isfinite(v):
        raise argparse.ArgumentTypeError(f"must be a finite number, got {text!r}")
    return v


def add_run_options(p: argparse.ArgumentParser, *, models: str | None, scale: str, budget_s: float,
                     max_iters: int, warmup: int, min_iters: int, timeout_s: float, out: str) -> None:  # fmt: skip
    p.add_argument("--models", default=models, help="comma list of model families (default: all)")
    p.add_argument("--scale", default=scale, help=f"model scale preset (default: {scale})")
    p.add_argument(
        "--modes",
        default=",".join(mode_registry.names()),
        help=f"comma list of modes (default: all: {','.join(mode_registry.names())})",
    )
    p.add_argument("--phases", default=",".join(PHASES), help="comma list of phases (default: infer,train)")
    p.add_argument("--device", default="auto", help="cpu, cuda or auto (default: cuda if available)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--warmup", type=int, default=warmup, help=f"untimed steps per cell (default: {warmup})")
    p.add_argument(
        "--min-iters", type=int, default=min_iters, help=f"fewest timed steps (default: {min_iters})"
    )
    p.add_argument(
        "--max-iters", type=int, default=max_iters, help=f"most timed steps (default: {max_iters})"
    )
    p.add_argument("--budget-s", type=finite_float, default=budget_s,
                   help=f"stop timing after this many seconds once min-iters are done (default: {budget_s})")  # fmt: skip
    p.add_argument(
        "--timeout-s", type=finite_float, default=timeout_s, help=f"per-cell timeout (default: {timeout_s:g})"
    )
    p.add_argument("--threads", type=int, default=1,
                   help="torch/OpenMP threads per cell; 0 = torch's default (default: 1, steadiest on a shared CPU)")  # fmt: skip
    p.add_argument("--atol", type=finite_float, default=1e-4, help="parity tolerance vs eager (absolute)")
    p.add_argument("--rtol", type=finite_float, default=1e-3, help="parity tolerance vs eager (relative)")
    p.add_argument("--out", default=out, help=f"results file (default: {out})")
    p.add_argument("--resume", action="store_true", help="keep cells already in --out and run only the rest")
    p.add_argument(
        "--retry-failed", action="store_true", help="with --resume: rerun failed and timed-out cells"
    )
    p.add_argument("--no-progress", action="store_true", help="no progress bar")
    p.add_argument("--limit", action="store_true",
                   help="the compile cells also measure the limit: the ideal step time with their fusable groups "
                        "as ideal batched kernels (harness/measure/limit.py, docs/harness.md 'The limit'; three extra "
                        "compiles per compile cell)")  # fmt: skip
    p.add_argument("--memory-margin", type=finite_float, default=None, metavar="M",
                   help="the Optimus modes' OptimusConfig.memory_margin: a rewrite that lifts the estimated peak "
                        "memory must save more than this share of its own time (default: Optimus's own, 0.0; "
                        "1.0: never lift it; docs/optimus.md 'Memory is a cost')")  # fmt: skip
    p.add_argument("--optimus-guard", default=None, choices=("off", "graph", "rules"),
                   help="the Optimus modes' measured guard (OptimusConfig.guard): keep a rewrite only where it "
                        "measures faster than plain capture on the example inputs, compiled for compile+optimus "
                        "(default: rules for eager+optimus, off for compile+optimus; docs/optimus.md "
                        "'The measured guard')")  # fmt: skip
    p.add_argument("--nproc", type=int, default=1,
                   help="ranks per cell: > 1 runs each cell as one torchrun job with the tables sharded by "
                        "torchrec's planner (docs/sharded.md; default: 1, a single process)")  # fmt: skip
    p.add_argument("--sharding", default="auto",
                   help="with --nproc: table_wise, column_wise, table_column_wise, data_parallel or auto "
                        "(the planner chooses; default)")  # fmt: skip
    p.add_argument("--pg-timeout-s", type=finite_float, default=120.0,
                   help="with --nproc: process-group timeout, s; a peer of a hung rank fails after it (default: 120)")  # fmt: skip
    add_provider_option(p)


PROVIDER_HELP = (
    "the model builder, package.module:function, with models.build's contract (docs/harness.md, "
    f"'Your own model'; default: {DEFAULT_PROVIDER}; without torchrec: models.dense_only:build)"
)


def add_provider_option(p: argparse.ArgumentParser) -> None:
    p.add_argument("--provider", default=DEFAULT_PROVIDER, help=PROVIDER_HELP)


def config_of(args: argparse.Namespace) -> RunConfig:
    load_provider(args.provider)  # a bad --provider is one line and BAD_INPUT, before any cell
    # None (not given) means every family; '' (given empty) is an error, not "all".
    models = ",".join(provider_families(args.provider)) if args.models is None else args.models
    if args.models is not None and not args.models.strip(","):
        raise ValueError("models: empty (--models ''); name at least one family, or omit --models for all")
    if not models:
        raise ValueError(f"models: none given and provider {args.provider!r} lists no FAMILIES")
    quality = quality_options(args)  # before the phases are read: a quality run's default is train
    return RunConfig(
        models=models.split(","),
        scale=args.scale,
        modes=args.modes.split(","),
        phases=args.phases.split(","),
        device=resolve_device(args.device),
        seed=args.seed,
        warmup=args.warmup,
        min_iters=args.min_iters,
        max_iters=args.max_iters,
        budget_s=args.budget_s,
        timeout_s=args.timeout_s,
        threads=args.threads,
        atol=args.atol,
        rtol=args.rtol,
        provider=args.provider,
        nproc=getattr(args, "nproc", 1),
        sharding=getattr(args, "sharding", "auto"),
        pg_timeout_s=getattr(args, "pg_timeout_s", 120.0),
        limit=bool(getattr(args, "limit", False)),
        memory_margin=getattr(args, "memory_margin", None),
        optimus_guard=getattr(args, "optimus_guard", None),
        **quality,
    ).validate()


def quality_options(args: argparse.Namespace) -> dict[str, Any]:
    """The quality run's fields of ``RunConfig`` from ``run``'s options (none from other commands).
    A quality run trains, so its phases default to train; any other phase is refused by validate."""
    steps = getattr(args, "quality", 0)
    if not steps:
        return {}
    if args.phases == ",".join(PHASES):  # not given: the default of a timing run
        args.phases = "train"
    return {
        "quality_steps": steps,
        "quality_seeds": args.quality_seeds,
        "quality_every": args.quality_every,
        "quality_heldout": args.quality_heldout,
        "quality_lr": args.quality_lr,
    }


def print_summary(doc: dict, out: str) -> None:
    counts: dict[str, int] = {}
    for c in doc["cells"]:
        counts[c["status"]] = counts.get(c["status"], 0) + 1
    print(f"wrote {out}: " + ", ".join(f"{n} {s}" for s, n in sorted(counts.items())))
