"""split_cat: cat(split(x, s, d)[i..j], d) -> x (all pieces) or x.narrow(d, off_i, len) (a run),
when the cat's inputs are pieces i, i+1, .., j of one split along the cat's own dim, in order.

WHY: models split a tensor, work on some pieces and glue the untouched ones back; after other
rewrites the glue often reads the split directly. The cat copies what the input already holds;
the full round trip is the input itself, a contiguous run is a view of it (no copy). A split
piece with other users keeps the split (only the cat changes). Declines when dims differ, the
order is permuted or has gaps, a node involved is mutated or effectful (ordered), or the result
would return a model input or parameter itself as a graph output.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch
from torch import fx

from ..builder import Builder
from ..context import RewriteContext
from ._split_cat_util import (
    VIEW,
    Found,
    NodeSetRule,
    all_movable,
    cat_view,
    copy_cost,
    is_graph_output_alias,
    item_of,
    split_view,
    tuple_dies_with,
)
from .base import Cost


class SplitCat(NodeSetRule):
    name = "split_cat"

    def find(self, node: fx.Node, ctx: RewriteContext) -> Found | None:
        cat = cat_view(node, ctx)
        if cat is None:
            return None
        if cat.whole is not None:
            source, first, last = cat.whole, 0, None
        else:
            items = [item_of(t) for t in cat.tensors]
            if any(it is None for it in items):
                return None
            sources = {it[0] for it in items if it is not None}
            if len(sources) != 1:
                return None
            source = sources.pop()
            indices = [it[1] for it in items if it is not None]
            first = indices[0]
            if indices != list(range(first, first + len(indices))):
                return None  # permuted, repeated or with gaps
            last = indices[-1]
        split = split_view(source, ctx)
        if split is None or split.dim != cat.dim or not all_movable([source, *cat.tensors], ctx):
            return None
        if last is None:
            last = len(split.sizes) - 1
        if last >= len(split.sizes):
            return None
        full = first == 0 and last == len(split.sizes) - 1
        if full and is_graph_output_alias(node, split.input):
            return None
        if not full and last == first:
            return None  # cat of one piece: noop_split_cat's job
        before = copy_cost(node, ctx)
        if tuple_dies_with(source, [node]):
            before = before + VIEW
        after = Cost() if full else VIEW
        start = split.offsets[first]
        length = sum(split.sizes[first : last + 1])
        return Found((node,), before, after, (split.input, split.dim, start, length, full))

    def build(self, members: Sequence[fx.Node], data: Any, b: Builder) -> Sequence[fx.Node]:
        source, dim, start, length, full = data
        if full:
            return [source]
        return [b.call(torch.narrow, source, dim, start, length)]
