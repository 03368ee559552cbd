"""batch_embedding: per-feature lookups ``F.embedding(idx_i, W_i)`` for i < G -> one lookup in the
concatenated table: ``unbind(F.embedding(stack(idx_i) + offset_i, cat(W_i)))``, when the tables
share width, dtype and device, the index tensors share shape and dtype, and no lookup uses
``padding_idx``, ``max_norm``, ``scale_grad_by_freq`` or ``sparse``.

WHY: CTR model zoos embed each categorical feature with its own ``nn.Embedding`` (26-52 features
of one width): 40-60% of their graph is these lookups, one dispatch each. One gather over the
tables laid end to end does the same work in one kernel. With the parameter re-layout the tables
live in one storage (each user table a view of its rows), so the concatenated table is a
``get_attr``; without it, the concatenation copies every table on every call, which the cost
model prices (and so declines for large tables).

Exactness: every row is read from the same table row as before, so values are bit-identical,
and each table's gradient rows are summed in the same order (a table's rows are reached only by
its own feature's ids, in batch order in either layout below). Each member's result is a
contiguous ``[*idx.shape, D]`` block, as eager's, unless every lookup is read only by
``torch.cat`` (see :func:`only_concatenated`): then the ids are stacked side by side on a new
last dim and each result is a strided view of one ``[*idx.shape, G, D]`` lookup, which a cat
cannot tell from a contiguous one. An index outside its own table makes eager
raise; here it would read a neighbouring table, so the fused form maps an index outside
``0 <= idx_i < rows_i`` to -1 and the lookup raises ``IndexError``, as eager's does, instead of
returning another table's row.
"""

from __future__ import annotations

from collections.abc import Hashable, Sequence
from dataclasses import dataclass
from typing import Any

import torch
import torch.nn.functional as F
from torch import fx

from optimus.engine.builder import Builder
from optimus.engine.context import RewriteContext
from optimus.engine.rule import Cost, HorizontalRule
from optimus.semantics.meta import TensorMeta
from optimus.semantics.op_schema import call_arguments

_PLAIN = {"padding_idx": None, "max_norm": None, "scale_grad_by_freq": False, "sparse": False}


CHECK_LAUNCHES = 4.0  # ge, lt, and, where (+ the add of the offsets, counted apart)


@dataclass(frozen=True)
class PlainLookup:
    """A lookup ``F.embedding(ids, table)`` without ``padding_idx``, ``max_norm``,
    ``scale_grad_by_freq`` or ``sparse``: a plain row gather (whose backward adds each row's
    gradients), which other forms of the lookup may replace."""

    ids_node: fx.Node
    table_node: fx.Node
    ids: TensorMeta
    table: TensorMeta


def plain_lookup(node: fx.Node, ctx: RewriteContext) -> PlainLookup | None:
    """``node`` as a :class:`PlainLookup` of integer ids in a 2-D table with known metas, else None."""
    args = bound(node)
    if args is None or any(args[k] != v for k, v in _PLAIN.items()):
        return None
    idx, weight = args["input"], args["weight"]
    if not isinstance(idx, fx.Node) or not isinstance(weight, fx.Node):
        return None
    i, w = ctx.meta(idx), ctx.meta(weight)
    if i is None or w is None or len(w.shape) != 2 or i.dtype not in (torch.int64, torch.int32):
        return None
    return PlainLookup(idx, weight, i, w)


def bound(node: fx.Node) -> dict[str, Any] | None:
    """``F.embedding``'s arguments by name (defaults filled), or None for another call."""
    return call_arguments(node, F.embedding)


class BatchEmbedding(HorizontalRule):
    name = "batch_embedding"

    def key(self, node: fx.Node, ctx: RewriteContext) -> Hashable | None:
        found = plain_lookup(node, ctx)
        if found is None:
            return None
        i, w = found.ids, found.table
        return ("embedding", i.shape, i.dtype, i.device, w.shape[1], w.dtype, w.device)

    def fuse(self, nodes: Sequence[fx.Node], b: Builder) -> Sequence[fx.Node]:
        args = [bound(n) for n in nodes]
        idxs = [a["input"] for a in args if a is not None]
        weights = [a["weight"] for a in args if a is not None]
        rows = [_rows(w, b.ctx) for w in weights]
        i_meta = b.ctx.meta(idxs[0])
        assert i_meta is not None
        g, lead = len(nodes), len(i_meta.shape)
        side_by_side = only_concatenated(nodes)
        dtype, device = i_meta.dtype, i_meta.device
        starts = [sum(rows[:k]) for k in range(g)]
        if side_by_side:  # [n, G] indices: each id beside the other features' ids of its row
            flat = b.method("reshape", b.stack(idxs, lead), -1, g)
            limits = b.constant(rows, dtype=dtype, device=device)
            offsets = b.constant(starts, dtype=dtype, device=device)
        else:  # [G, n]: each feature's ids together
            flat = b.method("reshape", b.stack(idxs), g, -1)
            limits = b.constant([[r] for r in rows], dtype=dtype, device=device)
            offsets = b.constant([[s] for s in starts], dtype=dtype, device=device)
        inside = b.call(torch.logical_and, b.call(torch.ge, flat, 0), b.call(torch.lt, flat, limits))
        # an index outside its own table becomes -1, so the lookup raises IndexError as eager's does
        rows_at = b.call(torch.where, inside, b.call(torch.add, flat, offsets), -1)
        table = b.ctx.layout.concatenated(weights, b)
        out = b.call(F.embedding, rows_at, table)  # [G, n, D] or, side by side, [n, G, D]
        width = _width(weights[0], b.ctx)
        if side_by_side:
            return b.unbind(b.method("reshape", out, *i_meta.shape, g, width), g, lead)
        shaped = b.method("reshape", out, g, *i_meta.shape, width) if lead != 1 else out
        return b.unbind(shaped, g)

    def cost(self, nodes: Sequence[fx.Node], ctx: RewriteContext) -> tuple[Cost, Cost]:
        args = [bound(n) for n in nodes]
        idxs = [a["input"] for a in args if a is not None]
        weights = [a["weight"] for a in args if a is not None]
        g = len(nodes)
        i_meta, w_meta = ctx.meta(idxs[0]), ctx.meta(weights[0])
        assert i_meta is not None and w_meta is not None
        out_bytes = i_meta.numel * w_meta.shape[1] * w_meta.dtype.itemsize
        idx_bytes = i_meta.nbytes
        before = Cost(launches=g, bytes=g * (2 * out_bytes + idx_bytes))
        table_bytes = sum(_rows(w, ctx) for w in weights) * w_meta.shape[1] * w_meta.dtype.itemsize
        free = getattr(ctx.layout, "concatenation_is_free", None)
        cat_launches, cat_bytes = (
            (0.0, 0.0) if free is not None and free(weights) else (1.0, 2.0 * table_bytes)
        )
        stack_bytes = ctx.stack_bytes(idxs)
        after = Cost(
            # stack, two constant index tables (priced as built per call, as inside a Dynamo
            # backend: Builder.constant), the check, the offsets' add, the lookup, views
            launches=(stack_bytes > 0) + 2 * 0.5 + CHECK_LAUNCHES + 1 + 1 + cat_launches + 0.3,
            bytes=g * (2 * out_bytes + 6 * idx_bytes) + stack_bytes + cat_bytes,
        )
        return before, after


def only_concatenated(nodes: Sequence[fx.Node]) -> bool:
    """Whether every lookup's result is read only by ``torch.cat`` calls. Then the fused lookup
    lays the G results side by side (``[*idx.shape, G, D]``, unbound along the G dim): each
    result is a strided view there, where eager's is contiguous, which a ``cat`` cannot tell (it
    copies values), and a cat of the results along the last dims becomes a view of the lookup's
    output (``unbind_cat``) instead of a transposing copy. Measured on DeepCTR's SharedBottom and
    ESMM training steps (the input layer's ``cat(lookups, -1)``): 5-6% faster than the
    feature-major ``[G, *idx.shape, D]``, which stays for every other reader (docs/perf.md)."""
    return all(
        n.users and all(u.op == "call_function" and u.target is torch.cat for u in n.users) for n in nodes
    )


def _rows(weight: fx.Node, ctx: RewriteContext) -> int:
    meta = ctx.meta(weight)
    assert meta is not None
    return int(meta.shape[0])


def _width(weight: fx.Node, ctx: RewriteContext) -> int:
    meta = ctx.meta(weight)
    assert meta is not None
    return int(meta.shape[1])
