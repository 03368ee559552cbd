"""stack_cast_pieces: stack([x[.., s:s+L, ..].long(), x[.., s+L:s+2L, ..].long(), ...], e) (the same
dtype conversion of n adjacent equal pieces of one x along d) -> x.narrow(d, s, n*L).unflatten(d,
(n, L)).movedim(d, e).to(dtype, memory_format=torch.contiguous_format) (no narrow when the pieces
cover x, no movedim when d == e).

WHY: the input layer of every DeepCTR model reads each sparse feature as ``X[:, i:i+1].long()``
(26 of them in the corpus's Criteo-shaped inputs), and ``batch_embedding`` then stacks the 26
converted pieces into one index tensor: 26 slices, 26 conversions and a stack per call. The same
tensor is one conversion of a view of X: one copy. ``stack_pieces`` covers the stack of the pieces
themselves; the conversion in between hides them from it.

Exact: a dtype conversion is elementwise, so converting the stacked pieces gives the same elements
as stacking the converted ones; a conversion that changes the dtype always makes a new tensor, and
``contiguous_format`` gives it the stack's layout (fresh, contiguous). Gradients (float to float
conversions) convert back the same way. Declines when a conversion keeps the dtype (it may return
its input itself, where the stack copies) or changes the device, when the conversions differ, when
a converted piece has another reader (it would stay), and for ordered nodes.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch
from torch import fx

from optimus.engine.builder import Builder
from optimus.engine.context import RewriteContext
from optimus.engine.node_set_rule import Found, NodeSetRule
from optimus.engine.rule import Cost
from optimus.rules.splitcat.pricing import copy_cost, views
from optimus.rules.splitcat.stack_pieces import _built
from optimus.semantics.op_schema import CONVERSIONS
from optimus.semantics.views import adjacent_pieces, all_movable, only_used_by, stack_view, tuple_dies_with


def _cast_of(node: Any, ctx: RewriteContext) -> tuple[fx.Node, torch.dtype] | None:
    """(input, dtype) when ``node`` is a dtype conversion method that changes the dtype and not
    the device."""
    if not isinstance(node, fx.Node) or node.op != "call_method" or node.target not in CONVERSIONS:
        return None
    src = node.args[0] if node.args else None
    if not isinstance(src, fx.Node):
        return None
    before, after = ctx.meta(src), ctx.meta(node)
    if before is None or after is None or before.dtype == after.dtype or before.device != after.device:
        return None
    return src, after.dtype


class StackCastPieces(NodeSetRule):
    name = "stack_cast_pieces"
    anchors = frozenset({"stack"})

    def find(self, node: fx.Node, ctx: RewriteContext) -> Found | None:
        stack = stack_view(node, ctx)
        if stack is None or len(stack.tensors) < 2:
            return None
        casts = [_cast_of(t, ctx) for t in stack.tensors]
        if any(c is None for c in casts):
            return None
        dtypes = {c[1] for c in casts if c is not None}
        if len(dtypes) != 1 or not all(only_used_by(t, [node]) for t in stack.tensors):
            return None
        pieces = adjacent_pieces([c[0] for c in casts if c is not None], ctx)
        if pieces is None:
            return None
        first = pieces[0]
        holders = {p.holder: p.holder is p.node for p in pieces}
        if not all_movable([first.source, *stack.tensors, *(p.node for p in pieces), *holders], ctx):
            return None
        meta, out = ctx.meta(first.source), ctx.meta(node)
        if meta is None or out is None:
            return None
        n, d, e = len(pieces), first.dim, stack.dim
        partial = first.start != 0 or n * first.length != meta.shape[d]
        dying = sum(
            1
            for h, own in holders.items()
            if (only_used_by(h, stack.tensors) if own else tuple_dies_with(h, stack.tensors))
        )
        # one conversion reads the pieces and writes the result; n of them read and write as much
        moved = float(out.numel * meta.dtype.itemsize + out.nbytes)
        before = copy_cost(node, ctx) + Cost(launches=float(n), bytes=moved) + views(dying)
        after = views(1 + int(partial) + int(d != e)) + Cost(launches=1.0, bytes=moved)
        return Found(
            (node,), before, after, (first.source, d, e, first.start, n, first.length, partial, dtypes.pop())
        )

    def build(self, members: Sequence[fx.Node], data: Any, b: Builder) -> Sequence[fx.Node]:
        x, d, e, start, n, length, partial, dtype = data
        view = _built(x, d, e, start, n, length, partial, b)  # stack_pieces' view of the pieces
        return [b.method("to", view, dtype, memory_format=torch.contiguous_format)]


__all__ = ["StackCastPieces"]
