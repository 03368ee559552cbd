"""PyTorch 2 integration: the ``"optimus"`` torch.compile backend and the Inductor pre-grad pass.

``torch.compile(m, backend="optimus")``: Optimus rewrites each Dynamo graph, then Inductor
compiles it. ``optimus.backend(config)`` makes a backend with other options.

``torch._inductor.config.pre_grad_custom_pass = optimus.pre_grad_pass``: Inductor runs Optimus on
its pre-grad graph. ``uuid()`` is a hash of Optimus's source files and the config, so the FX graph
cache is invalidated exactly when the pass could produce a different graph.
"""

from __future__ import annotations

import hashlib
import logging
from pathlib import Path
from typing import Any

import torch
from torch import fx
from torch._inductor.custom_graph_pass import CustomGraphPass

from optimus.capture import checkpoint_rng
from optimus.config import OptimusConfig
from optimus.cost.analytic import for_inductor
from optimus.report import OptimusReport

log = logging.getLogger("optimus")


def _remember(own: list[OptimusReport], report: OptimusReport) -> None:
    own.append(report)
    del own[:-1024]  # the registered backend and pre_grad_pass live as long as the process


class OptimusBackend:
    """A torch.compile backend: Optimus on each graph, then ``inner`` (default: Inductor).

    ``inner="eager"`` runs each optimized graph as it is, with activation checkpointing as eager
    PyTorch does it (:mod:`optimus.capture.checkpoint_rng`; Dynamo's own ``backend="eager"`` recomputes a
    checkpointed block with new random numbers). Any other ``inner`` gets the graph with Dynamo's
    checkpoint op untouched, as Inductor and AOT autograd expect it.

    ``reports`` holds the report of every graph this backend optimized, in order (filled when
    torch.compile compiles, i.e. at the first call), so a caller reads what its own compile did.
    """

    def __init__(self, config: OptimusConfig | None = None, inner: Any = None) -> None:
        if isinstance(inner, str) and inner != "eager":
            raise ValueError(f'inner must be a compiler callable, None (Inductor) or "eager", got {inner!r}')
        cfg = config or OptimusConfig()
        if inner is None:  # Inductor compiles the result: price for it (optimus.cost.analytic.for_inductor)
            cfg = cfg.with_(cost_model=for_inductor(cfg.cost_model))
        self.config = cfg
        self.inner = inner
        self.reports: list[OptimusReport] = []

    def __call__(self, gm: fx.GraphModule, example_inputs: list[Any], **kwargs: Any) -> Any:
        from optimus.api import optimize_graph_module

        # (verify=True seeds the RNG to compare graphs: Dynamo restores the RNG state around
        # compilation, so the caller's stream does not see it)
        report = optimize_graph_module(gm, self.config, example_inputs if self.config.verify else None)
        report.capture = "backend"
        report.capture_reason = "a Dynamo graph handed to the optimus torch.compile backend"
        report.graphs = 1
        gm.optimus_report = report  # type: ignore[assignment]
        _remember(self.reports, report)
        if self.inner == "eager":
            checkpoint_rng.keep_rng(gm)
            return gm.forward
        if self.inner is not None:
            return self.inner(gm, example_inputs)
        from torch._inductor.compile_fx import compile_fx

        return compile_fx(gm, example_inputs, **kwargs)


def backend(config: OptimusConfig | None = None, inner: Any = None) -> OptimusBackend:
    """A torch.compile backend: Optimus on each graph, then ``inner`` (default: Inductor).

    With Inductor as ``inner`` the cost model prices for it (``optimus.cost.analytic.for_inductor``);
    ``inner="eager"`` runs the optimized graphs without a compiler (see :class:`OptimusBackend`).
    Its ``reports`` list what it optimized.
    """
    return OptimusBackend(config, inner)


def _source_hash() -> str:
    h = hashlib.sha256()
    for path in sorted(Path(__file__).parent.rglob("*.py")):
        h.update(path.name.encode())
        h.update(path.read_bytes())
    return h.hexdigest()


class OptimusPreGradPass(CustomGraphPass):
    """Optimus as an Inductor pre-grad custom pass (works on the graph in place)."""

    def __init__(self, config: OptimusConfig | None = None) -> None:
        cfg = config or OptimusConfig()
        self.config = cfg.with_(cost_model=for_inductor(cfg.cost_model))  # Inductor compiles it
        self.reports: list[OptimusReport] = []  # one per graph this pass optimized, in order

    def __call__(self, graph: fx.Graph) -> None:
        from optimus.api import optimize_graph_module

        gm = graph.owning_module
        if gm is None:
            gm = fx.GraphModule(torch.nn.Module(), graph)
        report = optimize_graph_module(gm, self.config, None)
        report.capture = "pre_grad"
        report.capture_reason = "Inductor's pre-grad graph (pre_grad_custom_pass)"
        report.graphs = 1
        _remember(self.reports, report)

    def uuid(self) -> str:
        return hashlib.sha256((_source_hash() + self.config.fingerprint()).encode()).hexdigest()


_REGISTERED = False


def register() -> None:
    """Register ``backend="optimus"`` with Dynamo (idempotent)."""
    global _REGISTERED
    if _REGISTERED:
        return
    from torch._dynamo.backends.registry import _BACKENDS, register_backend

    if "optimus" not in _BACKENDS:
        register_backend(name="optimus")(backend())
    _REGISTERED = True
