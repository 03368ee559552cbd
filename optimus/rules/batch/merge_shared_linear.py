"""merge_shared_linear: G linears reading the very same tensor x -> one batched GEMM, when their
weights share dtype and input width, all or none have a bias, and they are independent. One
kernel reads x once instead of G times.

Equal widths N (q, k, v projections; a tower and its gate):
    linear(x, W_i, b_i) -> unbind(baddbmm(stack(b_i)[:, None], x.expand(G, M, K), stack(W_i^T)))
The output is [G, M, N], so each member's result is a contiguous [M, N] block, laid out exactly as
eager's ``linear`` returns it (``.view(-1)``, ``as_strided`` and in-place ops see what they saw).
The wide form ``split(linear(x, cat(W_i)), N, -1)`` returns column slices of an [M, G*N] tensor
instead: a different layout, observable by the caller. ``x`` is broadcast (stride 0), not copied;
on CPU the batched GEMM costs what the wide one does (measured, see docs/optimus.md).

Unequal widths: the wide form, with a ``.contiguous()`` copy on each piece whose layout a consumer
can observe (a graph output, ``view``, ``as_strided``, an unknown op: see
``_split_cat_layout.observed_level``), priced in the candidate's cost.
"""

from __future__ import annotations

from collections.abc import Hashable, Sequence
from typing import Any

import torch.nn.functional as F
from torch import fx

from optimus.engine.builder import Builder
from optimus.engine.context import RewriteContext
from optimus.engine.rule import Cost, HorizontalRule
from optimus.rules.batch.batch_linear import stacked_linear
from optimus.semantics.layouts import layout_observed
from optimus.semantics.meta import TensorMeta, contiguous_stride


class MergeSharedLinear(HorizontalRule):
    name = "merge_shared_linear"

    def key(self, node: fx.Node, ctx: RewriteContext) -> Hashable | None:
        canon = ctx.canon(node)
        if canon is None or canon.op != "linear" or not isinstance(canon["input"], fx.Node):
            return None
        w = ctx.meta(canon["weight"])
        x = ctx.meta(canon["input"])
        if w is None or x is None or len(w.shape) != 2:
            return None
        bias = canon["bias"]
        if bias is not None and ctx.meta(bias) is None:
            return None
        return ("shared_linear", canon["input"], w.shape[1], w.dtype, w.device, bias is not None)

    def fuse(self, nodes: Sequence[fx.Node], b: Builder) -> Sequence[fx.Node]:
        canons = [b.ctx.must_canon(n) for n in nodes]
        widths = _widths(canons, b.ctx)
        if len(set(widths)) == 1:
            return _fuse_batched(canons, widths[0], b)
        w = b.ctx.layout.concatenated([c["weight"] for c in canons], b)
        bias = None
        if canons[0]["bias"] is not None:
            bias = b.ctx.layout.concatenated([c["bias"] for c in canons], b)
        out = b.call(F.linear, canons[0]["input"], w, bias)
        pieces = b.method("split", out, widths, -1)
        observed = _observed_pieces(nodes, widths, b.ctx)
        out_pieces = [b.getitem(pieces, i) for i in range(len(nodes))]
        return [
            b.method("contiguous", p) if seen else p for p, seen in zip(out_pieces, observed, strict=True)
        ]

    def cost(self, nodes: Sequence[fx.Node], ctx: RewriteContext) -> tuple[Cost, Cost]:
        canons = [ctx.must_canon(n) for n in nodes]
        x = ctx.meta(canons[0]["input"])
        assert x is not None
        rows = x.numel // max(x.shape[-1], 1) if x.shape else 1
        w_bytes = b_bytes = out_bytes = flops = 0.0
        for c in canons:
            w = ctx.meta(c["weight"])
            assert w is not None
            w_bytes += w.nbytes
            out_bytes += rows * w.shape[0] * w.dtype.itemsize
            flops += 2.0 * rows * w.shape[0] * w.shape[1]
            if c["bias"] is not None:
                b_bytes += w.shape[0] * w.dtype.itemsize
        g = len(nodes)
        before = Cost(launches=g, bytes=g * x.nbytes + w_bytes + b_bytes + out_bytes, flops=flops)
        widths = _widths(canons, ctx)
        if len(set(widths)) == 1:  # batched GEMM: weights stacked (a get_attr when re-laid out)
            weights = [c["weight"] for c in canons]
            copies = ctx.layout.bytes_moved(weights, ctx)
            launches = ctx.layout.launches(weights, transpose=True) + 0.3  # + expand/unbind views
            if b_bytes:
                biases = [c["bias"] for c in canons]
                copies += ctx.layout.bytes_moved(biases, ctx)
                launches += ctx.layout.launches(biases) + 0.1
            after = Cost(
                launches=1 + launches, bytes=x.nbytes + w_bytes + b_bytes + out_bytes + copies, flops=flops
            )
            return before, after
        copies = 2 * (w_bytes + b_bytes)
        cat_launches = 1 + (b_bytes > 0)
        free = getattr(ctx.layout, "concatenation_is_free", None)  # a re-laid-out layout: no cat
        if free is not None and free([c["weight"] for c in canons]):
            copies, cat_launches = 0.0, 0
        observed = _observed_pieces(nodes, widths, ctx)  # column slices a consumer would see
        piece_bytes = [rows * n * x.dtype.itemsize for n in widths]
        copies += sum(2.0 * nb for nb, seen in zip(piece_bytes, observed, strict=True) if seen)
        after = Cost(
            launches=1 + cat_launches + 0.5 + sum(observed),
            bytes=x.nbytes + w_bytes + b_bytes + out_bytes + copies,
            flops=flops,
        )
        return before, after


def _widths(canons: Sequence[Any], ctx: RewriteContext) -> list[int]:
    out = []
    for c in canons:
        meta = ctx.meta(c["weight"])
        assert meta is not None
        out.append(meta.shape[0])
    return out


def _fuse_batched(canons: Sequence[Any], n_out: int, b: Builder) -> list[fx.Node]:
    """[G, M, N] = baddbmm(bias [G, 1, N], x broadcast to [G, M, K], W^T [G, K, N]); unbind(0)
    gives each member a contiguous [*lead, N] block (see the module docstring)."""
    g = len(canons)
    x = canons[0]["input"]
    x_meta = b.ctx.meta(x)
    assert x_meta is not None
    lead, k_in = x_meta.shape[:-1], x_meta.shape[-1]
    rows = 1
    for d in lead:
        rows *= d
    x2 = x if len(lead) == 1 else b.method("reshape", x, rows, k_in)
    xs = b.method("expand", b.method("unsqueeze", x2, 0), g, rows, k_in)
    return stacked_linear(xs, canons, lead, n_out, b)


def _observed_pieces(nodes: Sequence[fx.Node], widths: Sequence[int], ctx: RewriteContext) -> list[bool]:
    """Which members' results, as column slices of the wide [.., sum(widths)] output, a consumer
    could tell apart from eager's contiguous ones."""
    total = sum(widths)
    out = []
    for node in nodes:
        meta = ctx.meta(node)
        if meta is None:
            out.append(True)
            continue
        wide = (*meta.shape[:-1], total)
        stride = contiguous_stride(wide)
        piece = TensorMeta(meta.shape, meta.dtype, meta.device, stride)
        out.append(layout_observed(node, piece, ctx))
    return out
