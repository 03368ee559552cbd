"""cat_split: split(cat(x_0..x_k, d), s, d)[i] -> x_j (a piece that is exactly one cat input) or
split(x_j, s_j, d)[k] (pieces inside one cat input), when the split is along the cat's dim and no
piece straddles two cat inputs; likewise a narrow or basic slice of a cat along its dim -> x_j or
a narrow of x_j.

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

from optimus.engine.builder import Builder
from optimus.engine.context import RewriteContext
from optimus.engine.node_set_rule import Found, NodeSetRule
from optimus.rules.splitcat.pricing import VIEW, copy_cost, views
from optimus.semantics.freshness import breaks_freshness
from optimus.semantics.layouts import built_meta, layout_safe, same_dtypes
from optimus.semantics.views import (
    SPLITS,
    ListView,
    all_movable,
    cat_view,
    only_used_by,
    piece_of,
    pieces_of,
    split_view,
)


class CatSplit(NodeSetRule):
    name = "cat_split"
    anchors = SPLITS | {"cat"}

    def find(self, node: fx.Node, ctx: RewriteContext) -> Found | None:
        if cat_view(node, ctx) is not None:
            return self._slices_of_cat(node, ctx)
        split = split_view(node, ctx)
        if split is None:
            return None
        cat = cat_view(split.input, ctx)
        if cat is None or cat.whole is not None or cat.dim != split.dim:
            return None
        pieces = pieces_of(node)
        if pieces.others or not pieces.items:
            return None
        widths, starts = _extents(cat, ctx)
        # piece -> (cat input j, its index among the pieces inside j); sizes of the pieces per input
        where: dict[int, tuple[int, int]] = {}
        inside: dict[int, list[int]] = {}
        for i, (off, size) in enumerate(zip(split.offsets, split.sizes, strict=True)):
            j = _inside(starts, widths, off, size)
            if j is None:
                return None  # the piece straddles two cat inputs
            where[i] = (j, len(inside.setdefault(j, [])))
            inside[j].append(size)
        members = tuple(g for i in sorted(pieces.items) for g in pieces.items[i])
        if not all_movable([split.input, *cat.tensors, *members], ctx):
            return None
        if not same_dtypes(cat.tensors, split.input, ctx):
            return None  # the cat promoted a dtype: its pieces are not its inputs
        for i, gs in pieces.items.items():
            j = where[i][0]
            exact = len(inside[j]) == 1
            k, sizes = where[i][1], inside[j]
            built = (
                cat.tensors[j]
                if exact
                else built_meta(lambda y, s=sizes, k=k: torch.split(y, s, split.dim)[k], cat.tensors[j])
            )
            if any(not layout_safe(g, built, ctx) for g in gs):
                return None
        if breaks_freshness(
            [(g, cat.tensors[where[i][0]]) for i, gs in pieces.items.items() for g in gs], ctx
        ):
            return None  # a returned piece would share memory with an input or another output
        used = {where[i][0] for i in pieces.items}
        resplits = sum(1 for j in used if len(inside[j]) > 1)
        consumed: tuple[fx.Node, ...] = ()
        before = VIEW
        if only_used_by(split.input, [node]):
            before, consumed = before + copy_cost(split.input, ctx), (split.input,)
        index = {g: i for i, gs in pieces.items.items() for g in gs}
        data = ("split", cat.tensors, cat.dim, where, inside, index)
        return Found(members, before, views(resplits), data, consumed=consumed)

    def _slices_of_cat(self, node: fx.Node, ctx: RewriteContext) -> Found | None:
        """narrow(cat(xs, d), d, off, len) or cat(xs, d)[:, off:off+len] inside one x_j -> x_j or
        x_j.narrow(d, off - start_j, len), for every such reader of the cat at once (one rewrite:
        the cat copy is saved only when all its readers are rewritten)."""
        cat = cat_view(node, ctx)
        if cat is None or cat.whole is not None or not same_dtypes(cat.tensors, node, ctx):
            return None
        widths, starts = _extents(cat, ctx)
        plan: dict[fx.Node, tuple[int, int, int, bool]] = {}  # reader -> (j, offset, length, exact)
        for user in node.users:
            piece = piece_of(user, ctx)
            if piece is None or piece.holder is not user or piece.dim != cat.dim:
                continue
            j = _inside(starts, widths, piece.start, piece.length)
            if j is None:
                continue
            exact = piece.start == starts[j] and piece.length == widths[j]
            if breaks_freshness([(user, cat.tensors[j])], ctx):
                continue
            off, n = piece.start - starts[j], piece.length
            built = (
                cat.tensors[j]
                if exact
                else built_meta(lambda y, o=off, n=n: y.narrow(cat.dim, o, n), cat.tensors[j])
            )
            if not layout_safe(user, built, ctx):
                continue
            plan[user] = (j, piece.start - starts[j], piece.length, exact)
        if not plan or not all_movable([*cat.tensors, *plan], ctx):
            return None
        if breaks_freshness([(u, cat.tensors[p[0]]) for u, p in plan.items()], ctx):
            return None
        members = tuple(u for u in node.users if u in plan)  # graph order: deterministic
        narrows = sum(1 for j, off, n, exact in plan.values() if not exact)
        before = views(len(plan))
        if len(plan) == len(node.users):
            before = before + copy_cost(node, ctx)  # nothing else reads the cat: it goes too
        data = ("slices", cat.tensors, cat.dim, plan)
        return Found(members, before, views(narrows), data)

    def build(self, members: Sequence[fx.Node], data: Any, b: Builder) -> Sequence[fx.Node]:
        if data[0] == "slices":
            _, tensors, dim, plan = data
            out = []
            for m in members:
                j, start, length, exact = plan[m]
                out.append(tensors[j] if exact else b.call(torch.narrow, tensors[j], dim, start, length))
            return out
        _, tensors, dim, where, inside, index = data
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


def _extents(cat: ListView, ctx: RewriteContext) -> tuple[list[int], list[int]]:
    """Each cat input's extent along the cat dim, and where each starts (plus the total)."""
    widths = []
    for t in cat.tensors:
        meta = ctx.meta(t)
        assert meta is not None  # cat_view checked
        widths.append(meta.shape[cat.dim])
    starts = [0]
    for w in widths:
        starts.append(starts[-1] + w)
    return widths, starts


def _inside(starts: list[int], widths: list[int], off: int, size: int) -> int | None:
    """The cat input holding [off, off + size), or None if the range straddles two inputs."""
    # the last cat input starting at or before the range (past empty inputs)
    j = min(bisect.bisect_right(starts, off) - 1, len(widths) - 1)
    return j if off + size <= starts[j] + widths[j] else None
