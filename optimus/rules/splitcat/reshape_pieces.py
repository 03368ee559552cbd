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

from optimus.engine.builder import Builder
from optimus.engine.context import RewriteContext
from optimus.engine.node_set_rule import Found, NodeSetRule
from optimus.engine.rule import Cost
from optimus.rules.splitcat.piece_runs import Run, dying_holders, piece_runs, runs_of
from optimus.rules.splitcat.pricing import VIEW, copy_cost, views
from optimus.semantics.layouts import built_meta, fresh_meta, layout_safe, same_dtypes, views_as
from optimus.semantics.views import (
    CALLS,
    ListView,
    adjacent_pieces,
    all_movable,
    cat_view,
    only_used_by,
    piece_of,
    stack_view,
    tuple_dies_with,
)

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
        pieces = None if any(src is None for src in sources) else adjacent_pieces(sources, ctx)
        if pieces is None:
            return self._runs_inside(node, view, ctx)
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
            viewable = views_as(ctx.meta(src), shape)
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
        viewable = views_as(moved, (n, *shape))
        if viewable is None:
            return None
        after = views(1 + int(partial) + int(d != 0) + int(e != 0) + int(view.op == "cat")) + copy
        after = after + (VIEW if viewable else copy)
        return Found((node,), before, after, (first.source, d, e, s, n, k, partial, shape, view.op))

    def _runs_inside(self, node: fx.Node, view: ListView, ctx: RewriteContext) -> Found | None:
        """stack([a, *reshaped run, b], e) -> cat([a.unsqueeze(e), the run's one reshape moved to e,
        b.unsqueeze(e)], e); a cat the same with the run flattened at e and the others as they are.
        The cat is fresh contiguous storage, like the stack or cat it replaces."""
        e, op = view.dim, view.op
        parts = piece_runs(view.tensors, ctx, lambda t: piece_of(_reshaped(t, ctx), ctx))
        runs = runs_of(parts)
        if not runs:
            return None
        reshapes = [view.tensors[r.first + i] for r in runs for i in range(r.n)]
        pieced = [p.node for r in runs for p in r.pieces]
        held = [*(p.holder for r in runs for p in r.pieces), *(r.pieces[0].source for r in runs)]
        if not all_movable([*view.tensors, *pieced, *held], ctx) or not layout_safe(
            node, fresh_meta(node), ctx
        ):
            return None
        dying = [r for r in reshapes if only_used_by(r, [node])]
        before = copy_cost(node, ctx) + views(dying_holders(runs, dying))
        for r in dying:  # a reshape that dies: a view, or a copy where its piece is not viewable so
            viewable = views_as(ctx.meta(_reshaped(r, ctx)), _shape(r, ctx))
            if viewable is None:
                return None
            before = before + (VIEW if viewable else _copy_of(r, ctx))
        copy = Cost(launches=1.0, bytes=copy_cost(node, ctx).bytes)
        after = copy_cost(node, ctx, inputs=len(parts)) + views(
            len(parts) - len(runs) if op == "stack" else 0
        )
        inputs: list[fx.Node | tuple[Any, ...]] = []
        for part in parts:
            if not isinstance(part, Run):
                inputs.append(part)
                continue
            first, n, shape = part.pieces[0], part.n, _shape(view.tensors[part.first], ctx)
            x, d, s, k = first.source, first.dim, first.start, first.length
            meta = ctx.meta(x)
            assert meta is not None
            partial = s != 0 or n * k != meta.shape[d]
            moved = built_meta(lambda y, d=d, s=s, n=n, k=k, p=partial: _moved(y, d, s, n, k, p), x)
            viewable = views_as(moved, (n, *shape))
            if viewable is None:
                return None
            # narrow (part of the dim), unflatten, movedim (d != 0), movedim (e != 0): views; the
            # reshape a view or a copy; a cat's flatten a copy of its own on eager
            after = after + views(1 + int(partial) + int(d != 0) + int(e != 0)) + (VIEW if viewable else copy)
            if op == "cat":
                run = built_meta(
                    lambda y, d=d, s=s, n=n, k=k, p=partial, S=shape: (
                        _moved(y, d, s, n, k, p).reshape(n, *S).movedim(0, e)
                    ),
                    x,
                )
                flat = views_as(run, (*shape[:e], n * shape[e], *shape[e + 1 :]))
                if flat is None:
                    return None
                after = after + VIEW + (copy if not flat and not ctx.inductor else Cost())
            inputs.append((x, d, e, s, n, k, partial, shape))
        return Found((node,), before, after, ("mixed", tuple(inputs), e, op))

    def build(self, members: Sequence[fx.Node], data: Any, b: Builder) -> Sequence[fx.Node]:
        if data[0] == "mixed":
            _, inputs, e, op = data
            made = []
            for v in inputs:
                if isinstance(v, fx.Node):
                    made.append(b.method("unsqueeze", v, e) if op == "stack" else v)
                    continue
                run = _moved_reshape(b, *v)
                made.append(b.call(torch.flatten, run, e, e + 1) if op == "cat" else run)
            return [b.call(torch.cat, made, e)]
        x, d, e, s, n, k, partial, shape, op = data
        x = b.call(
            torch.clone,
            _moved_reshape(b, x, d, e, s, n, k, partial, shape),
            memory_format=torch.contiguous_format,
        )
        return [b.call(torch.flatten, x, e, e + 1) if op == "cat" else x]


def _moved_reshape(
    b: Builder, x: fx.Node, d: int, e: int, s: int, n: int, k: int, partial: bool, shape: tuple[int, ...]
) -> fx.Node:
    """The run of pieces, each reshaped to ``shape``, stacked at ``e`` (a view where it can be)."""
    if partial:
        x = b.call(torch.narrow, x, d, s, n * k)
    x = b.call(torch.unflatten, x, d, (n, k))
    if d != 0:
        x = b.call(torch.movedim, x, d, 0)
    x = b.call(torch.reshape, x, (n, *shape))
    if e != 0:
        x = b.call(torch.movedim, x, 0, e)
    return x


def _shape(node: fx.Node, ctx: RewriteContext) -> tuple[int, ...]:
    meta = ctx.meta(node)
    assert meta is not None
    return tuple(meta.shape)


def _copy_of(node: fx.Node, ctx: RewriteContext) -> Cost:
    """A reshape that copies ``node`` (one launch, its bytes read and written)."""
    meta = ctx.meta(node)
    return Cost(
        launches=1.0, bytes=0.0 if meta is None else 2.0 * math.prod(meta.shape) * meta.dtype.itemsize
    )


__all__ = ["ReshapePieces"]
