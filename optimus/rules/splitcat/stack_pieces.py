"""stack_pieces: stack([x[.., s:s+L, ..], x[.., s+L:s+2L, ..], ...], e) (n adjacent equal pieces of one x
along d: split outputs, narrows or slices) -> x.narrow(d, s, n*L).unflatten(d, (n, L)).movedim(d, e)
.contiguous() (no narrow when the pieces cover x, no movedim when d == e).

WHY: horizontal fusion stacks the per-tower inputs it batches; when those are the pieces of one
split input (``torch.split(x, w, 1)`` feeding n towers), the stack copies them one by one into a
new [n, ..] tensor. The same tensor is a reshape of x: one copy (``contiguous``; none when the
layout already matches), and the split or the n narrows go away. Declines for unequal, permuted,
repeated or non-adjacent pieces and mutated/effectful nodes.

A run of two or more such pieces among other tensors (``stack([a, *split(x, 2, 1), b], e)``,
Inductor's ``split_stack_to_cats``) -> ``cat([a.unsqueeze(e), <the run's view>, b.unsqueeze(e)], e)``:
the run is one view input and the other inputs stay. The cat is fresh contiguous storage like the
stack. Priced: a short run saves a few cat inputs but costs an unsqueeze per other input and the
run's views, so the cost model declines it there (``report.declined``); long runs pay.
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
from optimus.semantics.freshness import breaks_freshness
from optimus.semantics.layouts import built_meta
from optimus.semantics.views import (
    adjacent_pieces,
    all_movable,
    only_used_by,
    piece_of,
    stack_view,
    tuple_dies_with,
)


class StackPieces(NodeSetRule):
    name = "stack_pieces"
    anchors = frozenset({"stack"})

    def find(self, node: fx.Node, ctx: RewriteContext) -> Found | None:
        stack = stack_view(node, ctx)
        if stack is None or len(stack.tensors) < 2:
            return None
        pieces = adjacent_pieces(stack.tensors, ctx)
        if pieces is None:
            return self._runs_inside(node, stack.tensors, stack.dim, ctx)
        first = pieces[0]
        holders = {p.holder: p.holder is p.node for p in pieces}
        if not all_movable([first.source, *stack.tensors, *holders], ctx):
            return None
        meta = ctx.meta(first.source)
        assert meta is not None
        n, d, e = len(pieces), first.dim, stack.dim
        partial = first.start != 0 or n * first.length != meta.shape[d]
        dying = sum(
            1
            for h, own in holders.items()
            if (only_used_by(h, [node]) if own else tuple_dies_with(h, [node]))
        )
        before = copy_cost(node, ctx) + views(dying)
        copy = Cost(launches=1.0, bytes=copy_cost(node, ctx).bytes)
        s, k = first.start, first.length
        view = built_meta(lambda y: _view(y, d, e, s, n, k, partial), first.source)
        # contiguous() hands back the view itself when it is already contiguous (a leading-dim range
        # of a contiguous tensor): no copy, but then the result shares memory with the source, which
        # the caller may see (see _freshness): a clone keeps the stack's fresh storage there
        in_place = view is None or view.is_contiguous is not False
        fresh = in_place and breaks_freshness([(node, first.source)], ctx)
        after = views(1 + int(partial) + int(d != e)) + (VIEW if in_place and not fresh else copy)
        return Found((node,), before, after, (first.source, d, e, s, n, k, partial, fresh))

    def _runs_inside(
        self, node: fx.Node, tensors: Sequence[fx.Node], e: int, ctx: RewriteContext
    ) -> Found | None:
        """stack([a, *run, b], e) -> cat([a.unsqueeze(e), run as one view, b.unsqueeze(e)], e)."""
        found = movable_runs(node, tensors, ctx, lambda t: piece_of(t, ctx))
        if found is None:
            return None
        parts, runs, before = found
        # an unsqueeze per other input; per run: narrow (part of its dim), unflatten, movedim (d != e)
        n_views = (
            len(parts) - len(runs) + sum(1 + int(_partial(r, ctx)) + int(r.pieces[0].dim != e) for r in runs)
        )
        after = copy_cost(node, ctx, inputs=len(parts)) + views(n_views)
        inputs = tuple(p if not isinstance(p, Run) else _run_data(p, e, ctx) for p in parts)
        return Found((node,), before, after, ("mixed", inputs, e))

    def build(self, members: Sequence[fx.Node], data: Any, b: Builder) -> Sequence[fx.Node]:
        if data[0] == "mixed":
            _, inputs, e = data
            made = []
            for v in inputs:
                if isinstance(v, fx.Node):
                    made.append(b.method("unsqueeze", v, e))
                    continue
                x, d, _, start, n, length, partial = v
                made.append(_built(x, d, e, start, n, length, partial, b))
            return [b.call(torch.cat, made, e)]
        x, d, e, start, n, length, partial, fresh = data
        if fresh:
            x = b.call(
                torch.clone,
                _built(x, d, e, start, n, length, partial, b),
                memory_format=torch.contiguous_format,
            )
            return [x]
        return [b.method("contiguous", _built(x, d, e, start, n, length, partial, b))]


def _partial(run: Run, ctx: RewriteContext) -> bool:
    """The run covers only part of its source's dim (a narrow first)."""
    first = run.pieces[0]
    meta = ctx.meta(first.source)
    return meta is None or first.start != 0 or run.n * first.length != meta.shape[first.dim]


def _run_data(run: Run, e: int, ctx: RewriteContext) -> tuple[Any, ...]:
    """(x, d, e, start, n, length, partial): what ``_built`` needs to build the run."""
    first = run.pieces[0]
    return (first.source, first.dim, e, first.start, run.n, first.length, _partial(run, ctx))


def _view(y: torch.Tensor, d: int, e: int, start: int, n: int, length: int, partial: bool) -> torch.Tensor:
    """The stack as a view of the source (what ``_built`` builds, on a tensor)."""
    if partial:
        y = y.narrow(d, start, n * length)
    y = y.unflatten(d, (n, length))
    return y.movedim(d, e) if d != e else y


def _built(x: fx.Node, d: int, e: int, start: int, n: int, length: int, partial: bool, b: Builder) -> fx.Node:
    if partial:
        x = b.call(torch.narrow, x, d, start, n * length)
    x = b.call(torch.unflatten, x, d, (n, length))
    if d != e:
        x = b.call(torch.movedim, x, d, e)
    return x
