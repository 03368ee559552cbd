"""batch_batch_norm: batch_norm(x_i, rm_i, rv_i, w_i, b_i, training, momentum, eps) for i < G ->
one batch_norm over cat(x_i, dim=1) with the statistics and affine parameters laid end to end,
split back along the channels; in train mode the updated running statistics are copied back into
each member's buffers with one ``_foreach_copy_``.

WHY: multi-task zoos build experts as ``Linear -> BatchNorm1d -> ReLU -> Dropout``; without this
rule the horizontal groups of parallel experts end at the BatchNorm. A BatchNorm normalizes each
channel over the batch alone, so G of them side by side along the channel dimension are one
BatchNorm: the same per-channel reductions over the same rows.

Exactness (the running statistics and ``num_batches_tracked`` stay bit-equal to eager's):

* inputs are 2-D ``[B, C_i]`` with one B, float32/float64, on the CPU. ATen's CPU kernel for a
  ``[N, C]`` input walks the channels in vector lanes; whether a channel falls in a full lane or
  in the tail changes the rounding of its input gradient. Each member's channel count must be a
  multiple of 64 bytes (the widest vector the CPU kernels use), so every channel sits in a full
  lane both alone and side by side. Elsewhere (other sizes, other devices, 3-D inputs, reduced
  precision) the rule declines and says why.
* training flag, momentum and eps are constants equal across the group. ``momentum=None``
  (cumulative average) reads ``num_batches_tracked`` at run time: the factor is then a value of
  the graph, not a constant, and the rule declines it.
* ``num_batches_tracked`` is incremented by its own ``add_`` node, which the rule leaves alone.
* in train mode each member must own its running statistics (read by no other node: see
  ``effects.private_updates``); the fused call updates the concatenated copies, which are then
  written back into each member's buffers, so the buffers hold exactly what eager's in-place
  update writes (the same per-channel formula over the same values).
* running statistics present in all members or none (``track_running_stats=False``), and the
  affine weight and bias likewise (``affine=False``).
"""

from __future__ import annotations

import operator
from collections.abc import Hashable, Sequence
from typing import Any

import torch
import torch.nn.functional as F
from torch import fx

from optimus.engine.builder import Builder
from optimus.engine.context import RewriteContext
from optimus.engine.rule import Cost, HorizontalRule
from optimus.memory.live import horizontal_live
from optimus.semantics.normalize import _hashable
from optimus.semantics.op_schema import call_arguments

LANE_BYTES = 64  # the widest CPU vector ATen's BatchNorm kernels use (AVX-512)


def batch_norm_call(node: fx.Node) -> dict[str, Any] | None:
    """The arguments of an ``F.batch_norm`` call by name (defaults filled in), or None."""
    return call_arguments(node, F.batch_norm)


class BatchBatchNorm(HorizontalRule):
    name = "batch_batch_norm"

    def key(self, node: fx.Node, ctx: RewriteContext) -> Hashable | None:
        call = batch_norm_call(node)
        if call is None:
            return None
        x = ctx.meta(call["input"])
        if x is None:
            return None
        reason = self._refusal(node, call, x, ctx)
        if reason is not None:
            ctx.decline(f"batch_batch_norm: {reason}")
            return None
        stats = call["running_mean"] is not None
        return (
            "batch_norm",
            x.shape[0],
            x.dtype,
            x.device,
            call["training"],
            _hashable(call["momentum"]),
            _hashable(call["eps"]),
            stats,
            call["weight"] is not None,
            call["bias"] is not None,
        )

    @staticmethod
    def _refusal(node: fx.Node, call: dict[str, Any], x: Any, ctx: RewriteContext) -> str | None:
        """Why this call cannot join a group (None: it can)."""
        if len(x.shape) != 2:
            return f"{len(x.shape)}-D input (only [B, C] is batched)"
        if x.dtype not in (torch.float32, torch.float64):
            return f"{x.dtype} input (only float32/float64 are verified bit-equal)"
        if x.device.type != "cpu":
            return f"input on {x.device.type} (only the CPU kernel is verified bit-equal)"
        if (x.shape[1] * x.dtype.itemsize) % LANE_BYTES:
            return f"{x.shape[1]} channels: not a multiple of {LANE_BYTES} bytes (vector lanes would differ)"
        if not isinstance(call["training"], bool) or isinstance(call["eps"], fx.Node):
            return "training flag or eps computed at run time"
        if isinstance(call["momentum"], fx.Node):
            return "momentum computed at run time (momentum=None: a cumulative average)"
        if call["momentum"] is None and call["training"] and call["running_mean"] is not None:
            return "momentum=None in train mode"
        stats = [call["running_mean"], call["running_var"]]
        if (stats[0] is None) != (stats[1] is None):
            return "one running statistic without the other"
        for name in ("running_mean", "running_var", "weight", "bias"):
            value = call[name]
            if value is None:
                continue
            meta = ctx.meta(value)
            if meta is None or meta.shape != (x.shape[1],) or meta.dtype != x.dtype:
                return f"{name} of another shape or dtype than the input's channels"
        if call["training"] and stats[0] is not None and node not in ctx.index.private:
            return "running statistics another node reads or writes (module called twice?)"
        return None

    def fuse(self, nodes: Sequence[fx.Node], b: Builder) -> Sequence[fx.Node]:
        calls = [batch_norm_call(n) for n in nodes]
        assert all(c is not None for c in calls)
        cs: list[dict[str, Any]] = [c for c in calls if c is not None]
        sizes = [self._channels(c, b.ctx) for c in cs]
        x = _cat_channels([c["input"] for c in cs], sizes, b)
        first = cs[0]
        stats = first["running_mean"] is not None

        def joined(name: str) -> fx.Node | None:
            if first[name] is None:
                return None
            return b.call(torch.cat, [c[name] for c in cs], 0)

        def params(name: str) -> fx.Node | None:
            if first[name] is None:
                return None
            return b.ctx.layout.concatenated([c[name] for c in cs], b)

        rm, rv = joined("running_mean"), joined("running_var")
        out = b.call(
            F.batch_norm,
            x,
            rm,
            rv,
            params("weight"),
            params("bias"),
            first["training"],
            first["momentum"],
            first["eps"],
        )
        if first["training"] and stats:
            assert rm is not None and rv is not None
            pieces = [*_split(rm, sizes, 0, b), *_split(rv, sizes, 0, b)]
            buffers = [c["running_mean"] for c in cs] + [c["running_var"] for c in cs]
            b.call(torch._foreach_copy_, buffers, pieces)
        return _split(out, sizes, 1, b)

    @staticmethod
    def _channels(call: dict[str, Any], ctx: RewriteContext) -> int:
        meta = ctx.meta(call["input"])
        assert meta is not None
        return int(meta.shape[1])

    def cost(self, nodes: Sequence[fx.Node], ctx: RewriteContext) -> tuple[Cost, Cost]:
        calls = [batch_norm_call(n) for n in nodes]
        cs: list[dict[str, Any]] = [c for c in calls if c is not None]
        g = len(nodes)
        metas = [ctx.meta(c["input"]) for c in cs]
        nbytes = float(sum(m.nbytes for m in metas if m is not None))
        numel = float(sum(m.numel for m in metas if m is not None))
        first = cs[0]
        train = bool(first["training"])
        stats = first["running_mean"] is not None
        # eager: train mode reads x twice for the statistics and once to normalize; about four
        # ATen dispatches per call (the op, its statistics, the output, the saved values)
        passes = 3.0 if train else 2.0
        per_call = 4.0 if train else 2.0
        sizes = [self._channels(c, ctx) for c in cs]
        inputs = [c["input"] for c in cs]
        free = _channel_source(inputs, sizes) is not None
        stack_bytes = 0.0 if free else 2.0 * nbytes
        vector_bytes = float(sum(sizes)) * (metas[0].dtype.itemsize if metas[0] is not None else 4)
        layout_bytes = layout_launches = 0.0
        for name in ("weight", "bias"):
            if first[name] is not None:
                params = [c[name] for c in cs]
                layout_bytes += ctx.layout.bytes_moved(params, ctx)
                layout_launches += ctx.layout.launches(params)
        stat_launches = 2.0 if stats else 0.0  # two cats of the statistics
        stat_bytes = 4.0 * vector_bytes if stats else 0.0
        if train and stats:
            stat_launches += 1.0 + 0.2 * g  # one _foreach_copy_ (its pieces are views)
            stat_bytes += 4.0 * vector_bytes
        # in training the backward of the output split concatenates the G output gradients (one
        # copy of the joined tensor); the input cat's backward hands out views
        grad_launches, grad_bytes = (1.0, 2.0 * nbytes) if train else (0.0, 0.0)
        held, holds = horizontal_live(nodes, ctx.live, stack_bytes / 2, layout_bytes / 2)
        before = Cost(launches=g * per_call, bytes=passes * nbytes, flops=8.0 * numel, live_bytes=held)
        after = Cost(
            launches=per_call
            + (0.0 if free else 1.0)
            + stat_launches
            + layout_launches
            + grad_launches
            + 0.1 * (g + 1),
            bytes=passes * nbytes + stack_bytes + stat_bytes + layout_bytes + grad_bytes,
            flops=8.0 * numel,
            live_bytes=holds,
        )
        return before, after


def _channel_source(values: Sequence[Any], sizes: Sequence[int]) -> tuple[fx.Node, int] | None:
    """(X, start) when ``values`` are consecutive pieces, in order, of one ``split``/``chunk`` of X
    along dim 1 (e.g. the outputs of linears merged over a shared input): then their concatenation
    is ``X.narrow(1, start, sum(sizes))``, a view, no copy."""
    first = values[0]
    if not all(isinstance(v, fx.Node) for v in values):
        return None
    if not (first.op == "call_function" and first.target is operator.getitem):
        return None
    source = first.args[0]
    if not isinstance(source, fx.Node):
        return None
    if not (source.op == "call_function" and source.target is torch.split) and not (
        source.op == "call_method" and source.target == "split"
    ):
        return None
    if len(source.args) < 2:
        return None
    x, split_sizes = source.args[0], source.args[1]
    dim = source.args[2] if len(source.args) > 2 else source.kwargs.get("dim", 0)
    if not isinstance(x, fx.Node) or dim not in (1, -1) or not isinstance(split_sizes, (list, tuple)):
        return None
    i0 = first.args[1]
    if not isinstance(i0, int) or list(split_sizes[i0 : i0 + len(values)]) != list(sizes):
        return None
    for i, v in enumerate(values):
        if not (v.op == "call_function" and v.target is operator.getitem and v.args == (source, i0 + i)):
            return None
    return x, int(sum(split_sizes[:i0]))


def _cat_channels(values: Sequence[fx.Node], sizes: Sequence[int], b: Builder) -> fx.Node:
    """``torch.cat(values, 1)``, or a view when they are adjacent pieces of one tensor."""
    found = _channel_source(values, sizes)
    if found is None:
        return b.call(torch.cat, list(values), 1)
    x, start = found
    meta = b.ctx.meta(x)
    if start == 0 and meta is not None and len(meta.shape) == 2 and meta.shape[1] == sum(sizes):
        return x
    return b.call(torch.narrow, x, 1, start, sum(sizes))


def _split(node: fx.Node, sizes: Sequence[int], dim: int, b: Builder) -> list[fx.Node]:
    parts = b.call(torch.split, node, list(sizes), dim)
    return [b.getitem(parts, i) for i in range(len(sizes))]
