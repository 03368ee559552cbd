"""reshape_pieces: stack([p_0.reshape(S), .., p_{n-1}.reshape(S)], e) with p_k the n adjacent equal
pieces of one x along d (split outputs, narrows or slices) -> clone(x(.narrow(d, s, n*L))
.unflatten(d, (n, L)).movedim(d, 0).reshape(n, *S).movedim(0, e), contiguous); the same with a
cat along e -> that clone's ``.flatten(e, e + 1)``. ``reshape``, ``view`` and ``flatten`` of a
piece count as reshapes (the target shape is read from the recorded shapes, so ``-1`` and
``flatten``'s dims need no reading); every piece must get the same one.

WHY: Inductor's pre-grad ``move_reshape_out_of_split_stack`` pass: a model splits x, reshapes each
piece the same way and stacks them (per-head or per-field reshapes); the reshapes hide the pieces
from ``stack_pieces``, so the split, n reshapes (copies where a piece is not viewable as S) and
an n-input stack stay. A row-major reshape of [n, *P] to [n, *S] reshapes each leading slice on
its own, so one reshape of the moved source gives every piece's reshape at once, and one clone
gives the stack's values in its fresh contiguous storage (a clone, never ``.contiguous()``:
that could hand back a view of x). Priced: the moved reshape is a copy of its own where the
moved view cannot be viewed as [n, *S] (then two copies against the stack's one plus the
pieces'), and a short stack whose reshapes stay alive for other readers saves less than the
views cost, so the cost model declines those (``report.declined``). Declines for unequal,
permuted, repeated or non-adjacent pieces, different reshapes, mutated/effectful nodes and a
stack/cat that promotes dtypes.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

import torch
from torch import fx

from ..builder import Builder
from ..context import RewriteContext
from ..meta import TensorMeta
from ._node_set_rule import Found, NodeSetRule
from ._split_cat_cost import VIEW, copy_cost, views
from ._split_cat_layout import built_meta, layout_safe, same_dtypes
from ._split_cat_util import (
    CALLS,
    ListView,
    adjacent_pieces,
    all_movable,
    cat_view,
    only_used_by,
    stack_view,
    tuple_dies_with,
)
from .base import Cost

_RESHAPES = frozenset({"reshape", "view", "flatten"})


def _reshaped(node: Any, ctx: RewriteContext) -> fx.Node | None:
    """The piece ``node`` reshapes (``p.reshape(S)``, ``p.view(S)``, ``torch.flatten(p, ..)``),
    with the same dtype and number of elements, else None."""
    if not isinstance(node, fx.Node) or node.op not in CALLS:
        return None
    canon = ctx.canon(node)
    if canon is None or canon.op not in _RESHAPES or canon.inplace:
        return None
    src = canon["input"]
    if not isinstance(src, fx.Node):
        return None
    out, inp = ctx.meta(node), ctx.meta(src)
    if out is None or inp is None or out.dtype != inp.dtype or out.numel != inp.numel:
        return None  # x.view(dtype) and the like: not a reshape
    return src


def _views_as(meta: TensorMeta | None, shape: tuple[int, ...]) -> bool | None:
    """Can a tensor laid out as ``meta`` be viewed as ``shape`` (reshape without a copy)?"""
    if meta is None or meta.stride is None:
        return None
    t = torch.empty_strided(meta.shape, meta.stride, dtype=meta.dtype, device="meta")
    try:
        t.view(shape)
    except RuntimeError:
        return False
    return True


def _moved(y: torch.Tensor, d: int, s: int, n: int, k: int, partial: bool) -> torch.Tensor:
    """[n, *piece shape]: piece i of the split at index i (a view of the source)."""
    if partial:
        y = y.narrow(d, s, n * k)
    return y.unflatten(d, (n, k)).movedim(d, 0)


def _result(
    y: torch.Tensor, d: int, e: int, s: int, n: int, k: int, partial: bool, shape: tuple[int, ...], op: str
) -> torch.Tensor:
    y = _moved(y, d, s, n, k, partial).reshape(n, *shape).movedim(0, e)
    y = torch.clone(y, memory_format=torch.contiguous_format)
    return y.flatten(e, e + 1) if op == "cat" else y


class ReshapePieces(NodeSetRule):
    name = "reshape_pieces"
    anchors = frozenset({"stack", "cat"})

    def find(self, node: fx.Node, ctx: RewriteContext) -> Found | None:
        view: ListView | None = stack_view(node, ctx) or cat_view(node, ctx)
        if view is None or len(view.tensors) < 2:
            return None
        sources = [_reshaped(t, ctx) for t in view.tensors]
        if any(src is None for src in sources):
            return None
        pieces = adjacent_pieces(sources, ctx)
        if pieces is None:
            return None
        first = pieces[0]
        metas = [ctx.meta(t) for t in view.tensors]
        shapes = {m.shape for m in metas if m is not None}
        if None in metas or len(shapes) != 1:
            return None  # each piece reshaped differently
        (shape,) = shapes
        if view.op == "cat" and not shape:
            return None  # cat of 0-d tensors raises in eager
        holders = {p.holder: p.holder is p.node for p in pieces}
        reshapes = list(view.tensors)
        pieced = [s for s in sources if s is not None]
        if not all_movable([first.source, *reshapes, *pieced, *holders], ctx):
            return None
        if not same_dtypes(view.tensors, first.source, ctx):
            return None
        meta = ctx.meta(first.source)
        assert meta is not None
        n, d, e, s, k = len(pieces), first.dim, view.dim, first.start, first.length
        partial = s != 0 or n * k != meta.shape[d]
        result = built_meta(lambda y: _result(y, d, e, s, n, k, partial, shape, view.op), first.source)
        out = ctx.meta(node)
        if result is None or out is None or result.shape != out.shape or not layout_safe(node, result, ctx):
            return None
        # before: the stack/cat, each reshape that dies with it (a view, or a copy where the piece
        # cannot be viewed as S), each split/narrow that dies with them
        copy = Cost(launches=1.0, bytes=copy_cost(node, ctx).bytes)
        before = copy_cost(node, ctx)
        for r, src in zip(reshapes, pieced, strict=True):
            if not only_used_by(r, [node]):
                continue
            viewable = _views_as(ctx.meta(src), shape)
            if viewable is None:
                return None
            before = before + (VIEW if viewable else _copy_of(src, ctx))
        dying = {
            h
            for h, own in holders.items()
            if all(only_used_by(r, [node]) for r in reshapes)
            and (only_used_by(h, reshapes) if own else tuple_dies_with(h, reshapes))
        }
        before = before + views(sum(1 for p in pieces if p.holder in dying))
        # after: narrow, unflatten, movedim (d != 0), reshape (a view, or one copy), movedim
        # (e != 0), the clone, the cat's flatten
        moved = built_meta(lambda y: _moved(y, d, s, n, k, partial), first.source)
        viewable = _views_as(moved, (n, *shape))
        if viewable is None:
            return None
        after = views(1 + int(partial) + int(d != 0) + int(e != 0) + int(view.op == "cat")) + copy
        after = after + (VIEW if viewable else copy)
        return Found((node,), before, after, (first.source, d, e, s, n, k, partial, shape, view.op))

    def build(self, members: Sequence[fx.Node], data: Any, b: Builder) -> Sequence[fx.Node]:
        x, d, e, s, n, k, partial, shape, op = data
        if partial:
            x = b.call(torch.narrow, x, d, s, n * k)
        x = b.call(torch.unflatten, x, d, (n, k))
        if d != 0:
            x = b.call(torch.movedim, x, d, 0)
        x = b.call(torch.reshape, x, (n, *shape))
        if e != 0:
            x = b.call(torch.movedim, x, 0, e)
        x = b.call(torch.clone, x, memory_format=torch.contiguous_format)
        return [b.call(torch.flatten, x, e, e + 1) if op == "cat" else x]


def _copy_of(node: fx.Node, ctx: RewriteContext) -> Cost:
    """A reshape that copies ``node`` (one launch, its bytes read and written)."""
    meta = ctx.meta(node)
    return Cost(
        launches=1.0, bytes=0.0 if meta is None else 2.0 * math.prod(meta.shape) * meta.dtype.itemsize
    )


__all__ = ["ReshapePieces"]
