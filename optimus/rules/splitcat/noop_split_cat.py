"""noop_split_cat: split(x, [n], d)[0] -> x (a split into one piece) and cat([x], d) -> x (a cat of
one tensor), when the split's tuple is read only through getitems.

WHY: generated code and other rewrites leave one-piece splits and one-input cats; the split is a
dispatch and the cat a full copy for nothing. Declines for mutated/effectful nodes (a cat's copy
matters when someone writes into it or into x later: those nodes are ordered) and when the result
would return a model input or parameter itself as a graph output. ``stack([x])`` is not a no-op
(it adds a dim) and is left alone.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from torch import fx

from optimus.engine.builder import Builder
from optimus.engine.context import RewriteContext
from optimus.engine.node_set_rule import Found, NodeSetRule
from optimus.engine.rule import Cost
from optimus.rules.splitcat.pricing import VIEW, copy_cost
from optimus.semantics.freshness import breaks_freshness
from optimus.semantics.layouts import layout_safe
from optimus.semantics.views import (
    SPLITS,
    all_movable,
    cat_view,
    is_graph_output_alias,
    pieces_of,
    split_view,
)


class NoopSplitCat(NodeSetRule):
    name = "noop_split_cat"
    anchors = SPLITS | {"cat"}

    def find(self, node: fx.Node, ctx: RewriteContext) -> Found | None:
        cat = cat_view(node, ctx)
        if cat is not None:
            if cat.whole is not None or len(cat.tensors) != 1:
                return None
            (only,) = cat.tensors
            if (
                breaks_freshness([(node, only)], ctx)
                or not all_movable([only], ctx)
                or not layout_safe(node, only, ctx)
            ):
                return None
            return Found((node,), copy_cost(node, ctx), Cost(), only)
        split = split_view(node, ctx)
        if split is None or len(split.sizes) != 1:
            return None
        pieces = pieces_of(node)
        members = tuple(pieces.items.get(0, []))
        if pieces.others or not members or not all_movable([split.input], ctx):
            return None
        if any(is_graph_output_alias(g, split.input) for g in members):
            return None
        return Found(members, VIEW, Cost(), split.input)

    def build(self, members: Sequence[fx.Node], data: Any, b: Builder) -> Sequence[fx.Node]:
        return [data] * len(members)
