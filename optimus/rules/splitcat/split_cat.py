"""split_cat: cat(split(x, s, d)[i..j], d) -> x (all pieces) or x.narrow(d, off_i, len) (a run); a run
of pieces inside a longer cat -> one narrow view in its place, when the cost model says it pays.
Pieces may also be narrows or basic slices (``x[:, a:b]``, as Dynamo records them): adjacent
ranges of one source along the cat's dim form a run just like consecutive split outputs.

WHY: models split a tensor, work on some pieces and glue the untouched ones back; after other
rewrites the glue often reads the split directly. The cat copies what the input already holds:
the full round trip is the input itself, a cat of a contiguous run is a view of it (no copy).
Inside a cat that also has other inputs, a run of k pieces becomes one input (a narrow view):
that saves little (a shorter input list) and costs a view dispatch, so it is rated by the cost
model and fires only for long runs or when the split itself dies. A split piece with other users
keeps the split (only the cat changes). Declines when dims differ, the order is permuted or has
gaps, or a node involved is mutated or effectful (ordered). Where the result would hand the caller
memory it already holds (a model input, a parameter, another output), or a strided source whose
layout a consumer observes, a whole round trip or run becomes one contiguous clone instead (see
``_round_trip``).
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
from optimus.rules.splitcat.pricing import VIEW, copy_cost, views
from optimus.semantics.freshness import breaks_freshness
from optimus.semantics.layouts import built_meta, layout_safe
from optimus.semantics.views import (
    ListView,
    all_movable,
    cat_view,
    only_used_by,
    piece_of,
    split_view,
    tuple_dies_with,
)

Run = tuple[int, int, fx.Node, int, int, int]  # (first input, end, source, dim, start, length)


def _runs(cat: ListView, ctx: RewriteContext) -> list[Run]:
    """Maximal runs (two or more cat inputs) of adjacent pieces of one source along the cat's
    dim, in order: pieces are split getitems, narrows or basic slices (see ``piece_of``)."""
    pieces = [piece_of(t, ctx) for t in cat.tensors]
    out: list[Run] = []
    k = 0
    while k < len(pieces):
        first = pieces[k]
        if first is None or first.dim != cat.dim:
            k += 1
            continue
        end, stop = k + 1, first.start + first.length
        while end < len(pieces):
            nxt = pieces[end]
            if nxt is None or nxt.source is not first.source or nxt.dim != first.dim or nxt.start != stop:
                break
            stop += nxt.length
            end += 1
        if end - k >= 2:
            out.append((k, end, first.source, first.dim, first.start, stop - first.start))
        k = end
    return out


def _dying_views(cat: ListView, runs: list[Run], ctx: RewriteContext) -> int:
    """How many view nodes (splits, narrows, slices) die when the runs stop reading them."""
    holders = {}
    for start, end, *_ in runs:
        for t in cat.tensors[start:end]:
            piece = piece_of(t, ctx)
            assert piece is not None
            holders[piece.holder] = piece.holder is piece.node
    node = cat.node
    return sum(
        1 for h, own in holders.items() if (only_used_by(h, [node]) if own else tuple_dies_with(h, [node]))
    )


def _fresh(y: torch.Tensor) -> torch.Tensor:
    """What a cat of pieces of ``y`` returns: new contiguous storage with ``y``'s values."""
    return y.clone(memory_format=torch.contiguous_format)


def _copy(node: fx.Node, ctx: RewriteContext) -> Cost:
    """One plain copy of ``node``'s result (what the clone costs)."""
    return copy_cost(node, ctx, 0)


def _round_trip(node: fx.Node, source: fx.Node, before: Cost, ctx: RewriteContext) -> Found | None:
    """``cat`` of every piece of ``source`` in order: ``source`` itself where handing it back is
    unobservable; otherwise one fresh contiguous copy of it (``clone``), which is what the caller
    saw from eager: new storage, contiguous, the same values and autograd, for one copy instead of
    split views plus a multi-input cat. WHY not decline: a declined ``cat(split(x.view(..)))``
    reaches Inductor, whose post-grad ``splitwithsizes_cat_replace`` pattern returns ``x``'s view
    itself (torch 2.13), so under ``backend="optimus"`` the caller would get its input back; a
    ``clone`` survives Inductor (its no-op removal keeps clones of inputs that are outputs)."""
    if not breaks_freshness([(node, source)], ctx) and layout_safe(node, source, ctx):
        return Found((node,), before, Cost(), ("input", source))
    if not layout_safe(node, built_meta(_fresh, source), ctx):
        return None
    return Found((node,), before, _copy(node, ctx), ("fresh", source))


class SplitCat(NodeSetRule):
    name = "split_cat"
    anchors = frozenset({"cat"})

    def find(self, node: fx.Node, ctx: RewriteContext) -> Found | None:
        cat = cat_view(node, ctx)
        if cat is None:
            return None
        if cat.whole is not None:
            split = split_view(cat.whole, ctx)
            if split is None or split.dim != cat.dim or not all_movable([cat.whole], ctx):
                return None
            before = copy_cost(node, ctx, len(split.sizes))
            if tuple_dies_with(cat.whole, [node]):
                before = before + VIEW
            return _round_trip(node, split.input, before, ctx)
        runs = _runs(cat, ctx)
        if not runs:
            return None
        holders = [p.holder for t in cat.tensors if (p := piece_of(t, ctx)) is not None]
        if not all_movable([*cat.tensors, *holders, *(r[2] for r in runs)], ctx):
            return None
        before = copy_cost(node, ctx) + views(_dying_views(cat, runs, ctx))
        if len(runs) == 1 and runs[0][:2] == (0, len(cat.tensors)):  # the whole cat is one run
            _, _, source, dim, start, length = runs[0]
            meta = ctx.meta(source)
            full = meta is not None and start == 0 and length == meta.shape[dim]
            if full:
                return _round_trip(node, source, before, ctx)
            built = built_meta(lambda y: y.narrow(dim, start, length), source)
            if breaks_freshness([(node, source)], ctx) or not layout_safe(node, built, ctx):
                fresh = built_meta(lambda y: _fresh(y.narrow(dim, start, length)), source)
                if not layout_safe(node, fresh, ctx):
                    return None
                return Found(
                    (node,), before, VIEW + _copy(node, ctx), ("fresh_narrow", (source, dim, start, length))
                )
            return Found((node,), before, VIEW, ("narrow", (source, dim, start, length)))
        # runs inside a longer cat: each becomes one narrow view
        new_inputs: list[Any] = []
        pos = 0
        for start_k, end_k, source, dim, start, length in runs:
            new_inputs.extend(cat.tensors[pos:start_k])
            new_inputs.append((source, dim, start, length))
            pos = end_k
        new_inputs.extend(cat.tensors[pos:])
        after = copy_cost(node, ctx, len(new_inputs)) + views(len(runs))
        return Found((node,), before, after, ("cat", new_inputs, cat.dim))

    def build(self, members: Sequence[fx.Node], data: Any, b: Builder) -> Sequence[fx.Node]:
        if data[0] == "input":
            return [data[1]]
        if data[0] == "narrow":
            return [b.call(torch.narrow, *data[1])]
        if data[0] == "fresh":
            return [b.call(torch.clone, data[1], memory_format=torch.contiguous_format)]
        if data[0] == "fresh_narrow":
            view = b.call(torch.narrow, *data[1])
            return [b.call(torch.clone, view, memory_format=torch.contiguous_format)]
        _, inputs, dim = data
        made = [v if isinstance(v, fx.Node) else b.call(torch.narrow, *v) for v in inputs]
        return [b.call(torch.cat, made, dim=dim)]
