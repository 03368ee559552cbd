"""`optimus-bench ab`: two or more modes of one model timed side by side, each in worker processes
of its own, interleaved round by round (``harness.run.interleaved``)."""

from __future__ import annotations

import argparse
import json
import os
import sys
from typing import Any

from harness import exit_codes
from harness.cli.common import add_provider_option, finite_float
from harness.outputs import check_output_file
from harness.spec import load_provider, parse_list, provider_families, provider_scales, resolve_device

NAME = "ab"
HELP = "time two or more modes of one model side by side, in worker processes, interleaved round by round"


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--model", required=True, help="model family")
    p.add_argument("--scale", default="tiny", help="model scale preset (default: tiny)")
    p.add_argument("--phase", default="infer", help="infer or train (default: infer)")
    p.add_argument("--modes", default="compile,compile+optimus",
                   help="comma list; the first is the base of the speedups (default: compile,compile+optimus)")  # fmt: skip
    p.add_argument(
        "--rounds", type=int, default=15, help="rounds; each times every mode in turn (default: 15)"
    )
    p.add_argument("--steps", type=int, default=5, help="steps per mode per round (default: 5)")
    p.add_argument("--warmup", type=int, default=3, help="untimed steps per mode (default: 3)")
    p.add_argument(
        "--round-warmup-ms",
        type=finite_float,
        default=50.0,
        help="untimed steps at the start of each worker's turn (not with --nproc), enough to fill this many ms: a worker that idled while the others took their turns runs its first steps slower (default: 50; 0: none)",
    )
    p.add_argument("--processes", type=int, default=1,
                   help="worker processes per mode; 2 or more also report the spread between a mode's processes (default: 1)")  # fmt: skip
    p.add_argument("--nproc", type=int, default=1,
                   help="ranks of a sharded run (torchrun, DistributedModelParallel): 2 or more time the modes inside one job, all ranks in step, slowest rank per step (default: 1, no sharding)")  # fmt: skip
    p.add_argument("--sharding", default="auto",
                   help="with --nproc: the tables' sharding, as run --sharding (default: auto)")  # fmt: skip
    p.add_argument("--timeout-s", type=finite_float, default=3600.0,
                   help="with --nproc: the whole job's limit in seconds (default: 3600)")  # fmt: skip
    p.add_argument("--device", default="auto", help="cpu, cuda or auto (default: cuda if available)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--threads", type=int, default=1, help="torch threads; 0 = torch's default (default: 1)")
    p.add_argument(
        "--atol", type=finite_float, default=1e-4, help="parity tolerance vs the base mode (absolute)"
    )
    p.add_argument(
        "--rtol", type=finite_float, default=1e-3, help="parity tolerance vs the base mode (relative)"
    )
    p.add_argument("--optimus-guard", default=None, choices=("off", "graph", "rules"),
                   help="the Optimus modes' measured guard in every worker (default: rules for eager+optimus, "
                        "off for compile+optimus; docs/optimus.md 'The measured guard')")  # fmt: skip
    p.add_argument("--out", help="also write the result as JSON here (atomically)")
    add_provider_option(p)


def main(args: argparse.Namespace) -> int:
    from harness.run import interleaved
    from harness.store import results

    names = [m.strip() for m in args.modes.split(",") if m.strip()]
    load_provider(args.provider)  # a bad --provider is one line and BAD_INPUT, before any work
    _check_model_and_scale(args)
    if args.out:
        check_output_file(args.out)  # before measuring: the measurement takes minutes
    if args.nproc < 1:
        raise ValueError(f"--nproc: {args.nproc}; need 1 (no sharding) or more ranks")
    if args.optimus_guard is not None:  # the workers inherit it (harness.modes.builtin.guard_for)
        from harness.modes.builtin import GUARD_ENV

        os.environ[GUARD_ENV] = args.optimus_guard
    if args.nproc > 1:
        doc = _sharded(args, names)
        if doc is None:
            return exit_codes.INCOMPLETE
    else:
        doc = _single(args, names)
    doc.setdefault("config", {})["optimus_guard"] = args.optimus_guard  # None: each mode's default
    print(interleaved.format_ab(doc))
    if args.out:
        results.write_atomic(args.out, json.dumps(doc, indent=1) + "\n")
        print(f"wrote {args.out}")
    mismatched = [m for m, r in doc["modes"].items() if not r.get("parity_vs_base", {"ok": True})["ok"]]
    return exit_codes.MISMATCH if mismatched else exit_codes.OK


def _check_model_and_scale(args: argparse.Namespace) -> None:
    """A model or scale the provider does not have is one line here, not a worker's traceback
    after the workers started (a provider without `FAMILIES` takes any model name)."""
    families = provider_families(args.provider)
    if families:
        parse_list([args.model], "model", families)
    parse_list([args.scale], "scale", provider_scales(args.provider))


def _single(args: argparse.Namespace, names: list[str]) -> dict[str, Any]:
    from harness.run import interleaved

    return interleaved.run_ab(
        args.model, args.scale, args.phase, names,
        rounds=args.rounds, steps=args.steps, warmup=args.warmup, processes=args.processes,
        device=resolve_device(args.device),
        seed=args.seed, threads=args.threads, atol=args.atol, rtol=args.rtol, provider=args.provider,
        round_warmup_ms=args.round_warmup_ms, log=lambda msg: print(msg, file=sys.stderr, flush=True),
    )  # fmt: skip


def _sharded(args: argparse.Namespace, names: list[str]) -> dict[str, Any] | None:
    """The modes side by side in one torchrun job; None (after one line on stderr) when it failed."""
    from harness.modes import mode_registry
    from harness.run.interleaved import check_choice
    from harness.run.sharded.ab import ShardedABError, run_ab_sharded
    from harness.spec import PHASES

    if args.processes != 1:
        raise ValueError("--processes: with --nproc the ranks are the processes; leave --processes at 1")
    if resolve_device(args.device) != "cpu":
        raise ValueError("--nproc: side-by-side sharded runs use gloo on CPU; pass --device cpu")
    check_choice(names, mode_registry.names(), "modes")
    check_choice([args.phase], PHASES, "phase")
    if len(names) < 2 or len(set(names)) != len(names):
        raise ValueError(f"modes: need two or more distinct modes, got {names}")
    try:
        return run_ab_sharded(
            args.model, args.scale, args.phase, names, nproc=args.nproc, sharding=args.sharding,
            rounds=args.rounds, steps=args.steps, warmup=args.warmup, seed=args.seed, threads=args.threads,
            atol=args.atol, rtol=args.rtol, provider=args.provider, timeout_s=args.timeout_s,
            log=lambda msg: print(msg, file=sys.stderr, flush=True),
        )  # fmt: skip
    except ShardedABError as e:
        print(f"optimus-bench ab: {e}", file=sys.stderr)
        return None
