"""``optimus-bench ab --nproc N``: modes of one sharded model timed side by side inside one
torchrun job (``harness.run.sharded.paired_rank``), with the same result document as ``ab``.

Why: a sharded cell and the cell it is compared with ran minutes apart under different load,
so their ratio carried that load (two runs of the same cells disagreed by up to 2.5x). Inside
one job the modes share the ranks, the cores and the minute; the per-round ratio of the
slowest rank's step cancels the drift, and its median gets a seeded bootstrap 95% interval.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np

from harness.env import collect_env
from harness.run.sharded import launch, merge
from harness.run.sharded import plan as planmod
from harness.stats import bootstrap_median

PAIRED_RANK_MODULE = "harness.run.sharded.paired_rank"
DOC_CONFIG = ("rounds", "steps", "warmup", "seed", "threads", "atol", "rtol", "nproc", "sharding")


class ShardedABError(RuntimeError):
    """The job failed: which rank, where, and why (one line)."""


def run_ab_sharded(
    model: str,
    scale: str,
    phase: str,
    mode_names: Sequence[str],
    *,
    nproc: int,
    sharding: str = "auto",
    rounds: int = 15,
    steps: int = 5,
    warmup: int = 3,
    seed: int = 0,
    threads: int = 1,
    atol: float = 1e-4,
    rtol: float = 1e-3,
    provider: str,
    timeout_s: float = 3600.0,
    log: Callable[[str], None] = print,
) -> dict[str, Any]:
    """Plan the tables over ``nproc`` ranks, run every mode in one torchrun job, and summarize
    the rounds as ``ab`` does (speedup = base ms / mode ms, per round)."""
    config: dict[str, Any] = {
        "provider": provider, "scale": scale, "seed": seed, "nproc": nproc, "sharding": sharding,
        "device": "cpu", "threads": threads, "rounds": rounds, "steps": steps, "warmup": warmup,
        "atol": atol, "rtol": rtol, "pg_timeout_s": launch.DEFAULT_PG_TIMEOUT_S,
    }  # fmt: skip
    try:
        plan_doc = launch.plan_for(config, model)
    except planmod.PlanError as e:
        raise ShardedABError(f"sharding plan for {model}/{scale}: {e}") from None
    spec = {"model": model, "scale": scale, "phase": phase, "modes": list(mode_names), "config": config,
            "plan": plan_doc}  # fmt: skip
    log(f"[ab] {model}/{scale}/{phase}: {', '.join(mode_names)} on {nproc} ranks ({planmod.describe(plan_doc)}), "
        f"{rounds} rounds x {steps} steps")  # fmt: skip
    t0 = time.perf_counter()
    job = launch.run_job(spec, nproc, config, timeout_s, f"ab-{model}-{scale}-{phase}", PAIRED_RANK_MODULE)
    done = len(job.recs) == nproc and all(r.get("status") == "ok" for r in job.recs.values())
    if not done or job.timed_out:
        _, reason = merge.diagnose(job.recs, job.prog, job.log_text, nproc, job.timed_out, timeout_s,
                                   float(config["pg_timeout_s"]))  # fmt: skip
        raise ShardedABError(f"sharded ab of {model}/{scale}/{phase}: {reason}")
    doc = summarize(model, scale, phase, job.recs[0]["sides"], config, plan_doc, time.perf_counter() - t0)
    doc["loadavg_1m"] = job.recs[0].get("loadavg_1m")  # at the end of rank 0's rounds
    return doc


def summarize(model: str, scale: str, phase: str, sides: list[dict[str, Any]], config: dict[str, Any],
              plan_doc: dict[str, Any], wall_s: float) -> dict[str, Any]:  # fmt: skip
    """``ab``'s document from rank 0's sides: per mode its rounds, and against the first mode the
    median per-round speedup with its bootstrap interval."""
    base = np.asarray(sides[0]["rounds_ms"], dtype=float)
    rows: dict[str, Any] = {}
    for i, side in enumerate(sides):
        x = np.asarray(side["rounds_ms"], dtype=float)
        q1, med, q3 = (float(v) for v in np.percentile(x, [25, 50, 75]))
        row: dict[str, Any] = {"median_ms": med, "iqr_ms": q3 - q1, "rounds_ms": [float(v) for v in x],
                               "first_call_s": side["first_call_s"]}  # fmt: skip
        row.update({k: v for k, v in side.items() if k not in ("mode", "rounds_ms", "first_call_s")})
        if i:
            speedups = base / x
            lo, hi = bootstrap_median(speedups)
            row["speedup_vs_base"] = float(np.median(speedups))
            row["speedup_ci95"] = (lo, hi)
        rows[side["mode"]] = row
    return {
        "kind": "optimus-bench-ab",
        "env": collect_env("cpu"),
        "model": model,
        "scale": scale,
        "phase": phase,
        "base": sides[0]["mode"],
        "config": {k: config[k] for k in DOC_CONFIG} | {"device": "cpu"},
        "plan_summary": planmod.describe(plan_doc),
        "wall_s": wall_s,
        "modes": rows,
    }
