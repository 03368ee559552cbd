"""``optimus.dry_run``: the rewrites the driver would try on a graph, priced, without rewriting it.

WHY: diagnosis tools (the harness's batched-kernel ideal, a user asking "what would Optimus do
with my model?") need the candidate groups and their prices. Reading them through the engine's
internals tied those tools to every refactor of the engine; this is the one public way in. It
runs what the driver's first round runs before it applies anything (module lowering and the
cleanup rules, on a copy of the graph), then collects every rule's candidates in the driver's
own order (``optimus.engine.driver.collect``), so what it lists is what a run would try first.

Each member of a candidate carries its canonical op (``linear``, ``layer_norm``, ``relu``,
``add``, ...), its keyword arguments in canonical form, and a way to call that op, so a tool can
rebuild the members' arithmetic without knowing how the rules normalize call forms.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import torch
from torch import fx, nn

from optimus.api import make_config
from optimus.capture import caller_state
from optimus.capture import export as capture
from optimus.config import OptimusConfig
from optimus.cost.analytic import CostModel
from optimus.cost.price import Cost
from optimus.engine import driver
from optimus.engine.context import RewriteContext
from optimus.rules import resolve
from optimus.semantics.graph_copy import copy_graph_module
from optimus.semantics.meta import output_requires_grad, tensor_meta, value_meta
from optimus.semantics.normalize import (
    BINARY_POINTWISE,
    EMIT,
    OPS,
    UNARY_POINTWISE,
    emit_kwargs,
    lower_modules,
)


def op_kind(op: str | None) -> str | None:
    """``linear``, ``layer_norm``, ``unary`` or ``binary`` (pointwise), else None."""
    if op in ("linear", "layer_norm"):
        return op
    if op in UNARY_POINTWISE:
        return "unary"
    if op in BINARY_POINTWISE:
        return "binary"
    return None


@dataclass(frozen=True)
class Member:
    """One node a candidate replaces, in canonical form (``op`` None: not an op the rules know)."""

    node: fx.Node
    op: str | None
    kwargs: dict[str, Any]
    inplace: bool = False

    @property
    def kind(self) -> str | None:
        return op_kind(self.op)

    @property
    def operands(self) -> tuple[str, ...]:
        """The names of the op's first two arguments (a binary op's two operands)."""
        return tuple(name for name, _ in OPS[self.op][:2]) if self.op in OPS else ()

    def call(self, **kwargs: Any) -> Any:
        """Run the op on canonical keyword arguments (tensors in place of graph nodes)."""
        if self.op is None or self.op not in EMIT:
            raise ValueError(f"no callable for op {self.op!r}")
        args, kw = emit_kwargs(self.op, kwargs)
        return EMIT[self.op](*args, **kw)


@dataclass(frozen=True)
class PlannedRewrite:
    """One candidate: the rule, its members, its price before and after, and the seconds the cost
    model says it saves (``gain_s``; not positive: the driver would decline it)."""

    rule: str
    members: tuple[Member, ...]
    before: Cost
    after: Cost
    gain_s: float

    @property
    def nodes(self) -> tuple[fx.Node, ...]:
        return tuple(m.node for m in self.members)


@dataclass(frozen=True)
class TensorInfo:
    shape: tuple[int, ...]
    dtype: torch.dtype
    device: torch.device
    requires_grad: bool


@dataclass
class DryRun:
    """The graph the candidates were found in (a copy, after lowering and cleanup), and the
    candidates, best first, in the driver's order."""

    graph: fx.GraphModule
    rewrites: list[PlannedRewrite] = field(default_factory=list)

    def tensor(self, node: fx.Node) -> TensorInfo | None:
        """Shape, dtype, device and grad requirement of a tensor value of the graph."""
        meta = tensor_meta(node)
        if meta is None:
            return None
        if node.op == "get_attr":
            value: Any = self.graph
            for part in str(node.target).split("."):
                value = getattr(value, part, None)
            grad = bool(getattr(value, "requires_grad", False))
        else:
            grad = bool(output_requires_grad(node))
        return TensorInfo(tuple(int(d) for d in meta.shape), meta.dtype, meta.device, grad)

    def value(self, node: fx.Node) -> Any:
        """A non-tensor value the capture recorded for ``node`` (a Python scalar), else None."""
        return value_meta(node)


def capture_graph(module: nn.Module, example_inputs: Sequence[Any], train: bool = False) -> fx.GraphModule:
    """``module`` as one Dynamo graph with shapes recorded (what the rules match on), captured
    under the grad mode of a training (``train``) or inference step; the module's state, the
    inputs and the RNG are left as they were."""
    grad = torch.enable_grad() if train else torch.no_grad()
    with caller_state.preserved(module), grad:
        return capture.export(module, list(example_inputs))


def dry_run(
    graph: fx.GraphModule | nn.Module,
    example_inputs: Sequence[Any] | None = None,
    *,
    rules: Sequence[str] | None = None,
    cost_model: CostModel | None = None,
    config: OptimusConfig | None = None,
    train: bool = False,
) -> DryRun:
    """The rewrites the driver's first round would try on ``graph``, priced, best first.

    ``graph``: a captured GraphModule (left unchanged), or a module, captured here with
    ``example_inputs`` (see :func:`capture_graph`). ``rules``/``cost_model``/``config`` as in
    ``optimus.optimize``, with the same defaults. Cleanup rules run on the copy and are
    not listed; every other rule's candidates are, also those the cost model would decline."""
    if not isinstance(graph, fx.GraphModule):
        if example_inputs is None:
            raise ValueError("dry_run of a module needs example_inputs")
        graph = capture_graph(graph, example_inputs, train)
    cfg = make_config(rules, cost_model, False, config)
    model = cfg.cost_model
    gm = copy_graph_module(graph)
    if lower_modules(gm):
        gm.recompile()
    chosen = resolve(cfg.rules)

    def context() -> RewriteContext:
        return RewriteContext(gm, model, cfg.layout)

    ctx = context()
    for rule in (r for r in chosen if r.kind == "cleanup"):
        if rule.run(ctx):  # type: ignore[attr-defined]
            ctx = context()
    out = DryRun(gm)
    for cand in driver.collect(ctx, chosen, model):
        members = tuple(_member(node, ctx) for node in cand.nodes)
        out.rewrites.append(PlannedRewrite(cand.rule, members, cand.before, cand.after, cand.gain))
    return out


def _member(node: fx.Node, ctx: RewriteContext) -> Member:
    canon = ctx.canon(node)
    if canon is None:
        return Member(node, None, {})
    return Member(node, canon.op, dict(canon.kwargs), bool(canon.inplace))
