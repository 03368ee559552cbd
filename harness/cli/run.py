"""`optimus-bench run`: models x modes x phases, one subprocess per cell, into one results file."""

from __future__ import annotations

import argparse
import sys

from harness import exit_codes
from harness.cli.common import add_run_options, config_of, finite_float, print_summary
from harness.outputs import check_output_file
from harness.spec import RunConfig

NAME = "run"
HELP = "run models x modes x phases, one subprocess per cell, into one results file"


def add_arguments(p: argparse.ArgumentParser) -> None:
    add_run_options(p, models=None, scale="tiny", budget_s=2.0, max_iters=200, warmup=3, min_iters=5,
                    timeout_s=900.0, out="results/run.json")  # fmt: skip
    q = p.add_argument_group("training quality (docs/harness.md, 'Training quality')")
    q.add_argument("--quality", type=int, default=0, metavar="STEPS",
                   help="train each mode and an eager copy STEPS steps per seed (same weights, batches and SGD) "
                        "instead of timing; judge held-out AUC and logloss against eager (quality_mismatch); "
                        "phases: train")  # fmt: skip
    q.add_argument("--quality-seeds", type=int, default=3, metavar="N",
                   help="with --quality: seeds --seed .. --seed+N-1 (default: 3)")  # fmt: skip
    q.add_argument("--quality-every", type=int, default=10, metavar="K",
                   help="with --quality: one loss-curve point per K steps, their mean loss (default: 10)")  # fmt: skip
    q.add_argument("--quality-heldout", type=int, default=128, metavar="BATCHES",
                   help="with --quality: held-out batches after the training ones (default: 128)")  # fmt: skip
    q.add_argument("--quality-lr", type=finite_float, default=0.5, metavar="LR",
                   help="with --quality: SGD learning rate (default: 0.5)")  # fmt: skip


def main(args: argparse.Namespace) -> int:
    from harness.run.runner import run_suite

    cfg = config_of(args)
    check_output_file(args.out)  # before measuring: a bad path must not cost the whole run
    plans = plan_all(cfg) if cfg.nproc > 1 else None
    doc = run_suite(
        cfg, args.out, resume=args.resume, retry_failed=args.retry_failed, progress=not args.no_progress,
        sharded_plans=plans,
    )  # fmt: skip
    print_summary(doc, args.out)
    return exit_codes.OK


def plan_all(cfg: RunConfig) -> dict[str, dict]:
    """Plan every model's tables here, before any rank starts: a planner that cannot place them
    is one line and BAD_INPUT (``harness.run.sharded.plan.PlanError`` is a ValueError)."""
    from harness.run.sharded import launch
    from harness.run.sharded.plan import PlanError

    if cfg.device == "cuda":
        import torch

        if torch.cuda.device_count() < cfg.nproc:
            raise ValueError(
                f"nproc: {cfg.nproc} ranks need {cfg.nproc} GPUs, this host has {torch.cuda.device_count()}"
            )
    config = cfg.as_dict()
    plans = {}
    for model in cfg.models:
        try:
            plans[model] = launch.plan_for(config, model)
        except PlanError as e:
            raise PlanError(f"sharding plan for {model}/{cfg.scale}: {e}") from None
        print(f"plan {model}/{cfg.scale} over {cfg.nproc} ranks: {launch.planmod.describe(plans[model])}",
              file=sys.stderr, flush=True)  # fmt: skip
    return plans
