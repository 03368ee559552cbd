"""One rank of a side-by-side sharded measurement:
``torchrun ... -m harness.run.sharded.paired_rank SPEC.json OUT_DIR`` (``optimus-bench ab --nproc``).

Why inside one job: two sharded cells run minutes apart, each under the load of its own
minutes, and on the 2-core machine two runs of the same cells disagreed by up to 2.5x. Here
every mode is prepared on its own copy of the same seeded model (its own DistributedModelParallel
over the same plan and process group), and the ranks time the modes in alternating rounds, all
in step: A then B, then B then A, ... Each timed step starts after a barrier and its time is the
slowest rank's (an all-reduce of the ranks' times, outside the timing), as in a sharded cell.
A mode's figure in a round is the median of its ``steps`` steps; the parent takes the per-round
ratios against the first mode.

Each mode's first call is checked against the first mode's (outputs of the same batch from the
same weights); rank 0 writes the rounds, every rank writes its status (the parent's failure
diagnosis reads the same files as a sharded cell's).
"""

from __future__ import annotations

import copy
import os
import statistics
import sys
import time
from typing import Any

from harness.run import cell
from harness.run.sharded import data
from harness.run.sharded.rank import Progress, _dense_optimizer, _join, _prepare, _shard, serve
from harness.spec import CellKey

SIDE_FIELDS = ("optimus_layout", "optimus_gradients", "relaid_groups", "rules_fired", "optimus_path")


def run_paired_rank(spec: dict[str, Any], rank: int, world: int, progress: Progress) -> dict[str, Any]:
    import torch
    import torch.distributed as dist

    from harness.modes import builtin

    cfg = spec["config"]
    modes: list[str] = list(spec["modes"])
    rec: dict[str, Any] = {"rank": rank, "status": "failed", "error": None, "pid": os.getpid()}
    builtin.disable_compile_caches()
    device_kind, device = _join(cfg, rank, progress)
    progress.set("build")
    b = cell.build_model(cfg["provider"], spec["model"], spec["scale"], device_kind, int(cfg["seed"]))
    batches = list(b.batches)
    if not batches:
        raise RuntimeError("model provided no batches")
    train, lr = spec["phase"] == "train", 0.01
    tables = {f"sparse.{k}": v.detach().clone() for k, v in b.module.sparse.state_dict().items()}
    local = [data.local_batch(bt, rank, world) for bt in batches]
    sync: Any = torch.cuda.synchronize if device_kind == "cuda" else (lambda: None)
    forward = cell.forward_fn(b, train)
    steps, sides = [], []
    for mode in modes:
        progress.set(f"prepare {mode}")
        module = copy.deepcopy(b.module)
        module.train(train)
        key = CellKey(spec["model"], spec["scale"], mode, spec["phase"])
        with builtin.optimus_guard(cfg.get("optimus_guard")):  # every rank: the first rank's figures
            prepared = _prepare(key, module, cell.example_inputs(b, local), spec["plan"], rank)
        module.dense = prepared.module
        side: dict[str, Any] = {"mode": mode, "prepare_s": prepared.prepare_s}
        side.update({k: v for k, v in prepared.info.items() if k in SIDE_FIELDS and v is not None})
        dmp = _shard(spec, module, tables, device, rank, {}, lr)
        step = cell.step_fn(dmp, local, _dense_optimizer(dmp, lr) if train else None, forward)
        progress.set(f"first call {mode}")
        dist.barrier()
        out, side["first_call_s"] = cell.first_call(step, sync)
        side["first_out"] = out.detach().float().cpu()
        steps.append(step)
        sides.append(side)
    base_out = sides[0].pop("first_out")
    for side in sides[1:]:
        o = side.pop("first_out")
        ok = cell.close(base_out, o, float(cfg["atol"]), float(cfg["rtol"]))
        side["parity_vs_base"] = {
            "ok": ok,
            "max_abs_err": cell.max_err(base_out, o) if o.shape == base_out.shape else None,
        }
    progress.set("warmup")
    for step in steps:
        for _ in range(int(cfg["warmup"])):
            step()
    sync()
    rounds_ms: list[list[float]] = [[] for _ in modes]
    elapsed = torch.zeros(1)
    for r in range(int(cfg["rounds"])):
        progress.set("rounds", r)
        order = range(len(modes)) if r % 2 == 0 else reversed(range(len(modes)))
        for i in order:
            ms = []
            for _ in range(int(cfg["steps"])):
                dist.barrier()
                t0 = time.perf_counter()
                steps[i]()
                sync()
                elapsed.fill_(time.perf_counter() - t0)
                dist.all_reduce(elapsed, op=dist.ReduceOp.MAX)  # the slowest rank's step
                ms.append(float(elapsed.item()) * 1e3)
            rounds_ms[i].append(statistics.median(ms))
    for side, ms in zip(sides, rounds_ms, strict=True):
        side["rounds_ms"] = ms
    rec["sides"] = sides
    rec["loadavg_1m"] = os.getloadavg()[0]
    rec["status"] = "ok"
    progress.set("done")
    dist.barrier()
    return rec


def main(argv: list[str] | None = None) -> int:
    return serve(run_paired_rank, "harness.run.sharded.paired_rank", argv)


if __name__ == "__main__":
    sys.exit(main())
