"""embedding_index_select: a trained lookup ``F.embedding(idx, W)`` on CPU ->
``W.index_select(0, idx.reshape(-1)).view(*idx.shape, D)``.

WHY: the two compute the same forward (a row gather), but their backwards differ. On CPU,
``embedding_dense_backward`` sorts the indices and then accumulates each table row's gradient;
``index_select``'s backward is one ``index_add_`` into a zeroed table. Measured side by side
(1 thread, forward+backward of the lookup): 64 ids 20.7 us against 24.0 us (the gather path costs
about 4 us more in fixed work), 1,664 ids (a DeepCTR layer of 26 features at batch 64, once
``batch_embedding`` made it one lookup) 88.5 against 43.0 us, 13,312 ids 883 against 451 us,
106,496 ids into a 100,000-row table 16.9 against 7.2 ms. The saving grows by about 28 ns per id
(more for large tables), so the cost model prices the sort at ``PER_ID_LAUNCHES`` launches per id
against half a launch of fixed work: small per-feature lookups are left alone, and the batched
lookup of an input layer is rewritten.

Exactness: the forward reads the same rows. ``index_add_`` adds each row's gradients in the
order of the ids; the table's gradient was bit-identical to ``embedding_dense_backward``'s in
every case measured (5 to 100,000 rows, up to 106,496 ids, 1 and 2 threads), and the tests
compare it bit for bit. An id out of
range raises ``IndexError: index out of range in self`` in both. The result is a contiguous
``[*idx.shape, D]`` tensor, as eager's. Declines: no gradient (the forward is the same work),
not on CPU (on CUDA ``index_add_`` accumulates with atomics: another order, and an error under
``torch.use_deterministic_algorithms``), a table that is not float32/float64 (the half-precision
backwards accumulate differently), ``padding_idx``, ``max_norm``, ``scale_grad_by_freq`` or
``sparse`` (their backwards are not a plain gather's), shapes that are not plain integers, and a
graph Inductor compiles (it decomposes both backwards into the same accumulating ``index_put``).
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
from optimus.rules.batch.batch_embedding import bound, plain_lookup
from optimus.semantics.layouts import built_meta, layout_safe
from optimus.semantics.meta import output_requires_grad

_DTYPES = (torch.float32, torch.float64)
PER_ID_LAUNCHES = 0.0035  # embedding_dense_backward's sort, per id (28 ns), in CPU launches (8 us)
FIXED_LAUNCHES = 0.5  # the gather path's extra fixed work (about 4 us): reshape, view, zeros


def _lookup(idx: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
    return weight.index_select(0, idx.reshape(-1)).view(*idx.shape, weight.shape[1])


def _requires_grad(node: fx.Node, ctx: RewriteContext, depth: int = 3) -> bool:
    """The value required grad at capture; for a node a rule built (no recorded flag, such as
    ``batch_embedding``'s lookup), whether one of its inputs within ``depth`` steps does and grad
    mode is on where it runs (a parameter of a ``get_attr`` is read from the module). Unknown
    counts as no: the rewrite is exact either way, and only its price depends on the answer."""
    flag = output_requires_grad(node)
    if flag is not None:
        return flag
    if node.op == "get_attr":
        try:
            return bool(ctx.gm.get_parameter(str(node.target)).requires_grad)
        except AttributeError:
            return False  # a buffer or a constant
    if depth == 0 or node.op != "call_function" or ctx.index.regions.grad_disabled(node):
        return False
    return any(_requires_grad(i, ctx, depth - 1) for i in node.all_input_nodes)


class EmbeddingIndexSelect(NodeSetRule):
    name = "embedding_index_select"
    anchors = frozenset({"embedding"})

    def find(self, node: fx.Node, ctx: RewriteContext) -> Found | None:
        found = plain_lookup(node, ctx)
        if found is None:
            return None
        idx, weight, i, w = found.ids_node, found.table_node, found.ids, found.table
        if not all(isinstance(s, int) for s in (*i.shape, *w.shape)):
            return None
        if w.device.type != "cpu":
            return None  # index_add_ on CUDA: atomics (another order; not deterministic)
        if ctx.inductor:
            ctx.decline("embedding_index_select: Inductor lowers both backwards to one scatter-add")
            return None
        if not (_requires_grad(node, ctx) and node in ctx.grad_reaching):
            ctx.decline("embedding_index_select: no gradient (the forward is the same gather)")
            return None
        if w.dtype not in _DTYPES:
            ctx.decline("embedding_index_select: not a float32/float64 table")
            return None
        if not layout_safe(node, built_meta(_lookup, idx, weight), ctx):
            return None
        ids = float(i.numel)
        out = ids * w.shape[1] * w.dtype.itemsize
        moved = 2.0 * out + (w.nbytes + 2.0 * out)  # forward gather; backward zeros + accumulate
        before = Cost(launches=2.0 + PER_ID_LAUNCHES * ids, bytes=moved)
        after = Cost(launches=2.0 + FIXED_LAUNCHES, bytes=moved)
        return Found((node,), before, after, (tuple(i.shape), int(w.shape[1])))

    def build(self, members: Sequence[fx.Node], data: Any, b: Builder) -> Sequence[fx.Node] | None:
        args = bound(members[0])
        if args is None:
            return None
        shape, width = data
        flat = args["input"] if len(shape) == 1 else b.method("reshape", args["input"], -1)
        rows = b.method("index_select", args["weight"], 0, flat)
        return [rows if len(shape) == 1 else b.method("view", rows, *shape, width)]


__all__ = ["FIXED_LAUNCHES", "PER_ID_LAUNCHES", "EmbeddingIndexSelect"]
