"""batch_layer_norm: layer_norm(x_i, s, w_i, b_i, eps) for i < G ->
unbind(layer_norm(stack(x_i), s, eps=eps) * stack(w_i) + stack(b_i)), when the x_i share
shape/dtype/device, the normalized shape and eps are equal, affine parameters are present in all
members or none, and the layer norms are independent.
"""

from __future__ import annotations

from collections.abc import Hashable, Sequence

import torch
import torch.nn.functional as F
from torch import fx

from optimus.engine.builder import Builder
from optimus.engine.context import RewriteContext
from optimus.engine.rule import Cost, HorizontalRule
from optimus.memory.live import horizontal_live
from optimus.semantics.normalize import _hashable


class BatchLayerNorm(HorizontalRule):
    name = "batch_layer_norm"

    def key(self, node: fx.Node, ctx: RewriteContext) -> Hashable | None:
        canon = ctx.canon(node)
        if canon is None or canon.op != "layer_norm":
            return None
        x = ctx.meta(canon["input"])
        shape = canon["normalized_shape"]
        if isinstance(shape, int):
            shape = (shape,)
        if x is None or not isinstance(shape, (list, tuple)) or not all(isinstance(d, int) for d in shape):
            return None
        if tuple(x.shape[len(x.shape) - len(shape) :]) != tuple(shape) or isinstance(canon["eps"], fx.Node):
            return None
        params = []
        for name in ("weight", "bias"):
            p = canon[name]
            p_meta = ctx.meta(p) if isinstance(p, fx.Node) else None
            if p is not None and p_meta is None:
                return None
            if p_meta is not None and p_meta.dtype != x.dtype:
                # LayerNorm's output keeps its input's dtype (bfloat16 under autocast, with float32
                # weights); the batched affine step would promote it to the weights' dtype
                ctx.decline("batch_layer_norm: input and affine parameters differ in dtype")
                return None
            params.append(p is not None)
        if any(params) and x.dtype not in (torch.float32, torch.float64):
            # one fused LayerNorm rounds once; normalizing, then the affine step, rounds twice
            ctx.decline("batch_layer_norm: affine LayerNorm in reduced precision (two roundings)")
            return None
        return ("layer_norm", x.shape, x.dtype, x.device, tuple(shape), _hashable(canon["eps"]), *params)

    def fuse(self, nodes: Sequence[fx.Node], b: Builder) -> Sequence[fx.Node]:
        canons = [b.ctx.must_canon(n) for n in nodes]
        g = len(nodes)
        x_meta = b.ctx.meta(canons[0]["input"])
        assert x_meta is not None
        shape = canons[0]["normalized_shape"]
        shape = (shape,) if isinstance(shape, int) else tuple(shape)
        ones = [1] * (len(x_meta.shape) - len(shape))
        x = b.stack([c["input"] for c in canons])
        out = b.call(F.layer_norm, x, shape, None, None, canons[0]["eps"])
        weight, bias = canons[0]["weight"], canons[0]["bias"]
        if weight is not None:
            w = b.method("reshape", b.stacked_params([c["weight"] for c in canons]), g, *ones, *shape)
            if bias is not None:
                bb = b.method("reshape", b.stacked_params([c["bias"] for c in canons]), g, *ones, *shape)
                out = b.call(torch.addcmul, bb, out, w)
            else:
                out = b.call(torch.mul, out, w)
        elif bias is not None:
            bb = b.method("reshape", b.stacked_params([c["bias"] for c in canons]), g, *ones, *shape)
            out = b.call(torch.add, out, bb)
        return b.unbind(out, g)

    def cost(self, nodes: Sequence[fx.Node], ctx: RewriteContext) -> tuple[Cost, Cost]:
        canons = [ctx.must_canon(n) for n in nodes]
        g = len(nodes)
        x = ctx.meta(canons[0]["input"])
        assert x is not None
        affine = [canons[0][k] is not None for k in ("weight", "bias")]
        stack_bytes = ctx.stack_bytes([c["input"] for c in canons])
        layout_bytes = layout_launches = 0.0
        for name, present in zip(("weight", "bias"), affine, strict=True):
            if present:
                params = [c[name] for c in canons]
                layout_bytes += ctx.layout.bytes_moved(params, ctx)
                layout_launches += ctx.layout.launches(params) + 0.1  # + reshape view
        # eager holds the normalized stack while the affine step writes its own [G, ...] result;
        # Inductor computes both in one loop
        unfused = g * x.nbytes if any(affine) and not ctx.inductor else 0.0
        held, holds = horizontal_live(nodes, ctx.live, stack_bytes / 2, layout_bytes / 2 + unfused)
        before = Cost(launches=g, bytes=g * 2 * x.nbytes, flops=g * 8.0 * x.numel, live_bytes=held)
        after = Cost(
            launches=1 + (stack_bytes > 0) + (1 if any(affine) else 0) + layout_launches + 0.5,
            bytes=g * 2 * x.nbytes * (2 if any(affine) else 1) + stack_bytes + layout_bytes,
            flops=g * 10.0 * x.numel,
            live_bytes=holds,
        )
        return before, after
