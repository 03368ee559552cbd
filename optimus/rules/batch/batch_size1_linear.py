"""batch_size1_linear: G projections of one feature each, ``linear(x_i, W_i, b_i)`` with
``W_i: [N, 1]`` (``nn.Linear(1, N)`` per dense feature) -> one broadcast multiply-add,
``unbind(addcmul(stack(b_i), stack(x_i), stack(W_i^T)))``.

WHY: CTR zoos project each numeric feature with its own ``nn.Linear(1, d)``. ``batch_linear``
would make them one ``baddbmm`` with K = 1, which BLAS runs no faster than the G small GEMMs (a
batched GEMM with an inner dimension of one is all overhead). A product with K = 1 is an outer
product: one elementwise ``x * w + b`` over ``[G, *lead, N]`` does it in a single pass, and each
member's ``[*lead, N]`` block comes out contiguous, as eager's. ``batch_linear`` leaves K = 1
linears to this rule.

Values: ``x * w + b`` is the GEMM's one product plus the bias, so results agree to rounding (the
BLAS kernel may fuse the multiply-add); gradients are the same sums in another order.
"""

from __future__ import annotations

from collections.abc import Hashable, Sequence

import torch
from torch import fx

from optimus.engine.builder import Builder
from optimus.engine.context import RewriteContext
from optimus.engine.rule import Cost, HorizontalRule
from optimus.rules.batch.batch_linear import linear_key


class BatchSize1Linear(HorizontalRule):
    name = "batch_size1_linear"

    def key(self, node: fx.Node, ctx: RewriteContext) -> Hashable | None:
        found = linear_key(node, ctx)
        if found is None or found[3][1] != 1:
            return None
        out = ctx.meta(node)
        if out is None or out.dtype != found[1]:
            return None  # autocast ran the GEMM in lower precision; addcmul would not (no autocast rule)
        return ("size1_linear", *found)

    def fuse(self, nodes: Sequence[fx.Node], b: Builder) -> Sequence[fx.Node]:
        canons = [b.ctx.must_canon(n) for n in nodes]
        g = len(nodes)
        x_meta, w_meta = b.ctx.meta(canons[0]["input"]), b.ctx.meta(canons[0]["weight"])
        assert x_meta is not None and w_meta is not None
        ones = [1] * (len(x_meta.shape) - 1)
        n_out = w_meta.shape[0]
        xs = b.stack([c["input"] for c in canons])  # [G, *lead, 1]
        w = b.method(
            "reshape", b.stacked_params([c["weight"] for c in canons], transpose=True), g, *ones, n_out
        )
        if canons[0]["bias"] is not None:
            bias = b.method("reshape", b.stacked_params([c["bias"] for c in canons]), g, *ones, n_out)
            out = b.call(torch.addcmul, bias, xs, w)
        else:
            out = b.call(torch.mul, xs, w)
        return b.unbind(out, g)

    def cost(self, nodes: Sequence[fx.Node], ctx: RewriteContext) -> tuple[Cost, Cost]:
        canons = [ctx.must_canon(n) for n in nodes]
        g = len(nodes)
        x = ctx.meta(canons[0]["input"])
        w = ctx.meta(canons[0]["weight"])
        assert x is not None and w is not None
        out_bytes = x.numel * w.shape[0] * x.dtype.itemsize
        before = Cost(
            launches=g, bytes=g * (x.nbytes + w.nbytes + out_bytes), flops=g * 2.0 * x.numel * w.shape[0]
        )
        weights = [c["weight"] for c in canons]
        launches = ctx.layout.launches(weights, transpose=True) + 0.1
        copies = ctx.layout.bytes_moved(weights, ctx)
        if canons[0]["bias"] is not None:
            biases = [c["bias"] for c in canons]
            launches += ctx.layout.launches(biases) + 0.1
            copies += ctx.layout.bytes_moved(biases, ctx)
        stack_bytes = ctx.stack_bytes([c["input"] for c in canons])
        after = Cost(
            launches=1 + (stack_bytes > 0) + launches + 0.3,
            bytes=g * (x.nbytes + w.nbytes + out_bytes) + stack_bytes + copies,
            flops=g * 2.0 * x.numel * w.shape[0],
        )
        return before, after
