"""split_squeeze: ``squeeze(split(x, 1, d)[i], d)`` -> ``unbind(x, d)[i]`` (a cleanup).

WHY: a split into size-1 pieces, each squeezed on the split dim, is an unbind written the long way
(``[t.squeeze(1) for t in x.split(1, 1)]``); Inductor's split/cat pass recognises it. As an
unbind, the stack/cat rules see it (``stack(unbind(x, d), e)`` is ``x`` or one copy) and the n
squeeze dispatches go away. Exact: ``x.select(d, i)`` is the same view as the squeezed piece (same
storage, offset, sizes and strides), so values, aliasing and gradients are unchanged.

Only squeezes with an explicit dim equal to the split dim, in the split's grad/autocast region
(a view made under ``no_grad`` does not require grad), of a split whose pieces are all of size 1
and whose tuple is read only through getitems; ordered (mutated, effectful) nodes are left alone.
"""

from __future__ import annotations

import operator

import torch
from torch import fx

from optimus.engine.context import RewriteContext
from optimus.engine.rule import CleanupRule
from optimus.semantics.views import norm_dim, pieces_of, split_view


class SplitSqueeze(CleanupRule):
    name = "split_squeeze"

    def run(self, ctx: RewriteContext) -> int:
        regions = ctx.index.regions
        changed = 0
        for node in list(ctx.graph.nodes):
            if node not in ctx.index.pos or not ctx.movable(node):
                continue
            split = split_view(node, ctx)
            if split is None or any(s != 1 for s in split.sizes) or len(split.sizes) < 2:
                continue
            pieces = pieces_of(node)
            if pieces.others:
                continue
            rank = len(ctx.meta(split.input).shape)  # type: ignore[union-attr]
            squeezes: list[tuple[int, fx.Node]] = []
            for i, getitems in pieces.items.items():
                for g in getitems:
                    for user in g.users:
                        canon = ctx.canon(user)
                        if (
                            canon is not None
                            and canon.op == "squeeze"
                            and canon["input"] is g
                            and norm_dim(canon["dim"], rank) == split.dim
                            and user in ctx.index.pos
                            and ctx.movable(user)
                            and regions.of(user) == regions.of(node)
                        ):
                            squeezes.append((i, user))
            if not squeezes:
                continue
            with ctx.graph.inserting_after(node):
                unbind = ctx.graph.call_function(torch.unbind, (split.input, split.dim))
            items: dict[int, fx.Node] = {}
            last = unbind
            for i in sorted({i for i, _ in squeezes}):
                with ctx.graph.inserting_after(last):
                    items[i] = last = ctx.graph.call_function(operator.getitem, (unbind, i))
            for i, squeeze in squeezes:
                users = list(squeeze.users)
                squeeze.replace_all_uses_with(items[i])
                ctx.forget_canon(users)
                ctx.graph.erase_node(squeeze)
                changed += 1
        return changed


__all__ = ["SplitSqueeze"]
