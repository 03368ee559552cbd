"""flatten_cats: cat([a, cat([b, c], d), e], d) -> cat([a, b, c, e], d), when the inner cat is
along the same dim and read only by the outer cat.

WHY: nested concatenation copies the inner pieces twice; one cat copies each byte once. An inner
cat with other readers is left alone (it is computed anyway, so inlining saves nothing), as are
different dims, a cat of a whole split tuple, and mutated/effectful nodes.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch
from torch import fx

from optimus.engine.builder import Builder
from optimus.engine.context import RewriteContext
from optimus.engine.node_set_rule import Found, NodeSetRule
from optimus.rules.splitcat.pricing import copy_cost
from optimus.semantics.views import all_movable, cat_view, only_used_by


class FlattenCats(NodeSetRule):
    name = "flatten_cats"
    anchors = frozenset({"cat"})

    def find(self, node: fx.Node, ctx: RewriteContext) -> Found | None:
        outer = cat_view(node, ctx)
        if outer is None or outer.whole is not None:
            return None
        flat: list[fx.Node] = []
        before = copy_cost(node, ctx)
        inlined: set[fx.Node] = set()
        for t in outer.tensors:
            inner = cat_view(t, ctx)
            if (
                inner is not None
                and inner.whole is None
                and inner.dim == outer.dim
                and only_used_by(t, [node])
                and all_movable([t], ctx)
            ):
                flat.extend(inner.tensors)
                if t not in inlined:  # a cat listed twice is still computed once
                    before = before + copy_cost(t, ctx)
                    inlined.add(t)
            else:
                flat.append(t)
        if not inlined:
            return None
        after = copy_cost(node, ctx, len(flat))
        return Found((node,), before, after, (tuple(flat), outer.dim), consumed=tuple(inlined))

    def build(self, members: Sequence[fx.Node], data: Any, b: Builder) -> Sequence[fx.Node]:
        tensors, dim = data
        return [b.call(torch.cat, list(tensors), dim=dim)]
