"""One rank of a sharded cell: ``torchrun ... -m harness.run.sharded.rank SPEC.json OUT_DIR``.

Order inside a rank: join the process group (with a timeout, so no rank waits forever on a
dead peer), build the model (seeded: every rank and the reference build the same weights),
keep an unsharded eager copy as the single-process reference, take this rank's share of
every batch, prepare the mode on the dense arch (before DistributedModelParallel wraps it, so
DDP all-reduces the parameters the mode really runs: under the process group the re-layout
makes its members the autograd leaves, optimus/params/attach.py),
shard the tables with the parent's plan and load the reference's table weights into the
shards, then: the first call (compile time), the parity steps against the reference (outputs
of every step; in training the updated tables and dense parameters), warm-up, timed steps
that start together (rank 0 broadcasts go/stop before each one), and one step's peak memory.
The rank writes ``rank<R>.json`` (its record) and keeps ``rank<R>.progress.json`` (pid, phase,
step) current, so the parent can say which rank failed where even when it was SIGKILLed.
"""

from __future__ import annotations

import copy
import datetime
import functools
import json
import operator
import os
import sys
import time
import traceback
import types
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

from harness.measure import memory, step_split, timing
from harness.modes import builtin, mode_registry
from harness.run import cell
from harness.run.sharded import data, faults
from harness.run.sharded import plan as planmod
from harness.spec import CellKey
from optimus.atomic import write_atomic

PARITY_STEPS = 3  # steps compared with the reference (the first call is the first of them)
MEMORY_STEPS = 5  # steps whose highest peak is the rank's memory (memory.highest_step_peak_memory)


class Progress:
    """``rank<R>.progress.json``: what the rank is doing now (replaced, not appended)."""

    def __init__(self, out_dir: Path, rank: int) -> None:
        self.path = out_dir / f"rank{rank}.progress.json"
        self.rank = rank
        self.phase, self.step = "start", -1

    def set(self, phase: str | None = None, step: int | None = None) -> None:
        if phase is not None:
            self.phase = phase
        if step is not None:
            self.step = step
        tmp = self.path.with_suffix(".tmp")
        tmp.write_text(
            json.dumps({"rank": self.rank, "pid": os.getpid(), "phase": self.phase, "step": self.step})
        )
        os.replace(tmp, self.path)


def _ordered_forward(names: list[str]) -> Callable[..., Any]:
    """RecModel.forward with the pooled features in the model's own order.

    A sharded EBC returns its KeyedTensor grouped by shard (table-wise over 2 ranks: f0, f2,
    f1, f3), so ``.values()`` would feed the dense arch columns in another order. The sharded
    lookups (their all-to-alls waited for by ``keys()``, the reorder) and the dense arch are
    the step split's ``sparse`` and ``dense_forward`` (harness/measure/step_split.py)."""

    def forward(self: Any, dense_features: Any, kjt: Any) -> Any:
        import torch

        with step_split.mark("sparse"):
            kt = self.sparse(kjt)
            if list(kt.keys()) == names:
                pooled = kt.values()
            else:
                parts = kt.to_dict()
                pooled = torch.cat([parts[n] for n in names], dim=1)
        with step_split.mark("dense_forward"):
            return self.dense(dense_features, pooled)

    return forward


def _shards(state: dict[str, Any]) -> dict[str, list[tuple[list[int], list[int], Any]]]:
    """Sharded table tensors of a DMP state dict: name -> [(offsets, sizes, local tensor)]."""
    from torch.distributed._shard.sharded_tensor import ShardedTensor

    out = {}
    for k, v in state.items():
        if isinstance(v, ShardedTensor):
            out[k] = [
                (list(s.metadata.shard_offsets), list(s.metadata.shard_sizes), s.tensor)
                for s in v.local_shards()
            ]
    return out


def _slice(full: Any, offsets: list[int], sizes: list[int]) -> Any:
    return full[offsets[0] : offsets[0] + sizes[0], offsets[1] : offsets[1] + sizes[1]]


def load_tables(dmp: Any, source: dict[str, Any]) -> int:
    """Copy the unsharded model's table weights into this rank's shards (DMP initializes its
    own); data-parallel replicas are plain tensors of the same name. Returns tensors copied."""
    import torch

    n = 0
    state = dmp.state_dict()
    shards = _shards(state)
    with torch.no_grad():
        for k, pieces in shards.items():
            for offsets, sizes, t in pieces:
                t.copy_(_slice(source[k], offsets, sizes))
                n += 1
        for k, v in state.items():
            if k in shards or k not in source or not isinstance(v, torch.Tensor) or "sparse" not in k:
                continue
            v.copy_(source[k])
            n += 1
    return n


def _join(cfg: dict[str, Any], rank: int, progress: Progress) -> tuple[str, Any]:
    """Join the process group (with a timeout: no rank waits forever on a dead peer) on this
    rank's device; (device kind, torch device)."""
    import torch
    import torch.distributed as dist

    if cfg.get("threads"):
        torch.set_num_threads(int(cfg["threads"]))
    device_kind = cfg.get("device", "cpu")
    local_rank = int(os.environ.get("LOCAL_RANK", rank))
    if device_kind == "cuda":
        torch.cuda.set_device(local_rank)
        device = torch.device("cuda", local_rank)
    else:
        device = torch.device("cpu")
    progress.set("init_process_group")
    dist.init_process_group(
        "nccl" if device_kind == "cuda" else "gloo",
        timeout=datetime.timedelta(seconds=float(cfg.get("pg_timeout_s") or 60.0)),
    )
    return device_kind, device


def _prepare(key: CellKey, module: Any, example: tuple[Any, ...], plan_doc: dict[str, Any], rank: int) -> Any:
    """The mode prepared on the dense arch, under the process group: the re-layout makes its
    members the autograd leaves there, so DMP's dense DDP all-reduces them (the cell's
    ``optimus_gradients`` says so). The memory beside the dense arch that the Optimus modes'
    ceiling counts is what this rank will hold once sharded (its table shards), not every table
    of the unsharded ``module``."""
    from optimus.memory.live import storage_bytes

    weights = {name: bag.weight for name, bag in module.sparse.embedding_bags.items()}
    outside = builtin.bytes_outside(module, module.dense) - storage_bytes(list(weights.values()))
    outside += planmod.rank_table_bytes(plan_doc, rank, weights)
    return mode_registry.prepare(key.mode, module.dense, example, outside_bytes=outside)


def _shard(spec: dict[str, Any], module: Any, tables: dict[str, Any], device: Any, rank: int,
           rec: dict[str, Any], lr: float) -> Any:  # fmt: skip
    """The model under DistributedModelParallel with the parent's plan, the reference's table
    weights loaded into this rank's shards, and the embedding lookups in the reference's order."""
    from torchrec.distributed.model_parallel import DistributedModelParallel

    names = [f for c in module.sparse.embedding_bag_configs() for f in c.feature_names]
    plan_doc = spec["plan"]
    dmp = DistributedModelParallel(
        module, device=device, plan=planmod.sharding_plan(plan_doc), sharders=[planmod.sharder(lr)]
    )
    rec["tables_loaded"] = load_tables(dmp, tables)
    inner = dmp.module  # the RecModel (DMP unwraps its DDP)
    inner.forward = types.MethodType(_ordered_forward(names), inner)
    rec["shard"] = planmod.rank_shards(plan_doc, rank)
    return dmp


def _dense_optimizer(dmp: Any, lr: float) -> Any:
    """SGD over the parameters that are not updated inside backward (the tables are)."""
    import torch
    from torchrec.optim.keyed import KeyedOptimizerWrapper
    from torchrec.optim.optimizers import in_backward_optimizer_filter

    dense_params = dict(in_backward_optimizer_filter(dmp.named_parameters()))
    return KeyedOptimizerWrapper(dense_params, lambda ps: torch.optim.SGD(ps, lr=lr))


def _parity(outs: list[Any], ref_step: Callable[[], Any], n_local: int, rank: int, cfg: dict[str, Any]) -> tuple[dict[str, Any], list[str]]:  # fmt: skip
    """This rank's outputs of the parity steps against its rows of the single-process
    reference's outputs, step by step; (parity fields, mismatches)."""
    atol, rtol = float(cfg["atol"]), float(cfg["rtol"])
    lo, hi = rank * n_local, (rank + 1) * n_local
    mismatch: list[str] = []
    worst_out = 0.0
    for i, o in enumerate(outs):
        r = ref_step()[lo:hi]
        worst_out = max(worst_out, cell.max_err(r, o.to(r.device)) if r.shape == o.shape else float("inf"))
        if not cell.close(r, o.to(r.device), atol, rtol):
            mismatch.append(
                f"step {i} outputs differ from the single-process eager run (max abs err {worst_out:.3g})"
            )
    parity: dict[str, Any] = {
        "reference": "single-process eager, whole batches",
        "steps": PARITY_STEPS,
        "outputs_compared": len(outs),
        "max_out_err": worst_out,
        "atol": atol,
        "rtol": rtol,
    }
    return parity, mismatch


def run_rank(spec: dict[str, Any], rank: int, world: int, progress: Progress) -> dict[str, Any]:
    import torch
    import torch.distributed as dist

    key = CellKey(spec["model"], spec["scale"], spec["mode"], spec["phase"])
    cfg = spec["config"]
    rec: dict[str, Any] = {"rank": rank, "status": "failed", "error": None, "pid": os.getpid()}
    builtin.disable_compile_caches()
    fault = faults.parse()
    device_kind, device = _join(cfg, rank, progress)
    progress.set("build")
    t_build = time.perf_counter()
    b = cell.build_model(cfg["provider"], key.model, key.scale, device_kind, int(cfg["seed"]))
    rec["build_s"] = time.perf_counter() - t_build
    module, batches = b.module, list(b.batches)
    if not batches:
        raise RuntimeError("model provided no batches")
    train, lr = key.phase == "train", 0.01
    ref = copy.deepcopy(module)  # the single-process eager reference: whole batches, no sharding
    ref.train(train)
    module.train(train)
    tables = {f"sparse.{k}": v.detach().clone() for k, v in module.sparse.state_dict().items()}
    local = [data.local_batch(bt, rank, world) for bt in batches]

    progress.set("prepare")
    with builtin.optimus_guard(cfg.get("optimus_guard")):  # every rank: the first rank's figures
        prepared = _prepare(key, module, cell.example_inputs(b, local), spec["plan"], rank)
    module.dense = prepared.module
    rec.update({k: v for k, v in prepared.info.items() if v is not None})
    mode = mode_registry.get(key.mode)

    progress.set("shard")
    dmp = _shard(spec, module, tables, device, rank, rec, lr)
    if faults.skew(fault, rank, dmp.module):
        rec["fault"] = "skew"
    optimizer = _dense_optimizer(dmp, lr) if train else None

    def before(n: int) -> None:
        progress.set(step=n)
        faults.fire(fault, rank, n)
        if faults.drift(fault, rank, n, dmp.module):
            rec["fault"] = "drift"

    forward = cell.forward_fn(b, train)  # the single-process cell's step, loss and backward
    marked = step_split.marked_optimizer(optimizer)
    step = cell.step_fn(dmp, local, marked, _marked_forward(b) if train else forward, before)
    sync: Callable[[], None] = torch.cuda.synchronize if device_kind == "cuda" else (lambda: None)
    graphs_before = cell.dynamo_counts()["graphs"]
    progress.set("first_call")
    dist.barrier()
    out, first_call_s = cell.first_call(step, sync)
    rec["first_call_s"] = first_call_s
    graphs_first = cell.dynamo_counts()["graphs"]
    if prepared.reports:
        rec.update(builtin.merge_reports(prepared.reports))
    rec["prepare_s"] = prepared.prepare_s

    # Parity with the single-process eager reference over PARITY_STEPS steps.
    progress.set("parity")
    outs = [out] + [step() for _ in range(PARITY_STEPS - 1)]
    ref_opt = torch.optim.SGD(ref.parameters(), lr=lr) if train else None
    ref_step = cell.step_fn(ref, batches, ref_opt, forward)
    parity, mismatch = _parity(outs, ref_step, int(local[0].labels.shape[0]), rank, cfg)
    if train:
        parity.update(_compare_params(dmp, ref, parity["atol"], parity["rtol"], mismatch))
    rec["max_abs_err"] = parity["max_out_err"]
    rec["parity"] = parity
    del ref, ref_opt, outs, out

    progress.set("timing")
    rec["latency_ms"] = timing.summarize(timed_steps(step, cfg, device_kind, sync))
    cell.record_compile_time(rec, prepared.prepare_s, first_call_s, mode.compiled)
    if train:  # where the step goes: after the timed steps, so the profiler does not touch them
        progress.set("step_split")
        dist.barrier()
        rec["step_split_ms"] = step_split.profile_split(step)
    progress.set("memory")
    static = cell.step_static_tensors(dmp, optimizer)
    dist.barrier()
    rec.update(memory.highest_step_peak_memory(step, device_kind, static, MEMORY_STEPS))
    cell.record_graphs(rec, mode.compiled, graphs_before, graphs_first)
    rec["loadavg_1m"] = os.getloadavg()[0]
    rec["status"] = "mismatch" if mismatch else "ok"
    rec["error"] = "; ".join(mismatch) if mismatch else None
    progress.set("done")
    dist.barrier()  # nobody leaves while a peer still needs it in a collective
    return rec


def _marked_forward(b: Any) -> Callable[[Any, Any], Any]:
    """``cell.forward_fn``'s training forward with its backward marked for the step split."""

    def forward(m: Any, batch: Any) -> Any:
        logits = m(*batch.inputs)
        loss = b.loss(logits, batch.labels)
        with step_split.mark("backward"):
            loss.backward()
        return logits

    return forward


Matched = tuple[str, str, Any, Callable[[dict[str, Any]], Any], bool]


def _piece(key: str, offsets: list[int], sizes: list[int], state: dict[str, Any]) -> Any:
    return _slice(state[key], offsets, sizes)


def matched_params(state: dict[str, Any], names: Any) -> Iterator[Matched]:
    """This rank's tables and dense parameters in ``state`` (a DMP ``state_dict``), each paired with
    how to take the same piece of an unsharded state: (name, label, tensor, pick, is a table
    shard). A table shard's ``pick`` slices the full table (its label names the slice); a
    parameter's, present in ``names`` (the unsharded state's keys), reads it by name. Shared by the
    parity steps' comparison and the quality cell's drift, which read the same pieces."""
    shards = _shards(state)
    for k, pieces in shards.items():
        for offsets, sizes, t in pieces:
            label = f"{k}[{offsets[0]}:{offsets[0] + sizes[0]},{offsets[1]}:{offsets[1] + sizes[1]}]"
            yield k, label, t, functools.partial(_piece, k, offsets, sizes), True
    for k, v in state.items():
        name = cell._param_name(k)
        if k in shards or name not in names or not hasattr(v, "shape"):
            continue
        if name.startswith(("sparse.", "dense.")):
            yield name, name, v, operator.itemgetter(name), False


def _compare_params(dmp: Any, ref: Any, atol: float, rtol: float, mismatch: list[str]) -> dict[str, Any]:
    """Tables (this rank's shards) and dense parameters (by name) after the parity steps."""
    ref_state = {k: v.detach() for k, v in ref.state_dict().items()}
    n_tab, worst_tab, n_dense, worst_dense, bad = 0, 0.0, 0, 0.0, []
    for name, _, t, pick, table in matched_params(dmp.state_dict(), ref_state):
        exp = pick(ref_state)
        if table:
            n_tab += 1
            worst_tab = max(worst_tab, cell.max_err(exp, t))
        else:
            n_dense += name.startswith("dense.")
            worst_dense = max(worst_dense, cell.max_err(exp, t))
        if not cell.close(exp, t, atol, rtol):
            bad.append(name)
    if bad:
        mismatch.append(
            f"updated parameters differ from the single-process eager run for {len(bad)}: {bad[:5]}"
        )
    return {
        "table_shards_compared": n_tab,
        "max_table_err": worst_tab,
        "dense_params_compared": n_dense,
        "dense_params_total": len([k for k in ref_state if k.startswith("dense.")]),
        "max_param_err": worst_dense,
    }


def timed_steps(
    step: Callable[[], Any], cfg: dict[str, Any], device: str, sync: Callable[[], None]
) -> list[float]:
    """Warm-up, then timed steps that every rank starts together.

    Rank 0 decides go/stop (max_iters, or min_iters and the budget spent) and broadcasts it
    before every step: the broadcast is also the barrier that lines the starts up, so each
    rank's sample runs from a common start to its own end, and the slowest rank's sample is
    the step's time. All ranks take the same number of steps (none waits in a collective for
    a step its peer never takes)."""
    import torch
    import torch.distributed as dist

    flag = torch.zeros(1, device="cuda" if device == "cuda" else "cpu")
    for _ in range(int(cfg["warmup"])):
        step()
    sync()
    rank = dist.get_rank()

    def agree(go: bool) -> bool:  # rank 0's decision; the broadcast lines the starts up
        if rank == 0:
            flag.fill_(1.0 if go else 0.0)
        dist.broadcast(flag, 0)
        return float(flag.item()) != 0.0

    def sample() -> float:
        t0 = time.perf_counter()
        step()
        sync()
        return (time.perf_counter() - t0) * 1e3

    return timing.timed_loop(
        sample,
        min_iters=int(cfg["min_iters"]),
        max_iters=int(cfg["max_iters"]),
        budget_s=float(cfg["budget_s"]),
        agree=agree,
    )


def main(argv: list[str] | None = None) -> int:
    return serve(run_rank, "harness.run.sharded.rank", argv)


RankRun = Callable[[dict[str, Any], int, int, Progress], dict[str, Any]]


def serve(run: RankRun, module: str, argv: list[str] | None = None) -> int:
    """A rank's process: read the spec, ``run`` it, write ``rank<R>.json`` atomically (the
    record, or the failure with where it happened), leave the process group."""
    args = sys.argv[1:] if argv is None else argv
    if len(args) != 2:
        print(f"usage: torchrun ... -m {module} SPEC.json OUT_DIR", file=sys.stderr)
        return 2
    rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    out_dir = Path(args[1])
    cache = os.environ.get("TORCHINDUCTOR_CACHE_DIR")
    if cache:  # ranks compile side by side: each its own fresh directory
        os.environ["TORCHINDUCTOR_CACHE_DIR"] = os.path.join(cache, f"rank{rank}")
        os.environ["TRITON_CACHE_DIR"] = os.path.join(cache, f"rank{rank}", "triton")
    cell.exit_with_parent()
    progress = Progress(out_dir, rank)
    progress.set()
    spec = json.loads(Path(args[0]).read_text())
    ok = True
    try:
        rec = run(spec, rank, world, progress)
    except Exception as e:
        ok = False
        tb = traceback.format_exc().strip().splitlines()
        rec = {"rank": rank, "status": "failed", "pid": os.getpid(), "error": f"{type(e).__name__}: {e}"}
        rec["traceback"] = "\n".join(tb[-15:])
        rec["failed_in"] = {"phase": progress.phase, "step": progress.step}
    write_atomic(out_dir / f"rank{rank}.json", json.dumps(cell.finite(rec), allow_nan=False))
    if not ok:
        os._exit(1)  # at once: torchrun then stops the peers, which may be waiting on us
    import torch.distributed as dist

    if dist.is_initialized():
        dist.destroy_process_group()
    return 0


if __name__ == "__main__":
    sys.exit(main())
