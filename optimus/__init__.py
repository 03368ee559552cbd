"""Optimus: general graph-rewrite rules for recommendation models on PyTorch 2.

gm = optimus.optimize(module, example_inputs)      # GraphModule + gm.optimus_report
torch.compile(model, backend="optimus")            # registered on import
torch._inductor.config.pre_grad_custom_pass = optimus.pre_grad_pass
"""

from __future__ import annotations

from .api import optimize, optimize_graph_module
from .backend import OptimusPreGradPass, backend, register
from .config import OptimusConfig
from .cost import AnalyticCostModel, CostModel
from .report import OptimusReport, RoundRecord
from .rules import REGISTRY
from .stop_reason import StopKind, StopReason

RULES: tuple[str, ...] = tuple(REGISTRY)

pre_grad_pass = OptimusPreGradPass()

register()

__all__ = [
    "RULES",
    "AnalyticCostModel",
    "CostModel",
    "OptimusConfig",
    "OptimusPreGradPass",
    "OptimusReport",
    "RoundRecord",
    "StopKind",
    "StopReason",
    "backend",
    "optimize",
    "optimize_graph_module",
    "pre_grad_pass",
]
