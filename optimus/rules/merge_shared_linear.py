"""merge_shared_linear: linear(x, W_i, b_i) for i < G -> split(linear(x, cat(W_i), cat(b_i)), N_i, -1)
when the linears read the very same tensor x, their weights share dtype and input width, all or
none have a bias, and they are independent. One wide GEMM reads x once instead of G times.
"""

from __future__ import annotations

from collections.abc import Hashable, Sequence

import torch.nn.functional as F
from torch import fx

from ..builder import Builder
from ..context import RewriteContext
from .base import Cost, HorizontalRule


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
        widths = []
        for c in canons:
            meta = b.ctx.meta(c["weight"])
            assert meta is not None
            widths.append(meta.shape[0])
        w = b.ctx.layout.concatenated([c["weight"] for c in canons], b)
        bias = None
        if canons[0]["bias"] is not None:
            bias = b.ctx.layout.concatenated([c["bias"] for c in canons], b)
        out = b.call(F.linear, canons[0]["input"], w, bias)
        pieces = b.method("split", out, widths, -1)
        return [b.getitem(pieces, i) for i in range(len(nodes))]

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
        copies = 2 * (w_bytes + b_bytes)
        cat_launches = 1 + (b_bytes > 0)
        free = getattr(ctx.layout, "concatenation_is_free", None)  # a re-laid-out layout: no cat
        if free is not None and free([c["weight"] for c in canons]):
            copies, cat_launches = 0.0, 0
        after = Cost(
            launches=1 + cat_launches + 0.5,
            bytes=x.nbytes + w_bytes + b_bytes + out_bytes + copies,
            flops=flops,
        )
        return before, after
