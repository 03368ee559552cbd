"""One rank of a sharded training-quality cell (``run --quality STEPS --nproc N``):
``torchrun ... -m harness.run.sharded.quality_rank SPEC.json OUT_DIR``.

Why: the sharded timing cell checks its rank against the single-process reference for
``rank.PARITY_STEPS`` steps; a drift below the tolerance there can still carry the sharded model
elsewhere over a few hundred steps. Here, per seed, every rank builds the quality task (the
single-process quality cell's ``build_task``: the first STEPS batches train, the next ``heldout``
are held out), keeps an unsharded eager copy (the reference, which trains the same global batches
with plain SGD over all its parameters, as the single-process quality cell's eager copy does),
prepares the mode on the dense arch and shards the model as the timing cell does (``rank``'s
``_prepare``, ``_shard``, ``_dense_optimizer``: torchrec's fused exact SGD on the tables and SGD
on the dense parameters, both at ``quality_lr``), then trains STEPS steps on its share of each
global batch. The global loss of a step is the mean of the ranks' mean losses (an all-reduce:
equal shares), checked against the reference's at every step (``quality.loss_check``). Then the
held-out logits of every rank are gathered (rank 0 scores AUC and logloss) and the parameter
drift is read shard by shard against the reference's slices. Rank 0 judges the seeds with the
single-process cell's ``record_verdict``; the other ranks' records carry their timing and parity.

Why the drift is recorded but not judged here: the ranks reduce in another order than the single
process (DDP averages two half-batch gradients; the table gradients come back through an
all-to-all), and training amplifies that rounding in the parameters: dcn medium, 100 steps, ended
1.26e-4 of the largest move apart (above the single-process rule's 1e-4) with its loss within
4.1e-6 of the reference's at every step and the same AUC to 6e-8 (results/sharded-quality/). A
rank that really drifts shows in the loss at once (1.6e-3 on one rank's weights: 7.8e-4 at the
next step), so the step-by-step loss is the rule, with the held-out AUC and logloss tolerances.

Every rank runs the reference on the whole global batches (as the timing cell does): each one
then checks its rows of the first step's outputs and its own table shards' drift without moving
tensors between ranks. Each seed is prepared and sharded afresh (a compiled mode compiles per
seed), since the re-laid-out or compiled weights of one seed are not reloaded in place under DMP.
"""

from __future__ import annotations

import copy
import os
import sys
import time
from collections.abc import Callable
from typing import Any

from harness.measure import quality, timing
from harness.modes import builtin, mode_registry
from harness.run import cell
from harness.run import quality as single
from harness.run.sharded import data, faults
from harness.run.sharded import rank as rankmod
from harness.spec import CellKey

REFERENCE = "single-process eager, whole global batches, SGD on every parameter"


def _drift(dmp: Any, ref: Any, start: dict[str, Any]) -> dict[str, Any]:
    """``quality.parameter_drift`` of this rank's table shards (against the same slices of the
    reference's tables) and of its dense parameters by name (Optimus's re-laid-out parameters
    have other names: their drift shows in the loss curve), over the reference's largest move."""
    import torch

    ref_state = {k: v.detach() for k, v in ref.state_dict().items()}
    mine: dict[str, Any] = {}
    eager: dict[str, Any] = {}
    begin: dict[str, Any] = {}
    for _, label, t, pick, table in rankmod.matched_params(dmp.state_dict(), start):
        if table or (isinstance(t, torch.Tensor) and t.is_floating_point()):
            mine[label], eager[label], begin[label] = t, pick(ref_state), pick(start)
    out = quality.parameter_drift(mine, eager, begin)
    # how far training moved the reference, over all its parameters (the same on every rank and
    # in every mode: the drift of a mode whose re-laid-out parameters are not compared by name
    # reads against the same move)
    out["moved"] = max((cell.max_err(ref_state[k], v) for k, v in start.items() if v.is_floating_point()),
                       default=0.0)  # fmt: skip
    out["compared"] = len(mine)
    return out


def _gather(t: Any, world: int) -> Any:
    """``t`` of every rank, concatenated in rank order (all ranks hold the same shape)."""
    import torch
    import torch.distributed as dist

    parts = [torch.empty_like(t) for _ in range(world)]
    dist.all_gather(parts, t.contiguous())
    return torch.cat(parts)


def train_seed(spec: dict[str, Any], seed: int, rank: int, world: int, device: Any, progress: rankmod.Progress,
               rec: dict[str, Any], fault: faults.Fault | None) -> tuple[quality.SeedFigures | None, list[float], str | None]:  # fmt: skip
    """One seed on this rank: (figures, on rank 0 only; this rank's step times in ms; a first-step
    mismatch of any rank, which stops every rank before it trains further)."""
    import torch
    import torch.distributed as dist

    key = CellKey(spec["model"], spec["scale"], spec["mode"], spec["phase"])
    cfg = spec["config"]
    steps, heldout = int(cfg["quality_steps"]), int(cfg["quality_heldout"])
    lr, every = float(cfg["quality_lr"]), int(cfg["quality_every"])
    device_kind = cfg.get("device", "cpu")
    sync: Callable[[], None] = torch.cuda.synchronize if device_kind == "cuda" else (lambda: None)
    progress.set("build", -1)
    t_build = time.perf_counter()
    b = single.build_task(cfg["provider"], key.model, key.scale, device_kind, seed, steps + heldout)
    rec.setdefault("build_s", time.perf_counter() - t_build)
    batches = list(b.batches)
    if len(batches) < steps + heldout:
        raise RuntimeError(f"the provider built {len(batches)} batches; the quality run needs {steps} to "
                           f"train and {heldout} held out")  # fmt: skip
    train, held = batches[:steps], batches[steps : steps + heldout]
    module = b.module
    module.train()
    ref = copy.deepcopy(module)  # the single-process reference: whole batches, no sharding
    start = {k: v.detach().clone() for k, v in ref.state_dict().items()}
    tables = {f"sparse.{k}": v.detach().clone() for k, v in module.sparse.state_dict().items()}
    local = [data.local_batch(bt, rank, world) for bt in train]
    local_held = [data.local_batch(bt, rank, world) for bt in held]
    progress.set("prepare")
    with builtin.optimus_guard(cfg.get("optimus_guard")):
        prepared = rankmod._prepare(key, module, cell.example_inputs(b, local), spec["plan"], rank)
    module.dense = prepared.module
    rec.update({k: v for k, v in prepared.info.items() if v is not None})
    rec["prepare_s"] = prepared.prepare_s
    if prepared.reports:
        rec.update(builtin.merge_reports(prepared.reports))
    progress.set("shard")
    dmp = rankmod._shard(spec, module, tables, device, rank, rec, lr)

    def before(n: int) -> None:
        progress.set(step=n)
        faults.fire(fault, rank, n)
        if faults.drift(fault, rank, n, dmp.module):
            rec["fault"] = "drift"

    forward = cell.forward_fn(b, True)
    step = cell.step_fn(dmp, local, rankmod._dense_optimizer(dmp, lr), forward, before)
    ref_step = cell.step_fn(ref, train, torch.optim.SGD(ref.parameters(), lr=lr), forward)
    start_tasks = single.heldout_scores(*single.heldout_logits(ref, held))[0] if rank == 0 else []
    atol, rtol = float(cfg["atol"]), float(cfg["rtol"])
    n_local = int(local[0].labels.shape[0])
    losses: list[float] = []
    ref_losses: list[float] = []
    times: list[float] = []
    flag = torch.zeros(1)
    progress.set("train")
    dist.barrier()
    for i, (mine, whole) in enumerate(zip(local, train, strict=True)):
        t0 = time.perf_counter()
        out = step()
        sync()
        times.append((time.perf_counter() - t0) * 1e3)
        r = ref_step()
        if i == 0:  # the first step's outputs: this rank's rows of the reference's
            rows = r[rank * n_local : (rank + 1) * n_local]
            err = cell.max_err(rows, out.to(rows.device)) if rows.shape == out.shape else float("inf")
            rec["parity"] = {"reference": REFERENCE, "steps": 1, "outputs_compared": 1, "max_out_err": err,
                             "atol": atol, "rtol": rtol}  # fmt: skip
            rec["max_abs_err"] = err
            own = not cell.close(rows, out.to(rows.device), atol, rtol)
            flag.fill_(1.0 if own else 0.0)
            dist.all_reduce(flag, op=dist.ReduceOp.MAX)  # every rank stops if any differs
            if flag.item():
                why = f"max abs err {err:.3g}" if own else "on a peer"
                return None, times, f"first training step differs from the reference ({why})"
        with torch.no_grad():
            loss = b.loss(out.detach().float(), mine.labels).reshape(1).double()
            dist.all_reduce(loss)  # the global loss: the mean of the ranks' means (equal shares)
            losses.append(float(loss) / world)
            ref_losses.append(float(b.loss(r.detach().float(), whole.labels)))
    progress.set("heldout")
    logits, labels = single.heldout_logits(dmp, local_held)
    logits, labels = _gather(logits, world), _gather(labels, world)
    drifts: list[Any] = [None] * world
    dist.all_gather_object(drifts, _drift(dmp, ref, start))
    if rank != 0:
        return None, times, None
    worst = max(drifts, key=lambda d: d["drift"])
    moved = max(d["moved"] for d in drifts)
    tasks, ll = single.heldout_scores(logits, labels)
    ref_tasks, ref_ll = single.heldout_scores(*single.heldout_logits(ref, held))
    figures = quality.SeedFigures(
        seed=seed, auc=quality.mean_auc(tasks), logloss=ll, eager_auc=quality.mean_auc(ref_tasks),
        eager_logloss=ref_ll, eager_auc_start=quality.mean_auc(start_tasks), drift=worst["drift"],
        drift_rel=worst["drift"] / moved if moved else None, drift_param=worst["drift_param"],
        auc_per_task=tasks, curve=quality.loss_curve(losses, every), eager_curve=quality.loss_curve(ref_losses, every),
        loss_check=quality.loss_check(losses, ref_losses),
    )  # fmt: skip
    rec["drift_params_compared"] = sum(d["compared"] for d in drifts)
    return figures, times, None


def run_rank(spec: dict[str, Any], rank: int, world: int, progress: rankmod.Progress) -> dict[str, Any]:
    """Every seed of the cell on this rank; rank 0's record carries the cell's ``quality``."""
    cfg = spec["config"]
    rec: dict[str, Any] = {"rank": rank, "status": "failed", "error": None, "pid": os.getpid()}
    builtin.disable_compile_caches()
    fault = faults.parse()
    _, device = rankmod._join(cfg, rank, progress)
    seeds = [int(cfg["seed"]) + i for i in range(int(cfg["quality_seeds"]))]
    figures: list[quality.SeedFigures] = []
    samples: list[float] = []
    first_calls: list[float] = []
    for seed in seeds:
        fig, times, problem = train_seed(spec, seed, rank, world, device, progress, rec, fault)
        # a seed's first step compiles in a compiled mode (each seed is prepared anew): not a sample
        first_calls += times[:1]
        samples += times[1:]
        if problem:
            rec["status"], rec["error"] = "mismatch", f"seed {seed}: {problem}"
            break
        if fig is not None:
            figures.append(fig)
    else:
        rec["status"] = "ok"
    rec["latency_ms"] = timing.summarize(samples or first_calls[:1] or [0.0])
    rec["first_call_s"] = (first_calls[0] if first_calls else 0.0) / 1e3
    cell.record_compile_time(rec, float(rec.get("prepare_s") or 0.0), rec["first_call_s"],
                             mode_registry.get(spec["mode"]).compiled)  # fmt: skip
    if figures and rec["status"] == "ok":
        single.record_verdict(rec, figures, cfg, "the single-process reference", drift_rtol=None)
        rec["quality"]["reference"] = REFERENCE
        rec["quality"]["seeds_run"] = len(figures)
    rec["loadavg_1m"] = os.getloadavg()[0]
    progress.set("done")
    import torch.distributed as dist

    dist.barrier()  # nobody leaves while a peer still needs it in a collective
    return rec


def main(argv: list[str] | None = None) -> int:
    return rankmod.serve(run_rank, "harness.run.sharded.quality_rank", argv)


if __name__ == "__main__":
    sys.exit(main())
