"""cat_gather: cat([unbind(y, u)[i_0], unbind(y, u)[i_1], ...], c) with the indices repeated or out
of order -> index_select(y.movedim(u, c), c, I).flatten(c, c + 1), I = [i_0, i_1, ...] a constant
buffer (Builder.constant). The gather writes the cat's contiguous layout directly: selecting first
and moving after cost a second copy (26 embeddings of [64, 1, 16], PNN's 325 pairs, eager CPU: 189
against 60 us forward), and building I from its list every call 43 us more.

WHY: pairwise-interaction layers gather feature pairs by index lists: DeepCTR's PNN inner and
outer products build ``p = cat([embeds[i] for i in row], 1)`` and ``q = cat([embeds[j] for j in
col], 1)`` over all 325 pairs of 26 features. In eager each such cat is cheap forward, but its
backward narrows the gradient once per input and accumulates it into the repeated pieces: 6,570
narrows and 5,980 ``add_`` per PNN training step, the largest share of its time. As one
``index_select`` over the stacked embeddings, the backward is one ``index_add``. In order and
without repeats it is ``unbind_cat``'s (no gather needed).

Exact: the same elements in the same order; the gather copies them once into a fresh
contiguous tensor (the flatten is a view of it), as the cat. Gradients are sums of the same
terms (accumulated in another order: rounding only). Declines when a piece is not an unbind
output of the one source, the dtypes differ (a cat would promote), or nodes are ordered.
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
from optimus.rules.splitcat.pricing import CAT_INPUT_LAUNCHES, copy_cost
from optimus.semantics.layouts import built_meta, layout_safe, same_dtypes
from optimus.semantics.meta import output_requires_grad
from optimus.semantics.views import all_movable, cat_view, item_of, unbind_view

# the cat's backward, per input: a narrow of the gradient and, for a repeated piece, an add into
# its accumulated gradient (measured on PNN: ~3 us each, about 0.4 CPU launches)
BACKWARD_PER_INPUT = 0.8


def _gathered(y: torch.Tensor, u: int, c: int, idx: list[int]) -> torch.Tensor:
    picked = torch.index_select(torch.movedim(y, u, c), c, torch.tensor(idx, device=y.device))
    return torch.flatten(picked, c, c + 1).contiguous()


class CatGather(NodeSetRule):
    name = "cat_gather"
    anchors = frozenset({"cat"})

    def find(self, node: fx.Node, ctx: RewriteContext) -> Found | None:
        cat = cat_view(node, ctx)
        if cat is None or cat.whole is not None or len(cat.tensors) < 2:
            return None
        items = [item_of(t) for t in cat.tensors]
        if any(it is None for it in items):
            return None
        sources = {it[0] for it in items if it is not None}
        if len(sources) != 1:
            return None
        source = sources.pop()
        unbind = unbind_view(source, ctx)
        idx = [it[1] for it in items if it is not None]
        if unbind is None or max(idx) >= unbind.count:
            return None
        if idx == list(range(idx[0], idx[0] + len(idx))):
            return None  # a run in order: unbind_cat's
        y, u, c = unbind.input, unbind.dim, cat.dim
        if not all_movable([source, y, *cat.tensors], ctx) or not same_dtypes(cat.tensors, y, ctx):
            return None
        if not layout_safe(node, built_meta(lambda t: _gathered(t, u, c, idx), y), ctx):
            return None
        n = len(idx)
        grad = bool(output_requires_grad(node))
        out = ctx.meta(node)
        nbytes = 0.0 if out is None else float(out.nbytes)
        before = copy_cost(node, ctx) + Cost(launches=BACKWARD_PER_INPUT * n if grad else 0.0)
        after = Cost(launches=3.0 + (3.0 if grad else 0.0) - CAT_INPUT_LAUNCHES, bytes=2.0 * nbytes)
        return Found((node,), before, after, (y, u, c, tuple(idx)))

    def build(self, members: Sequence[fx.Node], data: Any, b: Builder) -> Sequence[fx.Node]:
        y, u, c, idx = data
        meta = b.ctx.meta(y)
        device = meta.device if meta is not None else torch.device("cpu")
        index = b.constant(list(idx), device=device)
        picked = b.call(torch.index_select, b.call(torch.movedim, y, u, c), c, index)
        return [b.method("contiguous", b.call(torch.flatten, picked, c, c + 1))]


__all__ = ["CatGather"]
