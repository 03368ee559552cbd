"""Optimus: general graph-rewrite rules for recommendation models on PyTorch 2.

gm = optimus.optimize(module, example_inputs)      # GraphModule + gm.optimus_report
torch.compile(model, backend="optimus")            # registered on import
torch._inductor.config.pre_grad_custom_pass = optimus.pre_grad_pass
optimus.dry_run(module, example_inputs)            # what the driver would try, priced

Every name a user writes is importable from here; the layers below (``capture``, ``params``,
``rules``, ``engine``, ``memory``, ``semantics``, ``cost``, ``kernels``) may move between
releases. ``docs/architecture.md`` maps them.
"""

from __future__ import annotations

from optimus import _moved
from optimus.api import optimize, optimize_graph_module
from optimus.backend import OptimusPreGradPass, backend, register
from optimus.config import OptimusConfig
from optimus.cost.analytic import CPU, CUDA, AnalyticCostModel, CostModel, DeviceConstants
from optimus.cost.measured import MeasuredCostModel
from optimus.dry_run import DryRun, Member, PlannedRewrite, TensorInfo, capture_graph, dry_run
from optimus.engine.param_layout import ParamLayout, RuntimeStack
from optimus.params.relayout import RelayoutParams, retained_gradient_buffers
from optimus.report import OptimusReport, RoundRecord, StopKind, StopReason
from optimus.rules import REGISTRY

RULES: tuple[str, ...] = tuple(REGISTRY)

pre_grad_pass = OptimusPreGradPass()

register()
_moved.install()

__all__ = [
    "CPU",
    "CUDA",
    "RULES",
    "AnalyticCostModel",
    "CostModel",
    "DeviceConstants",
    "DryRun",
    "MeasuredCostModel",
    "Member",
    "OptimusConfig",
    "OptimusPreGradPass",
    "OptimusReport",
    "ParamLayout",
    "PlannedRewrite",
    "RelayoutParams",
    "RoundRecord",
    "RuntimeStack",
    "StopKind",
    "StopReason",
    "TensorInfo",
    "backend",
    "capture_graph",
    "dry_run",
    "optimize",
    "optimize_graph_module",
    "pre_grad_pass",
    "retained_gradient_buffers",
]
