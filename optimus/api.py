"""``optimus.optimize``: capture, rewrite, report."""

from __future__ import annotations

import functools
import logging
import time
from collections.abc import Sequence
from typing import Any

import torch
from torch import fx, nn

from optimus.capture import caller_state, checkpoint_rng, dynamo_watch, numpy_constants, sparse_boundary
from optimus.capture import export as capture
from optimus.capture.call_signature import forward_names
from optimus.capture.codegen_flat import use_flat_codegen
from optimus.capture.specialized import GUARD, specialize
from optimus.config import OptimusConfig
from optimus.cost.analytic import CostModel
from optimus.engine import driver
from optimus.engine.builder import CONSTANT_PREFIX
from optimus.engine.context import RewriteContext
from optimus.engine.verify import Verifier
from optimus.guard import Guard
from optimus.memory.chunked import chunk_lightest
from optimus.memory.live import ceiling_budget, static_bytes
from optimus.memory.step import StepNotTraced, step_peak
from optimus.params.relayout import OWNED_FLAG
from optimus.report import OptimusReport, StopReason
from optimus.rules import resolve
from optimus.semantics.graph_copy import copy_graph, copy_graph_module
from optimus.semantics.meta import record, value_meta
from optimus.semantics.normalize import lower_modules

log = logging.getLogger("optimus")


def optimize_graph_module(
    gm: fx.GraphModule,
    config: OptimusConfig,
    example_inputs: Sequence[Any] | None = None,
    report: OptimusReport | None = None,
    inference: bool = False,
) -> OptimusReport:
    """Optimize ``gm`` in place (the graph is changed); returns the report. Never raises for an
    op it does not know: such nodes are left alone. An internal failure leaves the graph as it was
    and says why in the report.

    ``inference``: the graph was captured from a module in eval mode; priced for Inductor, its
    fused chains then run a few members at a time (``OptimusConfig.inference_chunk_bytes``,
    :mod:`optimus.memory.chunked`)

    ``config.guard`` other than ``"off"``: the result is timed against the graph as given on
    ``example_inputs`` and kept only where it measures faster (:mod:`optimus.guard`); the runs
    leave buffers, the RNG and each parameter's ``.grad`` as they were."""
    report = report or OptimusReport()
    if lower_modules(gm):
        gm.recompile()
    verifier = None
    if config.verify:
        if example_inputs is None:
            report.notes.append("verify requested but no example inputs: not verified")
        else:
            reference = copy_graph_module(gm)
            verifier = Verifier(reference, example_inputs, config.seed, config.rtol, config.atol)
    backup = copy_graph(gm.graph)
    guard = _guard_for(gm, config, example_inputs, report, inference)
    rules = resolve(config.rules)

    def rewrite(cfg: OptimusConfig, into: OptimusReport) -> None:
        driver.run(gm, cfg, rules if cfg is config else resolve(cfg.rules), into, verifier)
        if _chunks(cfg, inference):
            assert cfg.inference_chunk_bytes is not None
            _chunk_stacked(gm, cfg, cfg.inference_chunk_bytes, into, verifier)

    try:
        chosen = _within_ceiling(gm, config, inference, report)
        if chosen is None:  # left as captured
            if guard is not None:
                report.guard = "not run: left as captured under the memory ceiling"
            return report
        rewrite(chosen, report)
        if guard is not None:
            guard.judge(report, rewrite, {r.name: r.kind for r in rules})
    except Exception as exc:  # never fail the user's model because of an optimizer bug
        log.warning(
            "optimus: optimization failed (%s: %s); graph returned unchanged", type(exc).__name__, exc
        )
        if guard is not None:
            guard.snapshot.restore()  # re-laid-out parameters back in their own storage
            report.guard = f"failed ({type(exc).__name__}): the plain capture is returned"
        gm.graph = backup  # the setter recompiles
        report.stop_reason = StopReason.unchanged()
        report.nodes_after = report.nodes_before = len(gm.graph.nodes)
        report.notes.append(f"unchanged: {type(exc).__name__}: {exc}")
    drop_unused_constants(gm)
    return report


def _guard_for(
    gm: fx.GraphModule,
    config: OptimusConfig,
    example_inputs: Sequence[Any] | None,
    report: OptimusReport,
    inference: bool,
) -> Guard | None:
    """The measured guard for this run (see :mod:`optimus.guard`), None when it is off or cannot
    run (no example inputs to run the graph with: the report says so)."""
    if config.guard == "off":
        return None
    if example_inputs is None:
        report.guard = "not run: no example inputs (torch.compile backend or pre-grad pass)"
        return None
    return Guard(gm, config, example_inputs, inference)


def _chunks(config: OptimusConfig, inference: bool) -> bool:
    """Does this run chunk its fused chains after the rules (``optimus.memory.chunked``)?"""
    return inference and config.inference_chunk_bytes is not None and _inductor(config)


def _inductor(config: OptimusConfig) -> bool:
    """Does the cost model price for Inductor (the graph goes to torch.compile)?"""
    return getattr(config.cost_model, "inductor", False) is True


def _within_ceiling(
    gm: fx.GraphModule, config: OptimusConfig, inference: bool, report: OptimusReport
) -> OptimusConfig | None:
    """The config the real run uses under ``config.memory_ceiling``, or None: no rewrite at all.

    WHY a trial of the whole run and not only a per-rewrite gate: the gate judges each rewrite
    alone, with an upper bound of what the round's rewrites added, and so refuses fusions whose
    stacked buffers later rewrites free again (towers and mmoe medium, where the optimized
    graph's peak is not above the captured one's). The whole run is tried first on a copy of the
    graph, with ``vertical.ProbeLayout`` in place of a layout that changes the module, and its
    final estimated peak is judged: within the ceiling, the run is made as it would be without
    one. Above it, the run with every rewrite gated (the ceiling as a budget) is tried the same
    way; above it still, the graph is left as captured (a tiny model, where one stacked group
    outweighs the whole unfused graph's peak).

    The peak judged: in inference, the forward's (parameters and buffers plus live bytes,
    ``optimus.memory.live``, in the order its runtime would run it: ``scheduled_peak``); in
    training, the whole step's, forward and backward (``optimus.memory.step``), whose peak is in
    the backward the forward estimate does not see. Where the step cannot be traced, training
    runs as without a ceiling and the report says why. A training graph has no gated trial: the
    gate judges each rewrite by the forward's live bytes, blind to the backward. Measured on
    towers medium training: gated, the step estimate read +0.7% and the step measured +5.8% over
    compile at compile's speed (47.4 against 46.7 ms), where left as captured it holds +0.0% at
    that speed. The trials cost about one more optimize pass in inference (under 2% of a
    compile), and in training two recorded steps (the captured graph's and the trial's: about
    6 s at dlrm large, on a compile of 39 s)."""
    ceiling = config.memory_ceiling
    if ceiling is None:
        return config
    ungated = config.with_(memory_ceiling=None)
    as_captured = RewriteContext(gm, config.cost_model, config.layout)
    static = config.memory_outside_bytes + (static_bytes(gm) if inference else 0)
    try:
        captured = as_captured.scheduled_peak if inference else _step_peak(gm, config)
        budget = ceiling_budget(static, captured, ceiling)
        if _trial_peak(gm, ungated, inference) <= budget:
            return ungated
        if inference and _trial_peak(gm, config, inference) <= budget:
            report.notes.append(
                f"memory_ceiling: every rewrite gated (the whole run lifted the estimated peak past {ceiling:.0%})"
            )
            return config
    except StepNotTraced as exc:
        report.notes.append(f"memory_ceiling: training step not judged (its trace failed: {exc})")
        return ungated
    report.notes.append(f"memory_ceiling: unchanged (every run lifted the estimated peak past {ceiling:.0%})")
    report.stop_reason = StopReason.unchanged()
    report.nodes_after = report.nodes_before = len(gm.graph.nodes)
    report.live_peak_before = report.live_peak_after = as_captured.live.peak
    return None


def _trial_peak(gm: fx.GraphModule, config: OptimusConfig, inference: bool) -> float:
    """The estimated peak (``_forward_peak`` in inference, ``_step_peak`` in training) of ``gm``
    optimized under ``config``, on a copy."""
    trial = _trial(gm, config, inference)
    return _forward_peak(trial, config) if inference else _step_peak(trial, config)


def _forward_peak(gm: fx.GraphModule, config: OptimusConfig) -> float:
    """The forward's estimated live peak, in the order its runtime would run it."""
    return RewriteContext(gm, config.cost_model, config.layout).scheduled_peak


def _step_peak(gm: fx.GraphModule, config: OptimusConfig) -> float:
    """One training step's estimated peak, parameters included (``optimus.memory.step``)."""
    return step_peak(gm, _inductor(config))


def _trial(gm: fx.GraphModule, config: OptimusConfig, inference: bool) -> fx.GraphModule:
    """``gm`` optimized under ``config`` on a copy, for its peak to be estimated (``gm`` and its
    parameters are left as they are; the copy is never run)."""
    from optimus.engine.param_layout import RuntimeStack
    from optimus.engine.vertical import ProbeLayout

    trial = copy_graph_module(gm)
    setattr(trial, OWNED_FLAG, getattr(gm, OWNED_FLAG, False))  # priced as the real run's layout would be
    layout = config.layout if isinstance(config.layout, RuntimeStack) else ProbeLayout(config.layout)
    probe = config.with_(layout=layout)  # type: ignore[arg-type]
    driver.run(trial, probe, resolve(config.rules), OptimusReport())
    if _chunks(config, inference):
        assert config.inference_chunk_bytes is not None
        chunk_lightest(trial, config.inference_chunk_bytes)
    return trial


def _chunk_stacked(
    gm: fx.GraphModule, config: OptimusConfig, chunk: int, report: OptimusReport, verifier: Verifier | None
) -> None:
    """Run the fused chains in chunks (optimus.memory.chunked), after the rules. With ``verify``
    it is checked like any rewrite and undone if the outputs differ; if it fails, it is undone
    and the rules' graph is kept. Its time counts in ``report.seconds``; the estimated peak
    (``report.live_peak_after``) is taken again when it changed the graph."""
    start = time.perf_counter()
    before = copy_graph(gm.graph)
    try:
        report.chunked_groups, notes = chunk_lightest(gm, chunk)
        report.notes.extend(notes)
        failed = verifier.check(gm) if verifier is not None and report.chunked_groups else None
    except Exception as exc:  # the rules' graph stands; the pass is an extra
        failed = f"{type(exc).__name__}: {exc}"
    if failed is not None:
        gm.graph = before  # the setter recompiles
        report.chunked_groups = 0
        report.notes.append(f"chunk_stacked: undone: {failed}")
    elif report.chunked_groups:
        report.live_peak_after = RewriteContext(gm, config.cost_model, config.layout).live.peak
    report.nodes_after = len(gm.graph.nodes)
    report.seconds += time.perf_counter() - start


def drop_unused_constants(gm: fx.GraphModule) -> None:
    """Delete the ``Builder.constant`` buffers no node reads any more. Why: a rewrite that was
    rolled back (declined by the verifier, an exception, an unplaceable result) leaves the buffer
    it registered; it is outside ``state_dict`` but still dead state that ``.to()`` converts and
    ``deepcopy`` copies."""
    read = {str(n.target) for n in gm.graph.nodes if n.op == "get_attr"}
    for name in [b for b in gm._buffers if b.startswith(CONSTANT_PREFIX) and b not in read]:
        delattr(gm, name)


def _runs_graph(cfg: OptimusConfig) -> bool:
    """Whether optimizing runs the graph on the example inputs (verify, the measured guard)."""
    return cfg.verify or cfg.guard != "off"


def make_config(
    rules: Any, cost_model: CostModel | None, verify: bool, config: OptimusConfig | None
) -> OptimusConfig:
    base = config or OptimusConfig()
    if not isinstance(base, OptimusConfig):
        raise ValueError(f"config must be an OptimusConfig, got {type(base).__name__}")
    changes: dict[str, Any] = {}
    if rules is not None:
        if isinstance(rules, str) or not isinstance(rules, Sequence):
            raise ValueError(f"rules must be a list of rule names or None, got {rules!r}")
        changes["rules"] = tuple(rules)
    if cost_model is not None:
        changes["cost_model"] = cost_model
    if verify:
        changes["verify"] = True
    return base.with_(**changes) if changes else base


def optimize(
    module: nn.Module,
    example_inputs: Sequence[Any],
    rules: Sequence[str] | None = None,
    cost_model: CostModel | None = None,
    verify: bool = False,
    config: OptimusConfig | None = None,
) -> fx.GraphModule:
    """Capture ``module`` with Dynamo, apply the rules to a fixed point, return a GraphModule.

    The result computes the same outputs as ``module`` and its gradients land on ``module``'s own
    parameters. ``result.optimus_report`` says what fired. See :class:`OptimusConfig` for options
    (``rules``/``cost_model``/``verify`` here override the config's).

    ``optimize`` leaves the caller's world as it found it (the example inputs, every buffer and
    parameter, submodule attributes, the RNG state; see :mod:`optimus.capture.caller_state`). On the
    export path the result checks each call against the inputs and train/eval mode it was
    captured for, and re-optimizes for a call that differs (see :mod:`optimus.capture.specialized`).
    """
    cfg = make_config(rules, cost_model, verify, config)
    start = time.perf_counter()
    if isinstance(module, fx.GraphModule):
        inputs = tuple(example_inputs) if isinstance(example_inputs, (list, tuple)) else (example_inputs,)
        with caller_state.preserved(module) as state:
            gm = copy_graph_module(module)
            checkpoint_rng.keep_rng(gm)
            if any(value_meta(n) is None for n in gm.graph.nodes if n.op == "placeholder"):
                try:
                    record(gm, inputs)
                except Exception as exc:
                    raise ValueError(
                        f"example_inputs do not match the GraphModule: {type(exc).__name__}: {exc}"
                    ) from exc
            setattr(gm, OWNED_FLAG, not cfg.verify)  # a re-laying-out layout may re-point parameters
            if cfg.verify:
                state.protect_parameters()  # verify runs the graph for real
            report = optimize_graph_module(
                gm,
                cfg,
                caller_state.clone_inputs(inputs) if _runs_graph(cfg) else None,
                inference=not module.training,
            )
        report.capture = "graph"
        report.capture_reason = "the module is already a GraphModule: its graph was optimized as given"
        report.graphs = 1
    else:
        inputs = capture.check_inputs(module, example_inputs)
        boundary = sparse_boundary.find(module, inputs)
        found = _capture_around_lookup(module, inputs, cfg, boundary) if boundary is not None else None
        if isinstance(found, tuple):
            gm, report = found
        else:
            gm, report = capture_and_optimize(module, inputs, cfg)
            if found is not None:
                report.notes.append(f"sparse boundary not used: {found}")
            if report.capture == "export":
                specialize(gm, module, inputs, functools.partial(_recapture, cfg=cfg))
                report.specializations = getattr(gm, GUARD).reasons
    report.capture_seconds = time.perf_counter() - start - report.seconds
    gm.optimus_report = report  # type: ignore[assignment]
    return gm


def _recapture(module: nn.Module, args: tuple[Any, ...], cfg: OptimusConfig) -> Any:
    """Another graph of ``module`` for a call the first one was not specialized to; the module
    itself (run eagerly) when it no longer exports. Why not the Dynamo path there: it compiles by
    running ``forward`` once, so a side effect (a hook added since, ``self.log.append``) would
    happen twice in the call that triggered the re-capture."""
    start = time.perf_counter()
    cfg, unguarded = _recapture_config(cfg)
    with torch.inference_mode(False), torch.enable_grad():  # as optimize() itself would run
        gm, report = capture_and_optimize(module, args, cfg, fallback=False)
    if unguarded and gm is not None:
        report.guard = unguarded
    if gm is None:
        log.info("optimus: the re-capture did not export; this call runs the original module eagerly")
        return module
    report.capture_seconds = time.perf_counter() - start - report.seconds
    gm.optimus_report = report  # type: ignore[assignment]
    return gm


def _recapture_config(cfg: OptimusConfig) -> tuple[OptimusConfig, str]:
    """The config for a re-optimization at a call, and why its guard is off ('' when it is not).
    Why off under a process group of two or more ranks: the guard takes the first rank's figures
    through a collective (optimus.guard), and a call that re-optimizes on one rank (another
    batch size) need not on its peers, which would leave the collective waiting."""
    dist = torch.distributed
    if cfg.guard == "off" or not (
        dist.is_available() and dist.is_initialized() and dist.get_world_size() > 1
    ):
        return cfg, ""
    return cfg.with_(guard="off"), "not run: re-optimized at one rank's call under a process group"


def _lookup_context(
    dense: sparse_boundary.DenseOf, stub: sparse_boundary.PooledStub, args: tuple[Any, ...]
) -> sparse_boundary.LookupContext | str | None:
    """The contexts the model wraps its lookup in, read from one export with the lookup marked
    (see :func:`optimus.capture.sparse_boundary.lookup_context`); a string says why they cannot be
    reproduced, None that the model does not export."""
    boundary = dense.__dict__["boundary"]
    stub.probe = True
    try:
        with caller_state.preserved(dense), boundary.stubbed(stub):
            probe = capture.export(dense, caller_state.clone_inputs(args))
    except Exception as exc:
        log.info("optimus: the lookup probe did not export (%s: %s)", type(exc).__name__, exc)
        return None
    finally:
        stub.probe = False
    return sparse_boundary.lookup_context(probe, traced_grad=torch.is_grad_enabled())


def _capture_around_lookup(
    module: nn.Module, inputs: tuple[Any, ...], cfg: OptimusConfig, boundary: sparse_boundary.Boundary
) -> tuple[fx.GraphModule, OptimusReport] | str | None:
    """Whole-graph capture of a model fed a KeyedJaggedTensor, its EmbeddingBagCollection run
    eagerly outside the graph under the contexts the model wraps it in (see
    :mod:`optimus.capture.sparse_boundary`); None when that capture does not apply or fails, or
    the reason when the lookup's contexts cannot be reproduced (the caller then takes the
    ordinary path)."""
    with caller_state.preserved(module):
        kjt = caller_state.clone_inputs(inputs)[boundary.index]
        example = sparse_boundary.pooled_example(boundary, kjt)
    if example is None:
        return None
    pooled, stub = example
    dense = sparse_boundary.DenseOf(module, boundary, stub)
    dense_inputs = (*inputs[: boundary.index], pooled, *inputs[boundary.index + 1 :])
    context = _lookup_context(dense, stub, dense_inputs)
    if not isinstance(context, sparse_boundary.LookupContext):
        return context
    if context.steps:  # the example as the lookup really makes it: requires_grad, dtype
        with caller_state.preserved(module):
            kjt = caller_state.clone_inputs(inputs)[boundary.index]
            example = sparse_boundary.pooled_example(boundary, kjt, context)
        if example is None:
            return None
        pooled = example[0]
        dense_inputs = (*inputs[: boundary.index], pooled, *inputs[boundary.index + 1 :])
    with boundary.stubbed(stub):
        inner, report = capture_and_optimize(dense, dense_inputs, cfg, fallback=False)
    if inner is None:
        return None

    def recapture(source: nn.Module, args: tuple[Any, ...]) -> Any:
        start = time.perf_counter()
        with torch.inference_mode(False), torch.enable_grad():
            again_context = _lookup_context(dense, stub, args)
        if again_context != context:
            # the lookup's contexts differ for this call (a block that depends on the train/eval
            # mode or an input): the collection already ran under the first ones
            raise RuntimeError(
                "optimus: the contexts around the EmbeddingBagCollection lookup differ for this call "
                f"({again_context}) from those it was captured with ({context}); call "
                "optimus.optimize again for this mode"
            )
        again_cfg, unguarded = _recapture_config(cfg)
        with boundary.stubbed(stub), torch.inference_mode(False), torch.enable_grad():
            again, again_report = capture_and_optimize(source, args, again_cfg, fallback=False)
        if unguarded:
            again_report.guard = unguarded
        if again is None:  # export failed for this call: the model itself, eagerly
            return source
        again_report.capture_seconds = time.perf_counter() - start - again_report.seconds
        again.optimus_report = again_report
        return again

    specialize(inner, dense, dense_inputs, recapture)
    report.specializations = getattr(inner, GUARD).reasons
    report.capture_reason = (
        f"torch._dynamo.export captured forward as one graph, with the EmbeddingBagCollection "
        f"{boundary.path!r} run eagerly outside it: the graph's input is its pooled output, so "
        "batches with other numbers of ids reuse the graph"
    )
    names = list(forward_names(module)) or [f"arg{i}" for i in range(len(inputs))]
    if len(names) != len(inputs):
        names = [f"arg{i}" for i in range(len(inputs))]
    outer = sparse_boundary.outer_graph_module(boundary, inner, names, context)
    setattr(outer, OWNED_FLAG, getattr(inner, OWNED_FLAG, False))
    return outer, report


def capture_and_optimize(
    module: nn.Module, inputs: tuple[Any, ...], cfg: OptimusConfig, fallback: bool = True
) -> tuple[Any, OptimusReport]:
    """One graph of ``module`` for ``inputs`` (whole-graph export, else Dynamo subgraphs; with
    ``fallback`` false, (None, report) instead of the subgraphs), optimized; the module's state,
    the inputs and the RNG are as they were afterwards."""
    with caller_state.preserved(module) as state:
        clones = caller_state.clone_inputs(inputs)
        try:
            gm = capture.export(module, clones)
        except Exception as exc:
            if not fallback:
                log.info("optimus: whole-graph export failed (%s: %s)", type(exc).__name__, exc)
                return None, OptimusReport()
            log.info(
                "optimus: whole-graph export failed (%s: %s); optimizing Dynamo subgraphs",
                type(exc).__name__,
                str(exc).splitlines()[0] if str(exc) else "",
            )
            return _optimize_subgraphs(module, inputs, cfg, exc, state)
        checkpoint_rng.keep_rng(gm)  # the graph runs eagerly: checkpointing as eager does it
        use_flat_codegen(gm)  # skip pytree (un)flattening per call where the specs are flat
        flat_inputs = list(torch.utils._pytree.tree_flatten(clones)[0])
        setattr(gm, OWNED_FLAG, not cfg.verify)  # a re-laying-out layout may re-point parameters
        if cfg.verify:
            state.protect_parameters()  # verify runs the graph for real
        report = optimize_graph_module(
            gm, cfg, flat_inputs if _runs_graph(cfg) else None, inference=not module.training
        )
    numpy_constants.read_at_each_call(gm)  # after the passes, which take them as constants
    report.capture = "export"
    report.capture_reason = "torch._dynamo.export captured forward as one graph"
    held = [h for group in getattr(gm, numpy_constants.GROUPS, {}).values() for h in group]
    if held:
        report.capture_reason += (
            f", the NumPy arrays {', '.join(h.path for h in held)} read at each call (forward only "
            "copies them into tensors; another dtype or shape re-captures)"
        )
    if cfg.verify and len(flat_inputs) != len([n for n in gm.graph.nodes if n.op == "placeholder"]):
        report.notes.append("verify inputs did not line up with the exported graph's inputs")
    report.graphs = 1
    return gm, report


def _optimize_subgraphs(
    module: nn.Module,
    inputs: tuple[Any, ...],
    cfg: OptimusConfig,
    reason: Exception,
    state: caller_state.CallerState,
) -> tuple[fx.GraphModule, OptimusReport]:
    total = OptimusReport(capture="dynamo-subgraphs", stop_reason=StopReason.saturated(), graphs=0)
    side_effects = isinstance(reason, capture.SideEffectsInForward)
    why = str(reason) if side_effects else f"{type(reason).__name__}: {_first_line(reason)}"
    total.capture_reason = (
        f"whole-graph export failed ({why}); torch.compile(module, backend=<optimus, eager>) "
        "optimizes each Dynamo graph and runs the rest as Python, every call"
    )
    total.notes.append(f"whole-graph export failed ({type(reason).__name__}); optimized each Dynamo graph")

    compiled_before_return = [True]

    def backend(sub: fx.GraphModule, example: list[Any]) -> Any:
        checkpoint_rng.keep_rng(sub)  # run eagerly below: checkpointing as eager does it
        with caller_state.preserved(None):  # verify seeds the RNG
            one = optimize_graph_module(sub, cfg.with_(guard="off"), example if cfg.verify else None)
        if cfg.guard != "off":
            one.guard = "not run: Dynamo subgraphs (graph breaks): no whole step to time"
        one.graphs = 1
        total.merge(one)
        if not compiled_before_return[0]:
            total.recompiles += 1
        return sub.forward

    compiled = torch.compile(module, backend=backend, dynamic=False)
    if side_effects:
        total.notes.append(
            "forward has Python side effects: they run at every call (Dynamo replays them); compiling "
            "ran them once inside optimize(), on copies of the inputs (module attributes restored)"
        )
    state.protect_parameters()  # compiling runs the model for real
    try:
        compiled(*caller_state.clone_inputs(inputs))  # compile now (grad mode on: the common graph)
    except Exception as exc:  # Dynamo cannot run this model at all: hand back the model itself
        _check_runs_eagerly(module, inputs)
        log.warning(
            "optimus: Dynamo could not capture %s (%s: %s); returned unchanged",
            type(module).__name__,
            type(exc).__name__,
            exc,
        )
        unchanged = OptimusReport(capture="none", stop_reason=StopReason.unchanged(), graphs=0)
        unchanged.capture_reason = f"Dynamo could not capture the model ({type(exc).__name__}): it runs as is"
        unchanged.notes.append(f"unchanged: Dynamo could not capture the model ({type(exc).__name__}: {exc})")
        return capture.wrap_compiled(module, len(inputs)), unchanged
    compiled_before_return[0] = False
    dynamo_watch.watch(total, type(module).forward)
    return capture.wrap_compiled(compiled, len(inputs)), total


def _check_runs_eagerly(module: nn.Module, inputs: tuple[Any, ...]) -> None:
    """ValueError if ``module`` cannot run ``inputs`` even eagerly (the inputs are wrong)."""
    try:
        with torch.no_grad():
            module(*caller_state.clone_inputs(inputs))
    except Exception as exc:
        raise ValueError(
            f"example_inputs do not match {type(module).__name__}: running it raised {type(exc).__name__}: {exc}"
        ) from exc


def _first_line(exc: Exception) -> str:
    return str(exc).splitlines()[0] if str(exc) else ""
