"""batch_linear: linear(x_i, W_i, b_i) for i < G -> unbind(baddbmm(b, stack(x_i), stack(W_i^T)))
when the x_i share shape/dtype/device, the W_i share shape, all or none have a bias, and the
linears are independent.

Stacked weights come from the layout (``ctx.layout``): contiguous [G, K, N], never a transposed
batch view (that made CPU baddbmm several times slower).
"""

from __future__ import annotations

from collections.abc import Hashable, Sequence

import torch
from torch import fx

from ..builder import Builder
from ..context import RewriteContext
from .base import Cost, HorizontalRule


class BatchLinear(HorizontalRule):
    name = "batch_linear"

    def key(self, node: fx.Node, ctx: RewriteContext) -> Hashable | None:
        canon = ctx.canon(node)
        if canon is None or canon.op != "linear":
            return None
        x, w, bias = ctx.meta(canon["input"]), ctx.meta(canon["weight"]), canon["bias"]
        if x is None or w is None or len(w.shape) != 2 or not x.shape or x.shape[-1] != w.shape[1]:
            return None
        if bias is not None and ctx.meta(bias) is None:
            return None
        return ("linear", x.shape, x.dtype, x.device, w.shape, w.dtype, bias is not None)

    def fuse(self, nodes: Sequence[fx.Node], b: Builder) -> Sequence[fx.Node]:
        canons = [b.ctx.must_canon(n) for n in nodes]
        g = len(nodes)
        x_meta, w_meta = b.ctx.meta(canons[0]["input"]), b.ctx.meta(canons[0]["weight"])
        assert x_meta is not None and w_meta is not None
        lead, (n_out, k) = x_meta.shape[:-1], w_meta.shape
        x = b.stack([c["input"] for c in canons])  # [G, *lead, K]
        if len(lead) != 1:
            x = b.method("reshape", x, g, -1, k)
        w = b.stacked_params([c["weight"] for c in canons], transpose=True)  # [G, K, N]
        if canons[0]["bias"] is not None:
            bias = b.method("unsqueeze", b.stacked_params([c["bias"] for c in canons]), 1)
            out = b.call(torch.baddbmm, bias, x, w)
        else:
            out = b.call(torch.bmm, x, w)
        if len(lead) != 1:
            out = b.method("reshape", out, g, *lead, n_out)
        return b.unbind(out, g)

    def cost(self, nodes: Sequence[fx.Node], ctx: RewriteContext) -> tuple[Cost, Cost]:
        canons = [ctx.must_canon(n) for n in nodes]
        g = len(nodes)
        x, w = ctx.meta(canons[0]["input"]), ctx.meta(canons[0]["weight"])
        assert x is not None and w is not None
        out_bytes = x.nbytes // max(x.shape[-1], 1) * w.shape[0]
        has_bias = canons[0]["bias"] is not None
        bias_bytes = w.shape[0] * w.dtype.itemsize if has_bias else 0
        flops = 2.0 * g * x.numel * w.shape[0]
        one = x.nbytes + w.nbytes + bias_bytes + out_bytes
        before = Cost(launches=g, bytes=g * one, flops=flops)
        inputs = [c["input"] for c in canons]
        stack_bytes = ctx.stack_bytes(inputs)
        weights = [c["weight"] for c in canons]
        layout_bytes = ctx.layout.bytes_moved(weights, ctx)
        layout_launches = ctx.layout.launches(weights, transpose=True)
        if has_bias:
            biases = [c["bias"] for c in canons]
            layout_bytes += ctx.layout.bytes_moved(biases, ctx)
            layout_launches += ctx.layout.launches(biases) + 0.1  # + unsqueeze view
        after = Cost(
            launches=1 + (stack_bytes > 0) + layout_launches + 0.5,
            bytes=g * one + stack_bytes + layout_bytes,
            flops=flops,
        )
        return before, after
