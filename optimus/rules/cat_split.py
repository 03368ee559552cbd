"""cat_split: split(cat(x_0..x_k, d), s, d)[i] -> x_j (a piece that is exactly one cat input) or
split(x_j, s_j, d)[k] (pieces inside one cat input), when the split is along the cat's dim and no
piece straddles two cat inputs.

WHY: a cat feeding a split along the same dim is a round trip: a fused op concatenates inputs
that the next op immediately splits apart again. Every piece is (a view of) one cat input, so the
split and, if nothing else reads it, the cat copy disappear. All getitems of the split are
rewritten at once (one rewrite); a split whose tuple has other users, pieces that straddle a
boundary, a different dim, mutated/effectful nodes, or a result that would return a model input
or parameter itself as a graph output: declined.
"""

from __future__ import annotations

import bisect
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
    only_used_by,
    pieces_of,
    split_view,
    views,
)


class CatSplit(NodeSetRule):
    name = "cat_split"

    def find(self, node: fx.Node, ctx: RewriteContext) -> Found | None:
        split = split_view(node, ctx)
        if split is None:
            return None
        cat = cat_view(split.input, ctx)
        if cat is None or cat.whole is not None or cat.dim != split.dim:
            return None
        pieces = pieces_of(node)
        if pieces.others or not pieces.items:
            return None
        widths = []
        for t in cat.tensors:
            meta = ctx.meta(t)
            assert meta is not None  # cat_view checked
            widths.append(meta.shape[cat.dim])
        starts = [0]
        for w in widths:
            starts.append(starts[-1] + w)
        # piece -> (cat input j, its index among the pieces inside j); sizes of the pieces per input
        where: dict[int, tuple[int, int]] = {}
        inside: dict[int, list[int]] = {}
        for i, (off, size) in enumerate(zip(split.offsets, split.sizes, strict=True)):
            # the last cat input starting at or before the piece (past empty inputs)
            j = min(bisect.bisect_right(starts, off) - 1, len(widths) - 1)
            if off + size > starts[j] + widths[j]:
                return None  # the piece straddles two cat inputs
            where[i] = (j, len(inside.setdefault(j, [])))
            inside[j].append(size)
        members = tuple(g for i in sorted(pieces.items) for g in pieces.items[i])
        if not all_movable([split.input, *cat.tensors, *members], ctx):
            return None
        for i, gs in pieces.items.items():
            j = where[i][0]
            if len(inside[j]) == 1 and any(is_graph_output_alias(g, cat.tensors[j]) for g in gs):
                return None
        used = {where[i][0] for i in pieces.items}
        resplits = sum(1 for j in used if len(inside[j]) > 1)
        consumed: tuple[fx.Node, ...] = ()
        before = VIEW
        if only_used_by(split.input, [node]):
            before, consumed = before + copy_cost(split.input, ctx), (split.input,)
        index = {g: i for i, gs in pieces.items.items() for g in gs}
        data = (cat.tensors, cat.dim, where, inside, index)
        return Found(members, before, views(resplits), data, consumed=consumed)

    def build(self, members: Sequence[fx.Node], data: Any, b: Builder) -> Sequence[fx.Node]:
        tensors, dim, where, inside, index = data
        resplit: dict[int, fx.Node] = {}
        out = []
        for g in members:
            j, k = where[index[g]]
            if len(inside[j]) == 1:
                out.append(tensors[j])
                continue
            if j not in resplit:
                resplit[j] = b.call(torch.split, tensors[j], list(inside[j]), dim=dim)
            out.append(b.getitem(resplit[j], k))
        return out
