"""cat_pieces: cat([x[.., s:s+L, ..], x[.., s+L:s+2L, ..], ...], e) (n adjacent equal pieces of one x
along d, concatenated along another dim e != d) -> clone(x(.narrow(d, s, n*L)).unflatten(d, (n, L))
.movedim(d, e), contiguous).flatten(e, e + 1).

WHY: Inductor's split/cat pass removes ``cat(split(x, L, 1), dim=2)`` (its "split then cat on
another dim"); ours left the split and n piece dispatches in place. The cat is one copy of x's
values in another order: the same values as one clone of a reshaped view (piece i lands at
offset i * X_e along e, n major). The clone keeps the cat's fresh, contiguous storage: a
``.contiguous()`` or ``reshape`` could hand back a view of x itself. Same dim (``e == d``):
``split_cat``'s. Declines for unequal, permuted, repeated or non-adjacent pieces and
mutated/effectful nodes.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch
from torch import fx

from ..builder import Builder
from ..context import RewriteContext
from ._node_set_rule import Found, NodeSetRule
from ._split_cat_cost import copy_cost, views
from ._split_cat_layout import built_meta, layout_safe, same_dtypes
from ._split_cat_util import adjacent_pieces, all_movable, cat_view, only_used_by, tuple_dies_with
from .base import Cost


def _moved(y: torch.Tensor, d: int, e: int, start: int, n: int, length: int, partial: bool) -> torch.Tensor:
    if partial:
        y = y.narrow(d, start, n * length)
    y = y.unflatten(d, (n, length)).movedim(d, e)
    return torch.clone(y, memory_format=torch.contiguous_format).flatten(e, e + 1)


class CatPieces(NodeSetRule):
    name = "cat_pieces"
    anchors = frozenset({"cat"})

    def find(self, node: fx.Node, ctx: RewriteContext) -> Found | None:
        cat = cat_view(node, ctx)
        if cat is None or len(cat.tensors) < 2:
            return None
        pieces = adjacent_pieces(cat.tensors, ctx)
        if pieces is None or pieces[0].dim == cat.dim:
            return None
        first = pieces[0]
        holders = {p.holder: p.holder is p.node for p in pieces}
        if not all_movable([first.source, *cat.tensors, *holders], ctx):
            return None
        if not same_dtypes(cat.tensors, first.source, ctx):
            return None
        meta = ctx.meta(first.source)
        assert meta is not None
        n, d, e, s, k = len(pieces), first.dim, cat.dim, first.start, first.length
        partial = s != 0 or n * k != meta.shape[d]
        if not layout_safe(node, built_meta(lambda y: _moved(y, d, e, s, n, k, partial), first.source), ctx):
            return None
        dies = {
            h
            for h, own in holders.items()
            if (only_used_by(h, [node]) if own else tuple_dies_with(h, [node]))
        }
        dying = sum(1 for p in pieces if p.holder in dies)  # a view made per piece
        before = copy_cost(node, ctx) + views(dying)
        after = Cost(launches=1.0, bytes=copy_cost(node, ctx).bytes) + views(2 + int(partial))
        return Found((node,), before, after, (first.source, d, e, s, n, k, partial))

    def build(self, members: Sequence[fx.Node], data: Any, b: Builder) -> Sequence[fx.Node]:
        x, d, e, start, n, length, partial = data
        if partial:
            x = b.call(torch.narrow, x, d, start, n * length)
        x = b.call(torch.movedim, b.call(torch.unflatten, x, d, (n, length)), d, e)
        x = b.call(torch.clone, x, memory_format=torch.contiguous_format)
        return [b.call(torch.flatten, x, e, e + 1)]


__all__ = ["CatPieces"]
