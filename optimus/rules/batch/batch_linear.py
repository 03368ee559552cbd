"""batch_linear: linear(x_i, W_i, b_i) for i < G -> unbind(baddbmm(b, stack(x_i), stack(W_i^T)))
when the x_i share shape/dtype/device, the W_i share shape, all or none have a bias, and the
linears are independent.

Stacked weights come from the layout (``ctx.layout``) as [G, K, N]: contiguous when stacked per
call (``RuntimeStack``), a transposed view of the [G, N, K] storage when re-laid out
(``RelayoutParams``: each member keeps eager's strides; the batched GEMM reads the transposed
operand without a copy, and the side-by-side [G', K, k*N] operand below is then a view too).

Shared inputs: when every distinct input feeds the same number k >= 2 of the linears (a tower's
first layer and its gate both read the feature), the G' = G / k distinct inputs are stacked once
and the k weights of each input are laid side by side, [G', K, k*N]: one baddbmm reads each input
once, and the k outputs of input i are views ``out[i, :, j*N:(j+1)*N]``: column slices, where
eager returns contiguous tensors. A pointwise consumer cannot tell (its result is contiguous
either way); where a consumer can (a graph output, ``view``, ``as_strided``, an unknown op: see
``_split_cat_layout.observed_level``) the plain form is used instead, whose [G, B, N] output
hands every member a contiguous block (layout by construction, at the price of stacking the
shared inputs k times). Stacking every input k
times instead (the plain form) copied each input k times, and batching the k roles separately
downstream re-stacked the outputs (two more copies of [G', B, N] on the towers model).
"""

from __future__ import annotations

from collections.abc import Hashable, Sequence
from typing import Any

import torch
from torch import fx

from optimus.engine.builder import Builder
from optimus.engine.context import RewriteContext
from optimus.engine.rule import Cost, HorizontalRule
from optimus.memory.live import horizontal_live
from optimus.semantics.layouts import copies_if_strided


def stacked_linear(
    x: fx.Node, canons: Sequence[Any], lead: Sequence[int], n_out: int, b: Builder
) -> list[fx.Node]:
    """``x`` ([G, rows, K]) times the members' stacked weights (plus their biases): one ``bmm`` or
    ``baddbmm``, unbound into G outputs of shape ``lead + (N,)``, each contiguous. Shared by
    ``batch_linear`` and ``merge_shared_linear``'s equal-width form."""
    g = len(canons)
    w = b.stacked_params([c["weight"] for c in canons], transpose=True)  # [G, K, N]
    if canons[0]["bias"] is not None:
        bias = b.method("unsqueeze", b.stacked_params([c["bias"] for c in canons]), 1)  # [G, 1, N]
        out = b.call(torch.baddbmm, bias, x, w)
    else:
        out = b.call(torch.bmm, x, w)
    if len(lead) != 1:
        out = b.method("reshape", out, g, *lead, n_out)
    return list(b.unbind(out, g))


def linear_key(node: fx.Node, ctx: RewriteContext) -> tuple[Any, ...] | None:
    """(x shape, x dtype, x device, W shape, W dtype, has bias) of a linear whose input, 2-D weight
    and bias all have meta and agree on K; None for anything else. Shared by the linear rules'
    group keys."""
    canon = ctx.canon(node)
    if canon is None or canon.op != "linear":
        return None
    x, w, bias = ctx.meta(canon["input"]), ctx.meta(canon["weight"]), canon["bias"]
    if x is None or w is None or len(w.shape) != 2 or not x.shape or x.shape[-1] != w.shape[1]:
        return None
    if bias is not None and ctx.meta(bias) is None:
        return None
    return (x.shape, x.dtype, x.device, w.shape, w.dtype, bias is not None)


class BatchLinear(HorizontalRule):
    name = "batch_linear"

    def key(self, node: fx.Node, ctx: RewriteContext) -> Hashable | None:
        found = linear_key(node, ctx)
        if found is None or found[3][1] == 1:
            return None  # K = 1: an outer product, batched by batch_size1_linear
        return ("linear", *found)

    def fuse(self, nodes: Sequence[fx.Node], b: Builder) -> Sequence[fx.Node]:
        canons = [b.ctx.must_canon(n) for n in nodes]
        g = len(nodes)
        x_meta, w_meta = b.ctx.meta(canons[0]["input"]), b.ctx.meta(canons[0]["weight"])
        assert x_meta is not None and w_meta is not None
        lead, (n_out, k) = x_meta.shape[:-1], w_meta.shape
        roles = shared_input_roles(canons) if len(lead) == 1 and not _strides_seen(nodes, b.ctx) else None
        if roles is not None:
            return _fuse_shared(canons, roles, n_out, k, b)
        x = b.stack([c["input"] for c in canons])  # [G, *lead, K]
        if len(lead) != 1:
            x = b.method("reshape", x, g, -1, k)
        return stacked_linear(x, canons, lead, n_out, b)

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
        inputs = [c["input"] for c in canons]
        weights = [c["weight"] for c in canons]
        layout_bytes = ctx.layout.bytes_moved(weights, ctx)
        layout_launches = ctx.layout.launches(weights, transpose=True)
        roles = shared_input_roles(canons) if len(x.shape) == 2 and not _strides_seen(nodes, ctx) else None
        if roles is None:
            stack_bytes = ctx.stack_bytes(inputs)
        else:  # distinct inputs stacked once; the [G', K, k*N] weight view is one small copy
            stack_bytes = ctx.stack_bytes([r[0] for r in roles])
            layout_bytes += 2.0 * g * w.nbytes
            layout_launches += 1
        if has_bias:
            biases = [c["bias"] for c in canons]
            layout_bytes += ctx.layout.bytes_moved(biases, ctx)
            layout_launches += ctx.layout.launches(biases) + 0.1  # + unsqueeze view
        # a copied stack and weights stacked per call are alive beside their originals
        held, holds = horizontal_live(nodes, ctx.live, stack_bytes / 2, layout_bytes / 2)
        before = Cost(launches=g, bytes=g * one, flops=flops, live_bytes=held)
        after = Cost(
            launches=1 + (stack_bytes > 0) + layout_launches + 0.5,
            bytes=g * one + stack_bytes + layout_bytes,
            flops=flops,
            live_bytes=holds,
        )
        return before, after


def _strides_seen(nodes: Sequence[fx.Node], ctx: RewriteContext) -> bool:
    """Would a consumer see that a result is a column slice (see the module docstring)?"""
    return copies_if_strided(nodes, ctx).launches > 0


def shared_input_roles(canons: Sequence[Any]) -> list[tuple[fx.Node, list[int]]] | None:
    """[(input, [indices of the linears reading it])] in first-use order, when there is more than
    one distinct input and each feeds the same number k >= 2 of the linears; else None."""
    uses: dict[fx.Node, list[int]] = {}
    for i, c in enumerate(canons):
        x = c["input"]
        if not isinstance(x, fx.Node):
            return None
        uses.setdefault(x, []).append(i)
    counts = {len(v) for v in uses.values()}
    if len(uses) < 2 or len(counts) != 1 or counts.pop() < 2:
        return None
    return list(uses.items())


def _fuse_shared(
    canons: Sequence[Any], roles: list[tuple[fx.Node, list[int]]], n_out: int, k_in: int, b: Builder
) -> list[fx.Node]:
    """One baddbmm over the distinct inputs with each input's k weights side by side."""
    groups, k = len(roles), len(roles[0][1])
    order = [i for _, idx in roles for i in idx]  # input-major: weights of input 0, then input 1, ...
    x = b.stack([u for u, _ in roles])  # [G', B, K]
    w = b.stacked_params([canons[i]["weight"] for i in order], transpose=True)  # [G'k, K, N]
    w = b.method(
        "reshape",
        b.method("permute", b.method("reshape", w, groups, k, k_in, n_out), 0, 2, 1, 3),
        groups,
        k_in,
        k * n_out,
    )
    if canons[0]["bias"] is not None:
        bias = b.method("reshape", b.stacked_params([canons[i]["bias"] for i in order]), groups, 1, k * n_out)
        out = b.call(torch.baddbmm, bias, x, w)  # [G', B, k*N]
    else:
        out = b.call(torch.bmm, x, w)
    out = b.method("unflatten", out, -1, (k, n_out))  # [G', B, k, N]
    results: list[fx.Node | None] = [None] * len(canons)
    for j in range(k):
        pieces = b.unbind(b.method("select", out, 2, j), groups)  # role j of every input
        for gi, (_, idx) in enumerate(roles):
            results[idx[j]] = pieces[gi]
    assert all(r is not None for r in results)
    return [r for r in results if r is not None]
