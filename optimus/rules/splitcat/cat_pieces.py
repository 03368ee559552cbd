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

A run of two or more such pieces among other tensors (``cat([a, *split(x, 2, 1), b], 2)``) ->
``cat([a, x(.narrow).unflatten(d, (n, L)).movedim(d, e).flatten(e, e + 1), b], e)``: the run is one
input, the others stay, and the cat is fresh storage as before. On eager the flatten is a copy of
the run of its own (the moved view is not flat) besides the cat's, so the cost model declines it
there (``report.declined``); priced for Inductor (``inductor=True``) the flatten is written
straight into the cat's output, and a run that saves inputs pays.
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
from optimus.rules.splitcat.piece_runs import Run, movable_runs
from optimus.rules.splitcat.pricing import VIEW, copy_cost, views
from optimus.semantics.layouts import built_meta, layout_safe, same_dtypes, views_as
from optimus.semantics.views import (
    Piece,
    adjacent_pieces,
    all_movable,
    cat_view,
    only_used_by,
    piece_of,
    tuple_dies_with,
)


def _moved(y: torch.Tensor, d: int, e: int, start: int, n: int, length: int, partial: bool) -> torch.Tensor:
    y = _unflat(y, d, e, start, n, length, partial)
    return torch.clone(y, memory_format=torch.contiguous_format).flatten(e, e + 1)


class CatPieces(NodeSetRule):
    name = "cat_pieces"
    anchors = frozenset({"cat"})

    def find(self, node: fx.Node, ctx: RewriteContext) -> Found | None:
        cat = cat_view(node, ctx)
        if cat is None or len(cat.tensors) < 2:
            return None
        pieces = adjacent_pieces(cat.tensors, ctx)
        if pieces is None:
            return self._runs_inside(node, cat.tensors, cat.dim, ctx)
        if pieces[0].dim == cat.dim:
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

    def _runs_inside(
        self, node: fx.Node, tensors: Sequence[fx.Node], e: int, ctx: RewriteContext
    ) -> Found | None:
        """cat([a, *run, b], e) with the run's pieces along d != e -> cat([a, the run flattened, b], e)."""

        def other_dim(t: fx.Node) -> Piece | None:
            p = piece_of(t, ctx)
            return p if p is not None and p.dim != e else None  # same dim: split_cat's

        found = movable_runs(node, tensors, ctx, other_dim)
        if found is None:
            return None
        parts, _, before = found
        after = copy_cost(node, ctx, inputs=len(parts))
        inputs: list[fx.Node | tuple[Any, ...]] = []
        for part in parts:
            if not isinstance(part, Run):
                inputs.append(part)
                continue
            first = part.pieces[0]
            x, d, s, n, k = first.source, first.dim, first.start, part.n, first.length
            meta = ctx.meta(x)
            assert meta is not None
            partial = s != 0 or n * k != meta.shape[d]
            moved = built_meta(lambda y, d=d, s=s, n=n, k=k, p=partial: _unflat(y, d, e, s, n, k, p), x)
            out = ctx.meta(part.pieces[0].node)
            assert out is not None
            flat = views_as(moved, (*out.shape[:e], n * out.shape[e], *out.shape[e + 1 :]))
            if flat is None:
                return None
            # narrow (part of the dim), unflatten, movedim, flatten: views; the flatten copies the
            # run once more where the moved view is not flat, on eager (Inductor writes it into the cat)
            after = after + views(2 + int(partial)) + VIEW
            if not flat and not ctx.inductor:
                after = after + Cost(launches=1.0, bytes=2.0 * out.nbytes * n)
            inputs.append((x, d, e, s, n, k, partial))
        return Found((node,), before, after, ("mixed", tuple(inputs), e))

    def build(self, members: Sequence[fx.Node], data: Any, b: Builder) -> Sequence[fx.Node]:
        if data[0] == "mixed":
            _, inputs, e = data
            made = []
            for v in inputs:
                if isinstance(v, fx.Node):
                    made.append(v)
                    continue
                x, d, _, s, n, k, partial = v
                made.append(_flat_run(x, d, e, s, n, k, partial, b))
            return [b.call(torch.cat, made, e)]
        x, d, e, start, n, length, partial = data
        if partial:
            x = b.call(torch.narrow, x, d, start, n * length)
        x = b.call(torch.movedim, b.call(torch.unflatten, x, d, (n, length)), d, e)
        x = b.call(torch.clone, x, memory_format=torch.contiguous_format)
        return [b.call(torch.flatten, x, e, e + 1)]


def _unflat(y: torch.Tensor, d: int, e: int, s: int, n: int, k: int, partial: bool) -> torch.Tensor:
    """A run of pieces as [.., n, piece extent along e, ..] at e (a view of the source)."""
    if partial:
        y = y.narrow(d, s, n * k)
    return y.unflatten(d, (n, k)).movedim(d, e)


def _flat_run(x: fx.Node, d: int, e: int, s: int, n: int, k: int, partial: bool, b: Builder) -> fx.Node:
    """The run as one cat input: what ``torch.cat(pieces, e)`` would have put there."""
    if partial:
        x = b.call(torch.narrow, x, d, s, n * k)
    x = b.call(torch.movedim, b.call(torch.unflatten, x, d, (n, k)), d, e)
    return b.call(torch.flatten, x, e, e + 1)


__all__ = ["CatPieces"]
