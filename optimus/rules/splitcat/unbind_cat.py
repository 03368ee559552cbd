"""unbind_cat: cat(unbind(y, u)[i..j], c) -> y.narrow(u, i, n).movedim(u, c).flatten(c, c + 1), when
the cat's inputs are consecutive unbind outputs in order (n = j - i + 1; no narrow when all).

WHY: a horizontally fused op returns ``unbind(batched)`` and a model that concatenates the
per-tower results (``torch.cat(outs, 1)``) then copies n slices one by one. Moving the batch dim
next to the cat dim and flattening the two is the same layout in one copy (or none, when the
unbind dim already sits at the cat position), and the unbind and n getitems go away. Declines
for permuted, repeated or gapped pieces, a tuple used other than through getitems with the cat
reading pieces of it out of order, and mutated/effectful nodes. Where the flatten could hand
back a view of y that the caller can see (y is a model input, a parameter or another output),
the moved view is cloned contiguous first and flattened (one copy, fresh storage; priced).
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
from optimus.semantics.layouts import built_meta, fresh_meta, layout_safe
from optimus.semantics.views import all_movable, cat_view, split_runs, tuple_dies_with, unbind_run


class UnbindCat(NodeSetRule):
    name = "unbind_cat"
    anchors = frozenset({"cat"})

    def find(self, node: fx.Node, ctx: RewriteContext) -> Found | None:
        cat = cat_view(node, ctx)
        if cat is None or cat.whole is not None or len(cat.tensors) < 2:
            return None
        run = unbind_run(cat.tensors, ctx)
        if run is None:
            return self._runs_inside(node, cat, ctx)
        source, unbind, indices = run
        first = indices[0]
        u, c, n = unbind.dim, cat.dim, len(indices)
        if not all_movable([source, unbind.input, *cat.tensors], ctx):
            return None
        partial = len(indices) != unbind.count
        before = copy_cost(node, ctx)
        if tuple_dies_with(source, [node]):
            before = before + VIEW
        built = built_meta(
            lambda y: torch.flatten(torch.movedim(y.narrow(u, first, n), u, c), c, c + 1), unbind.input
        )
        if not breaks_freshness([(node, unbind.input)], ctx) and layout_safe(node, built, ctx):
            # narrow (partial) + movedim (u != c) are views; flatten copies unless the layout allows a view
            after = views(int(partial) + int(u != c)) + (
                Cost(launches=1.0, bytes=copy_cost(node, ctx).bytes) if u != c or partial else VIEW
            )
            return Found((node,), before, after, (unbind.input, u, c, first, n, partial, False))
        # The result may be a view of y (a model input, a parameter, another output) or have a
        # layout a consumer observes: copy the moved view once into fresh contiguous storage (what
        # the cat returned) and flatten that (a view of the fresh copy).
        fresh = built_meta(
            lambda y: torch.flatten(
                torch.clone(
                    torch.movedim(y.narrow(u, first, n), u, c), memory_format=torch.contiguous_format
                ),
                c,
                c + 1,
            ),
            unbind.input,
        )
        if not layout_safe(node, fresh, ctx):
            return None
        after = views(int(partial) + int(u != c) + 1) + Cost(launches=1.0, bytes=copy_cost(node, ctx).bytes)
        return Found((node,), before, after, (unbind.input, u, c, first, n, partial, True))

    def _runs_inside(self, node: fx.Node, cat: Any, ctx: RewriteContext) -> Found | None:
        """cat([a, *unbind(Y, u)[i..j], b, ..], c) -> cat([a, Y.narrow(u, i, n).movedim(u, c)
        .flatten(c, c + 1), b, ..], c): each run of two or more consecutive pieces becomes one input.
        Why: MMoE's per-feature adapters (fused into groups of up to 128) are concatenated with the
        dense features; a cat of 386 pieces is 386 inputs forward and 386 slices in its backward.
        Eager declines it on CPU (the flatten is one more copy); under Inductor it is free."""
        tensors = cat.tensors
        parts = split_runs(tensors, ctx)
        runs = [p for p in parts if p[0] == "run"]
        if not runs or len(parts) == 1:
            return None
        if not all_movable([*tensors, *(p[6] for p in runs)], ctx) or not layout_safe(
            node, fresh_meta(node), ctx
        ):
            return None
        c = cat.dim
        # Under Inductor the flatten is written straight into the cat's output (no copy of its
        # own), and each cat input is one more loop nest of C++ to generate and compile: dcn
        # medium's 121-input cat was a 4,295-line kernel.
        inductor = ctx.inductor
        before = copy_cost(node, ctx)
        after = copy_cost(node, ctx, inputs=len(parts))
        for p in runs:
            _, y, u, _, n, count, source = p
            if tuple_dies_with(source, [node]):
                before = before + VIEW
            after = after + views(int(n != count) + int(u != c))
            y_meta = ctx.meta(y)
            if (u != c or n != count) and not inductor:  # eager: the flatten copies this run once more
                run_bytes = 0.0 if y_meta is None else 2.0 * y_meta.nbytes * n / max(count, 1)
                after = after + Cost(launches=1.0, bytes=run_bytes)
        return Found((node,), before, after, ("mixed", tuple(parts), c))

    def build(self, members: Sequence[fx.Node], data: Any, b: Builder) -> Sequence[fx.Node]:
        if data[0] == "mixed":
            _, parts, c = data
            inputs = []
            for p in parts:
                if p[0] == "one":
                    inputs.append(p[1])
                    continue
                _, y, u, start, n, count, _ = p
                if n != count:
                    y = b.call(torch.narrow, y, u, start, n)
                if u != c:
                    y = b.call(torch.movedim, y, u, c)
                inputs.append(b.call(torch.flatten, y, c, c + 1))
            return [b.call(torch.cat, inputs, c)]
        y, u, c, first, count, partial, fresh = data
        if partial:
            y = b.call(torch.narrow, y, u, first, count)
        if u != c:
            y = b.call(torch.movedim, y, u, c)
        if fresh:
            y = b.call(torch.clone, y, memory_format=torch.contiguous_format)
        return [b.call(torch.flatten, y, c, c + 1)]
