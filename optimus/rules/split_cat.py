"""split_cat: cat(split(x, s, d)[i..j], d) -> x (all pieces) or x.narrow(d, off_i, len) (a run); a run
of pieces inside a longer cat -> one narrow view in its place, when the cost model says it pays.

WHY: models split a tensor, work on some pieces and glue the untouched ones back; after other
rewrites the glue often reads the split directly. The cat copies what the input already holds:
the full round trip is the input itself, a cat of a contiguous run is a view of it (no copy).
Inside a cat that also has other inputs, a run of k pieces becomes one input (a narrow view):
that saves little (a shorter input list) and costs a view dispatch, so it is rated by the cost
model and fires only for long runs or when the split itself dies. A split piece with other users
keeps the split (only the cat changes). Declines when dims differ, the order is permuted or has
gaps, a node involved is mutated or effectful (ordered), or the result would return a model input
or parameter itself as a graph output.
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
    ListView,
    NodeSetRule,
    SplitView,
    all_movable,
    cat_view,
    copy_cost,
    is_graph_output_alias,
    item_of,
    split_view,
    tuple_dies_with,
    views,
)
from .base import Cost

Run = tuple[SplitView, int, int]  # (split, first piece, last piece)


def _runs(cat: ListView, ctx: RewriteContext) -> list[tuple[int, int, Run | None]]:
    """Cover the cat's inputs [start, end) with maximal runs of consecutive pieces of one split
    along the cat's dim (None: a single input that is not part of a run)."""
    out: list[tuple[int, int, Run | None]] = []
    k = 0
    tensors = cat.tensors
    while k < len(tensors):
        item = item_of(tensors[k])
        split = split_view(item[0], ctx) if item is not None else None
        if item is None or split is None or split.dim != cat.dim:
            out.append((k, k + 1, None))
            k += 1
            continue
        end = k + 1
        while end < len(tensors):
            nxt = item_of(tensors[end])
            if nxt is None or nxt[0] is not item[0] or nxt[1] != item[1] + (end - k):
                break
            end += 1
        out.append((k, end, (split, item[1], item[1] + (end - k) - 1)))
        k = end
    return out


class SplitCat(NodeSetRule):
    name = "split_cat"

    def find(self, node: fx.Node, ctx: RewriteContext) -> Found | None:
        cat = cat_view(node, ctx)
        if cat is None:
            return None
        if cat.whole is not None:
            split = split_view(cat.whole, ctx)
            if split is None or split.dim != cat.dim or not all_movable([cat.whole], ctx):
                return None
            if is_graph_output_alias(node, split.input):
                return None
            before = copy_cost(node, ctx, len(split.sizes))
            if tuple_dies_with(cat.whole, [node]):
                before = before + VIEW
            return Found((node,), before, Cost(), ("input", split.input))
        runs = [r for r in _runs(cat, ctx) if r[2] is not None and r[1] - r[0] >= 2]
        if not runs or not all_movable(cat.tensors, ctx):
            return None
        if not all_movable([r[2][0].node for r in runs if r[2] is not None], ctx):
            return None
        if len(runs) == 1 and runs[0][:2] == (0, len(cat.tensors)):  # the whole cat is one run
            start, end, run = runs[0]
            assert run is not None
            split, first, last = run
            full = first == 0 and last == len(split.sizes) - 1
            if full and is_graph_output_alias(node, split.input):
                return None
            before = copy_cost(node, ctx)
            if tuple_dies_with(split.node, [node]):
                before = before + VIEW
            if full:
                return Found((node,), before, Cost(), ("input", split.input))
            return Found((node,), before, VIEW, ("narrow", _narrow_args(run)))
        # runs inside a longer cat: each becomes one narrow view
        new_inputs: list[Any] = []
        pos = 0
        for start, end, run in runs:
            new_inputs.extend(cat.tensors[pos:start])
            new_inputs.append(_narrow_args(run))  # type: ignore[arg-type]
            pos = end
        new_inputs.extend(cat.tensors[pos:])
        before = copy_cost(node, ctx)
        splits = {r[2][0].node for r in runs if r[2] is not None}
        for s in splits:
            if tuple_dies_with(s, [node]):
                before = before + VIEW
        after = copy_cost(node, ctx, len(new_inputs)) + views(len(runs))
        return Found((node,), before, after, ("cat", new_inputs, cat.dim))

    def build(self, members: Sequence[fx.Node], data: Any, b: Builder) -> Sequence[fx.Node]:
        if data[0] == "input":
            return [data[1]]
        if data[0] == "narrow":
            return [b.call(torch.narrow, *data[1])]
        _, inputs, dim = data
        made = [v if isinstance(v, fx.Node) else b.call(torch.narrow, *v) for v in inputs]
        return [b.call(torch.cat, made, dim=dim)]


def _narrow_args(run: Run) -> tuple[fx.Node, int, int, int]:
    split, first, last = run
    return split.input, split.dim, split.offsets[first], sum(split.sizes[first : last + 1])
