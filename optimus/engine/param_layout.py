"""How a fused op gets its stacked parameters: the one swappable piece of the fused form.

WHY: a batched matmul wants its G weights as one contiguous [G, K, N] tensor. The default,
:class:`RuntimeStack`, builds it in the graph every forward (``torch.stack`` of the module's own
parameters, so gradients land on them), which costs 2x the weight bytes per call. A later layout can
re-lay parameters out once (stacked storage, originals as views, ``state_dict`` compatible) and
return a ``get_attr`` of the stacked tensor instead (or a transposed view of it, so that each
parameter keeps eager's strides), at zero runtime cost; rules and the cost model only talk to this
interface.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Protocol

import torch
from torch import fx

if TYPE_CHECKING:
    from optimus.engine.builder import Builder
    from optimus.engine.context import RewriteContext


class ParamLayout(Protocol):
    def stacked(self, params: Sequence[fx.Node], b: Builder, transpose: bool = False) -> fx.Node:
        """A [G, *param.shape] (or [G, cols, rows] when ``transpose``) tensor: contiguous, or a
        transposed view of contiguous storage (what a layout that keeps each parameter's own
        strides gives; ``bmm``/``baddbmm`` read it without a copy). Rules only view or
        matmul it."""
        ...

    def bytes_moved(self, params: Sequence[fx.Node], ctx: RewriteContext) -> float:
        """Bytes the layout moves per call (for the cost model)."""
        ...

    def launches(self, params: Sequence[fx.Node], transpose: bool = False) -> float:
        """Kernel launches (view dispatches count a tenth) the layout adds per call."""
        ...

    def concatenated(self, params: Sequence[fx.Node], b: Builder) -> fx.Node:
        """``torch.cat(params, 0)`` (for merging linears that share an input)."""
        ...


def _identity(node: fx.Node) -> object:
    """get_attr nodes reading the same attribute are the same parameter."""
    return ("attr", node.target) if node.op == "get_attr" else node


class RuntimeStack:
    """Stack the original parameters in the graph (copies once per call; autograd-correct)."""

    def stacked(self, params: Sequence[fx.Node], b: Builder, transpose: bool = False) -> fx.Node:
        if len({_identity(p) for p in params}) == 1:  # one shared parameter: a broadcast view, no copy
            p = params[0]
            meta = b.ctx.meta(p)
            ndim = len(meta.shape) if meta is not None else 1
            base = b.method("t", p) if transpose else p
            return b.method("expand", b.method("unsqueeze", base, 0), len(params), *([-1] * ndim))
        if transpose:
            # stack of transposed views: one copy straight into [G, K, N]. (stack + transpose +
            # contiguous lets Inductor keep the transposed view, and extern baddbmm then copies.)
            return b.call(torch.stack, [b.method("t", p) for p in params])
        return b.call(torch.stack, list(params))

    def concatenated(self, params: Sequence[fx.Node], b: Builder) -> fx.Node:
        return b.call(torch.cat, list(params), 0)

    def launches(self, params: Sequence[fx.Node], transpose: bool = False) -> float:
        if len({_identity(p) for p in params}) == 1:
            return 0.2  # unsqueeze + expand views
        return 1.0 + (0.1 * len(params) if transpose else 0.0)

    def bytes_moved(self, params: Sequence[fx.Node], ctx: RewriteContext) -> float:
        if len({_identity(p) for p in params}) == 1:
            return 0.0
        total = 0.0
        for p in params:
            meta = ctx.meta(p)
            total += 2 * (meta.nbytes if meta is not None else 0)
        return total
