"""``optimus.optimize``: capture, rewrite, report."""

from __future__ import annotations

import logging
import time
from collections.abc import Sequence
from typing import Any

import torch
from torch import fx, nn

from . import capture, driver
from .codegen_flat import use_flat_codegen
from .config import OptimusConfig
from .cost import CostModel
from .layout_relayout import OWNED_FLAG
from .meta import record, value_meta
from .normalize import lower_modules
from .report import OptimusReport
from .verify import Verifier

log = logging.getLogger("optimus")


def optimize_graph_module(
    gm: fx.GraphModule,
    config: OptimusConfig,
    example_inputs: Sequence[Any] | None = None,
    report: OptimusReport | None = None,
) -> OptimusReport:
    """Optimize ``gm`` in place (the graph is changed); returns the report. Never raises for an
    op it does not know: such nodes are left alone. An internal failure leaves the graph as it was
    and says why in the report."""
    report = report or OptimusReport()
    if lower_modules(gm):
        gm.recompile()
    verifier = None
    if config.verify:
        if example_inputs is None:
            report.notes.append("verify requested but no example inputs: not verified")
        else:
            reference = capture.copy_graph_module(gm)
            verifier = Verifier(reference, example_inputs, config.seed, config.rtol, config.atol)
    backup = capture.copy_graph(gm.graph)
    try:
        driver.run(gm, config, report, verifier)
    except Exception as exc:  # never fail the user's model because of an optimizer bug
        log.warning(
            "optimus: optimization failed (%s: %s); graph returned unchanged", type(exc).__name__, exc
        )
        gm.graph = backup
        gm.recompile()
        report.stop_reason = "unchanged"
        report.nodes_after = report.nodes_before = len(gm.graph.nodes)
        report.notes.append(f"unchanged: {type(exc).__name__}: {exc}")
    return report


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
    """
    cfg = make_config(rules, cost_model, verify, config)
    start = time.perf_counter()
    if isinstance(module, fx.GraphModule):
        inputs = tuple(example_inputs) if isinstance(example_inputs, (list, tuple)) else (example_inputs,)
        gm = capture.copy_graph_module(module)
        if any(value_meta(n) is None for n in gm.graph.nodes if n.op == "placeholder"):
            try:
                record(gm, inputs)
            except Exception as exc:
                raise ValueError(
                    f"example_inputs do not match the GraphModule: {type(exc).__name__}: {exc}"
                ) from exc
        setattr(gm, OWNED_FLAG, not cfg.verify)  # a re-laying-out layout may re-point parameters
        report = optimize_graph_module(gm, cfg, inputs if cfg.verify else None)
        report.capture = "graph"
    else:
        inputs = capture.check_inputs(module, example_inputs)
        try:
            gm = capture.export(module, inputs)
            use_flat_codegen(gm)  # skip pytree (un)flattening per call where the specs are flat
            mode = "export"
        except Exception as exc:
            log.info(
                "optimus: whole-graph export failed (%s: %s); optimizing Dynamo subgraphs",
                type(exc).__name__,
                str(exc).splitlines()[0] if str(exc) else "",
            )
            gm, report = _optimize_subgraphs(module, inputs, cfg, exc)
            gm.optimus_report = report  # type: ignore[assignment]
            report.capture_seconds = time.perf_counter() - start - report.seconds
            return gm
        flat_inputs = [x for x in torch.utils._pytree.tree_flatten(inputs)[0]]
        setattr(gm, OWNED_FLAG, not cfg.verify)  # a re-laying-out layout may re-point parameters
        report = optimize_graph_module(gm, cfg, flat_inputs if cfg.verify else None)
        report.capture = mode
        if cfg.verify and len(flat_inputs) != len([n for n in gm.graph.nodes if n.op == "placeholder"]):
            report.notes.append("verify inputs did not line up with the exported graph's inputs")
    report.graphs = 1
    report.capture_seconds = time.perf_counter() - start - report.seconds
    gm.optimus_report = report  # type: ignore[assignment]
    return gm


def _optimize_subgraphs(
    module: nn.Module, inputs: tuple[Any, ...], cfg: OptimusConfig, reason: Exception
) -> tuple[fx.GraphModule, OptimusReport]:
    total = OptimusReport(capture="dynamo-subgraphs", stop_reason="saturated", graphs=0)
    total.notes.append(f"whole-graph export failed ({type(reason).__name__}); optimized each Dynamo graph")

    def backend(sub: fx.GraphModule, example: list[Any]) -> Any:
        one = optimize_graph_module(sub, cfg, example if cfg.verify else None)
        one.graphs = 1
        total.merge(one)
        return sub.forward

    compiled = torch.compile(module, backend=backend, dynamic=False)
    try:
        compiled(*inputs)  # compile now (grad mode on: the training graph is the common one)
    except Exception as exc:  # Dynamo cannot run this model at all: hand back the model itself
        log.warning(
            "optimus: Dynamo could not capture %s (%s: %s); returned unchanged",
            type(module).__name__,
            type(exc).__name__,
            exc,
        )
        unchanged = OptimusReport(capture="none", stop_reason="unchanged", graphs=0)
        unchanged.notes.append(f"unchanged: Dynamo could not capture the model ({type(exc).__name__}: {exc})")
        return capture.wrap_compiled(module, len(inputs)), unchanged
    return capture.wrap_compiled(compiled, len(inputs)), total
