"""stack_unbind: unbind(stack(xs, d), d)[i] -> xs[i], and stack(unbind(x, d)[i..j], d) -> x (all
pieces) or x.narrow(d, i, j - i + 1) (a run), when both use the same dim and the order matches;
stack(unbind(x, u)[i..j], e) with u != e -> a contiguous clone of x(.narrow).movedim(u, e). Where
x (or its narrow view) would be observable as the result (x is a model input, a parameter or
another output; or a consumer sees the layout), the same-dim form is a contiguous clone too.

WHY: horizontal fusion stacks inputs and unbinds outputs; chained fused ops (or a model that
stacks and later iterates) produce these round trips. The stack copy and the unbind dispatch go
away. Declines when pieces are permuted, repeated or with gaps, the unbind's tuple
is used other than through getitems, or nodes are mutated/effectful.
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
from optimus.semantics.layouts import built_meta, fresh_meta, layout_safe, same_dtypes
from optimus.semantics.views import (
    all_movable,
    only_used_by,
    pieces_of,
    split_runs,
    stack_view,
    tuple_dies_with,
    unbind_run,
    unbind_view,
)


class StackUnbind(NodeSetRule):
    name = "stack_unbind"
    anchors = frozenset({"stack", "unbind"})

    def find(self, node: fx.Node, ctx: RewriteContext) -> Found | None:
        return (
            self._unbind_of_stack(node, ctx)
            or self._stack_of_unbind(node, ctx)
            or self._stack_with_runs(node, ctx)
        )

    def _unbind_of_stack(self, node: fx.Node, ctx: RewriteContext) -> Found | None:
        unbind = unbind_view(node, ctx)
        if unbind is None:
            return None
        stack = stack_view(unbind.input, ctx)
        if stack is None or stack.dim != unbind.dim or len(stack.tensors) != unbind.count:
            return None
        pieces = pieces_of(node)
        if pieces.others or not pieces.items:
            return None
        members = tuple(g for i in sorted(pieces.items) for g in pieces.items[i])
        if not all_movable([unbind.input, *stack.tensors, *members], ctx):
            return None
        index = {g: i for i, gs in pieces.items.items() for g in gs}
        if breaks_freshness([(g, stack.tensors[index[g]]) for g in members], ctx):
            return None
        if not same_dtypes(stack.tensors, unbind.input, ctx):
            return None  # the stack promoted a dtype: its pieces are not its inputs
        if any(not layout_safe(g, stack.tensors[index[g]], ctx) for g in members):
            return None
        consumed: tuple[fx.Node, ...] = ()
        before = VIEW
        if only_used_by(unbind.input, [node]):
            before, consumed = before + copy_cost(unbind.input, ctx), (unbind.input,)
        data = ("items", tuple(stack.tensors[index[g]] for g in members))
        return Found(members, before, Cost(), data, consumed=consumed)

    def _stack_of_unbind(self, node: fx.Node, ctx: RewriteContext) -> Found | None:
        stack = stack_view(node, ctx)
        if stack is None:
            return None
        run = unbind_run(stack.tensors, ctx)
        if run is None:
            return None
        source, unbind, indices = run
        first = indices[0]
        if not all_movable([source, *stack.tensors], ctx):
            return None
        full = len(indices) == unbind.count
        if unbind.dim != stack.dim:
            return self._stack_of_unbind_moved(node, stack, unbind, source, first, len(indices), full, ctx)
        n = len(indices)
        if not full and n < 2:
            return None  # stack of one slice: a copy vs an unsqueeze view, not worth a rule
        before = copy_cost(node, ctx)
        if tuple_dies_with(source, [node]):
            before = before + VIEW
        built = unbind.input if full else built_meta(lambda y: y.narrow(stack.dim, first, n), unbind.input)
        data = ("whole", unbind.input, stack.dim, first, n, full)
        if not breaks_freshness([(node, unbind.input)], ctx) and layout_safe(node, built, ctx):
            return Found((node,), before, Cost() if full else VIEW, data)
        # Handing back x (or its view) would be observable (x is a model input, a parameter or
        # another output; or a consumer sees the layout): one fresh contiguous copy of it is what
        # the stack returned, for one copy instead of n slices plus a multi-input stack.
        fresh = built_meta(
            lambda y: torch.clone(
                y if full else y.narrow(stack.dim, first, n), memory_format=torch.contiguous_format
            ),
            unbind.input,
        )
        if not layout_safe(node, fresh, ctx):
            return None
        after = copy_cost(node, ctx, inputs=1) + (Cost() if full else VIEW)
        return Found((node,), before, after, ("fresh", *data[1:]))

    def _stack_of_unbind_moved(
        self,
        node: fx.Node,
        stack: Any,
        unbind: Any,
        source: fx.Node,
        first: int,
        n: int,
        full: bool,
        ctx: RewriteContext,
    ) -> Found | None:
        """stack(unbind(x, u)[i..j], e) with u != e -> x(.narrow(u, i, n)).movedim(u, e), cloned
        contiguous: the same values in the same fresh contiguous layout a stack returns (a clone,
        never ``.contiguous()``, which hands back x itself when the moved view is contiguous
        already). One copy either way; the unbind and its getitems go away. A batched group whose
        members a model stacks on another dim (MMoE's ``stack(experts, 1)``) is the case."""
        if n < 2 or not same_dtypes(stack.tensors, unbind.input, ctx):
            return None
        u, e = unbind.dim, stack.dim

        def moved(y: torch.Tensor) -> torch.Tensor:
            y = y if full else y.narrow(u, first, n)
            return torch.clone(y.movedim(u, e), memory_format=torch.contiguous_format)

        if not layout_safe(node, built_meta(moved, unbind.input), ctx):
            return None
        before = copy_cost(node, ctx)
        if tuple_dies_with(source, [node]):
            before = before + VIEW
        after = copy_cost(node, ctx, inputs=1) + (Cost() if full else VIEW)
        return Found((node,), before, after, ("moved", unbind.input, u, e, first, n, full))

    def _stack_with_runs(self, node: fx.Node, ctx: RewriteContext) -> Found | None:
        """stack([a, u[i], u[i+1], .., u[j], b, ..], d) with u = unbind(Y, e) -> cat([a.unsqueeze(d),
        Y.narrow(e, i, n).movedim(e, d), b.unsqueeze(d), ..], d): each run of two or more
        consecutive pieces of one unbind becomes one view (DLRM's interaction stacks the bottom
        MLP output with the pieces of the fused feature projections)."""
        stack = stack_view(node, ctx)
        if stack is None or len(stack.tensors) < 3:
            return None
        tensors = stack.tensors
        parts = split_runs(tensors, ctx)  # ("one", t) or ("run", Y, e, start, n, count, tuple node)
        runs = [p for p in parts if p[0] == "run"]
        if not runs or len(parts) == 1:
            return None  # no run, or one run alone (the _stack_of_unbind case)
        if not all_movable([*tensors, *(p[6] for p in runs)], ctx) or not layout_safe(
            node, fresh_meta(node), ctx
        ):
            return None
        n_views = sum(1 if p[0] == "one" else (p[4] != p[5]) + (p[2] != stack.dim) for p in parts)
        before = copy_cost(node, ctx)
        for p in runs:
            if tuple_dies_with(p[6], [node]):
                before = before + VIEW
        after = copy_cost(node, ctx, inputs=len(parts)) + views(n_views)
        return Found((node,), before, after, ("mixed", tuple(parts), stack.dim))

    def build(self, members: Sequence[fx.Node], data: Any, b: Builder) -> Sequence[fx.Node]:
        if data[0] == "items":
            return list(data[1])
        if data[0] == "mixed":
            _, parts, dim = data
            pieces = []
            for p in parts:
                if p[0] == "one":
                    pieces.append(b.method("unsqueeze", p[1], dim))
                    continue
                _, whole, e, start, n, count, _ = p
                y = whole if n == count else b.call(torch.narrow, whole, e, start, n)
                pieces.append(y if e == dim else b.method("movedim", y, e, dim))
            return [b.call(torch.cat, pieces, dim)]
        if data[0] == "moved":
            _, x, u, e, first, n, full = data
            y = x if full else b.call(torch.narrow, x, u, first, n)
            return [
                b.call(torch.clone, b.call(torch.movedim, y, u, e), memory_format=torch.contiguous_format)
            ]
        kind, source, dim, start, length, full = data
        value = source if full else b.call(torch.narrow, source, dim, start, length)
        if kind == "fresh":
            return [b.call(torch.clone, value, memory_format=torch.contiguous_format)]
        return [value]
