"""One benchmark cell (model, scale, mode, phase), run in its own process.

Why a process per cell: compiled code, allocator caches, Dynamo counters and Inductor
config changes (the peer's fusion options) must not leak from one cell into the next, and
a crash or hang must cost one cell, not the run. The parent (harness.run.runner) starts
``python -m harness.run.cell SPEC.json OUT.json`` and reads OUT.json; an exception inside the
cell is written there as a failed cell, anything worse is caught by the parent.

Order inside a cell: build the model (seeded), keep an eager deep copy as the reference,
prepare the mode, time the first call (= compile time) on batch 0 while checking parity
with the reference (outputs; in train also gradients of every parameter), then warm up and
time steps over the batches, then measure one step's peak memory.
"""

from __future__ import annotations

import copy
import inspect
import itertools
import json
import math
import os
import sys
import threading
import time
import traceback
from collections.abc import Callable
from pathlib import Path
from typing import Any

from harness.measure import memory, timing
from harness.modes import builtin, mode_registry
from harness.spec import CellKey, load_provider
from harness.store import cell_record


def _param_name(name: str) -> str:
    # torch.compile wraps modules as OptimizedModule(_orig_mod=...): same parameter, longer name.
    return name.replace("_orig_mod.", "")


def max_err(a: Any, b: Any) -> float:

    return float((a.detach().double() - b.detach().double()).abs().max()) if a.numel() else 0.0


def close(a: Any, b: Any, atol: float, rtol: float) -> bool:
    import torch

    return a.shape == b.shape and bool(torch.allclose(a.detach(), b.detach(), atol=atol, rtol=rtol))


def compare_grads(ref: Any, mod: Any, original: dict[str, Any], atol: float, rtol: float) -> dict[str, Any]:
    """Compare ``.grad`` of every reference parameter with its counterpart in ``mod``.

    The counterpart is found first through ``original`` (name -> the Parameter object the
    model had before the mode was applied: torch.compile and an Optimus GraphModule keep
    using those objects, so gradients land on them), then by name inside ``mod`` (wrapper
    prefixes stripped). Parameters with no counterpart are counted, not guessed.
    """
    ref_params = {_param_name(n): p for n, p in ref.named_parameters()}
    mod_params = {_param_name(n): p for n, p in mod.named_parameters()}
    compared, worst, bad = 0, 0.0, []
    for name, rp in ref_params.items():
        mp = original.get(name)
        if mp is None or mp.grad is None:
            mp = mod_params.get(name, mp)
        if mp is None or rp.grad is None:
            continue
        if mp.grad is None:
            bad.append(f"{name} (no gradient)")
            continue
        compared += 1
        worst = max(worst, max_err(rp.grad, mp.grad))
        if not close(rp.grad, mp.grad, atol, rtol):
            bad.append(name)
    return {"grads_compared": compared, "grads_total": len(ref_params), "max_grad_err": worst, "bad": bad}


def build_model(provider: str, model: str, scale: str, device: str, seed: int) -> Any:
    """The provider's model. Without the builder's own Dynamo capture (for meta["dense_nodes"]):
    it would pre-pay Dynamo's first-use cost outside the timed first call, and takes seconds at
    large scales."""
    builder = load_provider(provider)
    kwargs: dict[str, Any] = {}
    if "count_nodes" in inspect.signature(builder).parameters:
        kwargs["count_nodes"] = False
    return builder(model, scale=scale, device=device, seed=seed, **kwargs)


def example_inputs(b: Any, batches: list[Any]) -> tuple[Any, ...]:
    """The dense arch's inputs for the first batch (what a mode is prepared with)."""
    import torch

    with torch.no_grad():
        return tuple(t.detach() for t in b.dense_inputs(batches[0]))


def forward_fn(b: Any, train: bool) -> Callable[[Any, Any], Any]:
    """``forward(module, batch)``: the logits; in training also the loss and its backward."""
    import torch

    def forward(m: Any, batch: Any) -> Any:
        if train:
            logits = m(*batch.inputs)
            b.loss(logits, batch.labels).backward()
            return logits
        with torch.no_grad():
            return m(*batch.inputs)

    return forward


def step_fn(
    module: Any,
    batches: list[Any],
    optimizer: Any,
    forward: Callable[[Any, Any], Any],
    before: Callable[[int], None] | None = None,
) -> Callable[[], Any]:
    """One training or inference step over the batches in turn: (zero_grad, forward+backward,
    optimizer step). The one step of a cell, a sharded rank and an A/B contender; ``before(n)``
    runs first in step ``n`` (a rank's progress and fault hooks)."""
    cycle = itertools.cycle(batches)
    count = itertools.count()

    def step() -> Any:
        n = next(count)
        if before is not None:
            before(n)
        batch = next(cycle)
        if optimizer is not None:
            optimizer.zero_grad(set_to_none=True)
        out = forward(module, batch)
        if optimizer is not None:
            optimizer.step()
        return out

    return step


def first_call(call: Callable[[], Any], sync: Callable[[], None]) -> tuple[Any, float]:
    """(output, seconds) of the first call, which compiles in a compiled mode."""
    t0 = time.perf_counter()
    out = call()
    sync()
    return out, time.perf_counter() - t0


def record_compile_time(rec: dict[str, Any], prepare_s: float, first_call_s: float, compiled: bool) -> None:
    """Compile time: for compiled modes the first call minus one steady-state step (Dynamo,
    AOT autograd and Inductor all run lazily there); for eager modes the optimize call."""
    median_s = rec["latency_ms"]["median"] / 1e3
    rec["compile_s"] = prepare_s + (max(0.0, first_call_s - median_s) if compiled else 0.0)


def record_graphs(rec: dict[str, Any], compiled: bool, graphs_before: int, graphs_first: int) -> None:
    """Graphs of the first call (> 1 only with graph breaks) and compiles after it."""
    if compiled:
        counts = dynamo_counts()
        rec["graphs"] = graphs_first - graphs_before
        rec["recompiles"] = counts["graphs"] - graphs_first
        rec["graph_breaks"] = counts["graph_breaks"]
    else:
        rec["recompiles"] = 0


def step_static_tensors(module: Any, optimizer: Any) -> list[Any]:
    """The tensors alive through a whole step: parameters, buffers and optimizer state.

    Gradients are not among them: the training step begins with
    ``zero_grad(set_to_none=True)``, and backward allocates them again inside the step, where
    the allocator peak already counts them. This drops the previous step's gradients now, so
    the profiled step starts without them (their free would be invisible to the profiler);
    counting ``p.grad`` here as well counted every gradient twice (the first committed CPU training figures).
    A re-laid-out model (``optimus.params.relayout``) keeps the gradient buffers of its small
    fused groups between steps; they are static here, or its memory would read low.
    """
    import torch

    if optimizer is not None:
        optimizer.zero_grad(set_to_none=True)
    static: list[Any] = list(module.parameters()) + list(module.buffers())
    static += [p.grad for p in module.parameters() if p.grad is not None]  # a user-kept grad
    static += _retained_gradient_buffers(module)
    if optimizer is not None:
        static += [v for st in optimizer.state.values() for v in st.values() if isinstance(v, torch.Tensor)]
    return static


def _retained_gradient_buffers(module: Any) -> list[Any]:
    """Gradient buffers Optimus keeps between steps (none when optimus is not installed)."""
    try:
        from optimus.params.relayout import retained_gradient_buffers
    except ImportError:
        return []
    return retained_gradient_buffers(module)


def dynamo_counts() -> dict[str, int]:
    from torch._dynamo.utils import counters

    graphs = int(counters["stats"].get("unique_graphs", 0))
    return {"graphs": graphs, "graph_breaks": int(sum(counters["graph_break"].values()))}


def limit_references() -> dict[str, str]:
    from harness.measure.limit import REFERENCES

    return REFERENCES


class _StopAtDense(Exception):
    pass


def input_requires_grad(module: Any, batch: Any) -> list[bool] | None:
    """Which inputs of ``module.dense`` require grad in a training step (the pooled embeddings
    do; ``dense_inputs`` hands them over detached): one forward of the model as far as the dense
    arch, with a probe in its place. None when the model does not reach its dense arch."""
    import torch
    from torch import nn

    flags: list[bool] = []

    class Probe(nn.Module):
        def forward(self, *args: Any) -> Any:
            flags.extend(bool(getattr(a, "requires_grad", False)) for a in args)
            raise _StopAtDense

    saved = module.dense
    module.dense = Probe()
    try:
        with torch.enable_grad():
            module(*batch.inputs)
    except _StopAtDense:
        return flags
    except Exception:
        return None
    finally:
        module.dense = saved
    return None


def measure_limit(
    dense: Any,
    example: tuple[Any, ...],
    median_ms: float,
    train: bool,
    compiled: bool,
    device: str,
    input_grads: list[bool] | None = None,
) -> dict[str, Any]:
    """The cell's ``limit`` (``harness.measure.limit``), measured after everything else the cell measures
    (its compiles must not count as this cell's recompiles); a failure is recorded, not raised."""
    from harness.measure import limit

    try:
        return limit.measure_cell(
            dense, example, median_ms, train=train, compiled=compiled, device=device, input_grads=input_grads
        )
    except Exception as e:
        return {"error": f"{type(e).__name__}: {e}", "ideal_ms": None}


def record_floor(
    cell: dict[str, Any],
    dense: Any,
    example: tuple[Any, ...],
    train: bool,
    input_grads: list[bool] | None,
    peaks: dict[str, Any],
) -> None:
    """The cell's roofline floor (``harness.measure.roofline``), counted on the dense arch as
    built: every mode computes the same math, so one family and phase has one floor. Counted
    after timing (it runs the arch once more); a failure is recorded, not raised."""
    from harness.measure import roofline

    try:
        roofline.fill_cell(cell, roofline.count(dense, example, train, input_grads), peaks)
    except Exception as e:
        cell["floor"] = {"error": f"{type(e).__name__}: {e}"}


def _build(cfg: dict[str, Any], key: CellKey, cell: dict[str, Any]) -> tuple[Any, list[Any]]:
    """The provider's model and its batches, seeded; the build time and the model's meta go
    into ``cell``."""
    t_build = time.perf_counter()
    b = build_model(cfg["provider"], key.model, key.scale, cfg.get("device", "cpu"), int(cfg["seed"]))
    cell["build_s"] = time.perf_counter() - t_build
    meta = dict(getattr(b, "meta", {}) or {})
    cell["meta"] = {
        k: v for k, v in meta.items() if isinstance(v, int | float | str) and not isinstance(v, bool)
    }
    batches = list(b.batches)
    if not batches:
        raise RuntimeError("model provided no batches")
    return b, batches


def _parity(
    cell: dict[str, Any], ref: Any, module: Any, out: Any, original: dict[str, Any], ref_out: Any, train: bool
) -> list[str]:
    """Compare the first call with the eager reference (outputs; in training every parameter's
    gradient); fill ``cell``'s parity fields and return the mismatches found."""
    cfg_tol = cell["parity"]
    atol, rtol = cfg_tol["atol"], cfg_tol["rtol"]
    mismatch: list[str] = []
    cell["max_abs_err"] = max_err(ref_out, out) if ref_out.shape == out.shape else None
    if not close(ref_out, out, atol, rtol):
        mismatch.append(
            f"outputs differ from eager: shape {tuple(out.shape)} vs {tuple(ref_out.shape)}, "
            f"max abs err {cell['max_abs_err']}"
        )
    if train:
        g = compare_grads(ref, module, original, atol, rtol)
        cfg_tol.update({k: v for k, v in g.items() if k != "bad"})
        if g["bad"]:
            mismatch.append(f"gradients differ from eager for {len(g['bad'])} parameters: {g['bad'][:5]}")
        if g["grads_compared"] == 0:
            mismatch.append("no parameter gradient could be compared with eager")
    return mismatch


def begin(spec: dict[str, Any]) -> tuple[CellKey, dict[str, Any], dict[str, Any], str]:
    """What every cell process does first: (key, config, empty record, device), with the compile
    caches off and the run's thread count set, so a cell's first call is a cold compile."""
    key = CellKey(spec["model"], spec["scale"], spec["mode"], spec["phase"])
    cfg = spec["config"]
    builtin.disable_compile_caches()
    import torch

    if cfg.get("threads"):
        torch.set_num_threads(int(cfg["threads"]))
    return key, cfg, cell_record.empty(key), cfg.get("device", "cpu")


def run_cell(spec: dict[str, Any]) -> dict[str, Any]:
    key, cfg, cell, device = begin(spec)
    import torch

    b, batches = _build(cfg, key, cell)
    module = b.module
    mode = mode_registry.get(key.mode)
    ref = copy.deepcopy(module) if key.mode != mode_registry.REFERENCE else None
    train = key.phase == "train"
    module.train(train)
    if ref is not None:
        ref.train(train)

    example = example_inputs(b, batches)
    original = dict(module.named_parameters())
    dense = module.dense  # as built: what the limit's groups are found in (--limit)
    with builtin.memory_margin(cfg.get("memory_margin")), builtin.optimus_guard(cfg.get("optimus_guard")):
        prepared = mode_registry.prepare(key.mode, dense, example, beside=module)
    module.dense = prepared.module
    cell.update({k: v for k, v in prepared.info.items() if v is not None})

    optimizer = torch.optim.SGD(module.parameters(), lr=0.01) if train else None
    forward = forward_fn(b, train)

    graphs_before = dynamo_counts()["graphs"]  # the model builder may have run Dynamo itself
    # First call: compile time (for eager+optimus: the optimize call) and parity.
    sync: Callable[[], None] = torch.cuda.synchronize if device == "cuda" else (lambda: None)
    out, first_call_s = first_call(lambda: forward(module, batches[0]), sync)
    cell["first_call_s"] = first_call_s
    graphs_first = dynamo_counts()["graphs"]
    if prepared.reports:  # what optimus did to this cell's module (all its graphs)
        cell.update(builtin.merge_reports(prepared.reports))
    cell["prepare_s"] = prepared.prepare_s

    cell["parity"] = {"reference": mode_registry.REFERENCE, "atol": cfg["atol"], "rtol": cfg["rtol"]}
    mismatch: list[str] = []
    if ref is not None:
        mismatch = _parity(cell, ref, module, out, original, forward(ref, batches[0]), train)
        del ref
    else:
        cell["max_abs_err"] = 0.0
    if optimizer is not None:
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)

    step = step_fn(module, batches, optimizer, forward)
    cell["loadavg_1m"] = os.getloadavg()[0]  # other work on the machine: read noisy figures with it
    samples = timing.time_iterations(
        step,
        warmup=int(cfg["warmup"]),
        min_iters=int(cfg["min_iters"]),
        max_iters=int(cfg["max_iters"]),
        budget_s=float(cfg["budget_s"]),
        device=device,
    )
    cell["latency_ms"] = timing.summarize(samples)
    record_compile_time(cell, prepared.prepare_s, first_call_s, mode.compiled)
    cell.update(memory.step_peak_memory(step, device, step_static_tensors(module, optimizer)))
    record_graphs(cell, mode.compiled, graphs_before, graphs_first)
    if spec.get("peaks"):
        grads = input_requires_grad(module, batches[0]) if train else None
        record_floor(cell, dense, example, train, grads, spec["peaks"])
    if cfg.get("limit") and key.mode in limit_references():
        grads = input_requires_grad(module, batches[0]) if train else None
        cell["limit"] = measure_limit(
            dense, example, cell["latency_ms"]["median"], train, mode.compiled, device, grads
        )
    cell["status"] = "mismatch" if mismatch else "ok"
    if mismatch:
        cell["error"] = "; ".join(mismatch)
    return cell


def finite(obj: Any) -> Any:
    """Replace NaN/inf (e.g. an error of a diverged output) by None so the JSON stays valid."""
    if isinstance(obj, float):
        return obj if math.isfinite(obj) else None
    if isinstance(obj, dict):
        return {k: finite(v) for k, v in obj.items()}
    if isinstance(obj, list | tuple):
        return [finite(v) for v in obj]
    return obj


def exit_with_parent(poll_s: float = 1.0) -> None:
    """Exit if the harness that started this cell dies (kill -9 of a run must not leave
    orphaned cells running, hung ones least of all)."""
    parent = os.getppid()

    def watch() -> None:
        while True:
            time.sleep(poll_s)
            if os.getppid() != parent:
                os._exit(3)

    threading.Thread(target=watch, name="exit-with-parent", daemon=True).start()


def serve(argv: list[str] | None, run: Callable[[dict[str, Any]], dict[str, Any]]) -> int:
    """A cell process: read SPEC.json, ``run`` it, write OUT.json (a failure as a failed cell).
    The timing cell (``run_cell``) and the training-quality cell (``harness.run.quality``) share it."""
    args = sys.argv[1:] if argv is None else argv
    exit_with_parent()
    if len(args) != 2:
        print(f"usage: python -m {run.__module__} SPEC.json OUT.json", file=sys.stderr)
        return 2
    spec = json.loads(Path(args[0]).read_text())
    key = CellKey(spec["model"], spec["scale"], spec["mode"], spec["phase"])
    try:
        cell = run(spec)
    except Exception as e:  # recorded as a failed cell; the parent goes on with the next one
        cell = cell_record.empty(key)
        tb = traceback.format_exc().strip().splitlines()
        cell["error"] = f"{type(e).__name__}: {e}"
        cell["traceback"] = "\n".join(tb[-15:])
    Path(args[1]).write_text(json.dumps(finite(cell), allow_nan=False))
    return 0


def main(argv: list[str] | None = None) -> int:
    return serve(argv, run_cell)


if __name__ == "__main__":
    sys.exit(main())
