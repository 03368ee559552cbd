"""unsqueeze_cat: ``cat([x_1.unsqueeze(d), .., x_n.unsqueeze(d)], d)`` -> ``stack([x_1, .., x_n], d)``.

WHY: RecBole builds every context-aware model's inputs as ``torch.cat([interaction[f].unsqueeze(1)
for f in fields], dim=1)``, once for its 26 categorical and once for its 13 numeric fields: 39
unsqueeze calls and two cats per step, where two stacks do the same work. In eager each call is a
dispatch of its own (about 1.6 us for a view), which at RecBole's sub-millisecond inference steps
is several percent of the step. ``stack`` is defined as exactly this cat (ATen builds it from the
unsqueezed inputs, or writes the same values in one pass), so the result is the same tensor:
the values, the dtype (the same type promotion), a fresh contiguous layout (checked against
eager's recorded strides), and gradients (``stack``'s backward hands each input its slice, as
``unsqueeze``'s backward of ``cat``'s slice does).

Declines when an input is not an unsqueeze on the cat's dim (a partial run is left as it is), when
an unsqueeze was made in another grad or autocast region than the cat (a view made under
``no_grad`` does not require grad, where the stack's result would), for ordered (mutated,
effectful) nodes, and when no unsqueeze dies with the cat (each one read elsewhere stays, so the
stack saves nothing: priced, ``report.declined``). Priced for Inductor it saves nothing either
(Inductor folds a view into the cat's indexing), so compile+optimus leaves the cat to Inductor.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch
from torch import fx

from optimus.engine.builder import Builder
from optimus.engine.context import RewriteContext
from optimus.engine.node_set_rule import Found, NodeSetRule
from optimus.rules.splitcat.pricing import copy_cost, views
from optimus.semantics.layouts import built_meta, layout_safe
from optimus.semantics.views import all_movable, cat_view, norm_dim, only_used_by


class UnsqueezeCat(NodeSetRule):
    name = "unsqueeze_cat"
    anchors = frozenset({"cat"})

    def find(self, node: fx.Node, ctx: RewriteContext) -> Found | None:
        cat = cat_view(node, ctx)
        if cat is None or cat.whole is not None or len(cat.tensors) < 2:
            return None
        out = ctx.meta(node)
        if out is None:
            return None
        rank = len(out.shape)
        region = ctx.index.regions.of(node)
        sources: list[fx.Node] = []
        for t in cat.tensors:
            canon = ctx.canon(t)
            if canon is None or canon.op != "unsqueeze" or not isinstance(canon["input"], fx.Node):
                return None
            if norm_dim(canon["dim"], rank) != cat.dim or ctx.index.regions.of(t) != region:
                return None
            sources.append(canon["input"])
        if not all_movable([*cat.tensors, *sources], ctx):
            return None
        built = built_meta(lambda *xs: torch.stack(xs, cat.dim), *sources)
        if built is None or not layout_safe(node, built, ctx):
            return None
        # the stack copies what the cat copied; what goes is each unsqueeze that only the cat read,
        # a dispatch of its own in eager. Under Inductor a view is folded into the cat's indexing
        # and costs nothing: no gain, declined (the same kernel either way).
        dying = 0 if ctx.inductor else sum(1 for t in set(cat.tensors) if only_used_by(t, [node]))
        before = copy_cost(node, ctx) + views(dying)
        after = copy_cost(node, ctx)
        return Found((node,), before, after, (tuple(sources), cat.dim))

    def build(self, members: Sequence[fx.Node], data: Any, b: Builder) -> Sequence[fx.Node]:
        sources, dim = data
        return [b.call(torch.stack, list(sources), dim)]


__all__ = ["UnsqueezeCat"]
