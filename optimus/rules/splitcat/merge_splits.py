"""merge_splits: split(split(x, A, d)[i], B, d) -> one split(x, A[:i] + B + A[i+1:], d),
when both split along the same dim and piece i is read only by the inner split.

WHY: nested splits (a fused output split per task, then per head) cost one dispatch each; the
pieces are the same views of ``x`` either way. The outer split's other getitems and the inner
split are rewritten together: the inner split becomes the slice ``merged[i:i+len(B)]`` of the
merged tuple (normalize_split_cat later folds ``slice[k]`` into a plain index). Declines when
dims differ, piece i has other readers, the outer tuple is used other than by getitems, or a
node involved is mutated/effectful.
"""

from __future__ import annotations

import operator
from collections.abc import Sequence
from typing import Any

import torch
from torch import fx

from optimus.engine.builder import Builder
from optimus.engine.context import RewriteContext
from optimus.engine.node_set_rule import Found, NodeSetRule
from optimus.rules.splitcat.pricing import VIEW
from optimus.semantics.views import SPLITS, all_movable, item_of, only_used_by, pieces_of, split_view


class MergeSplits(NodeSetRule):
    name = "merge_splits"
    anchors = SPLITS

    def find(self, node: fx.Node, ctx: RewriteContext) -> Found | None:
        inner = split_view(node, ctx)
        if inner is None:
            return None
        item = item_of(inner.input)
        if item is None or item[0] is not inner.input.args[0]:
            return None  # read through a tuple slice: wait for normalize_split_cat's fold
        outer = split_view(item[0], ctx)
        i = item[1]
        if outer is None or outer.dim != inner.dim or i >= len(outer.sizes):
            return None
        pieces = pieces_of(outer.node)
        if pieces.others or not all(only_used_by(g, [node]) for g in pieces.items.get(i, [])):
            return None
        siblings = tuple(g for j in sorted(pieces.items) if j != i for g in pieces.items[j])
        members = (*siblings, node)
        if not all_movable([outer.node, inner.input, *members], ctx):
            return None
        merged = (*outer.sizes[:i], *inner.sizes, *outer.sizes[i + 1 :])
        shift = len(inner.sizes) - 1
        index = {g: (j if j < i else j + shift) for j, gs in pieces.items.items() if j != i for g in gs}
        data = (outer.input, merged, outer.dim, i, len(inner.sizes), index)
        return Found(members, VIEW + VIEW, VIEW, data, reads=(outer.node, inner.input))

    def build(self, members: Sequence[fx.Node], data: Any, b: Builder) -> Sequence[fx.Node]:
        source, merged, dim, i, count, index = data
        whole = b.call(torch.split, source, list(merged), dim=dim)
        out = [b.getitem(whole, index[g]) for g in members[:-1]]
        out.append(b.call(operator.getitem, whole, slice(i, i + count)))
        return out
