"""group_linear: linear(x_i, W_i, b_i) for i < G, shapes differing -> one grouped computation,
when the x_i are 2-D, all of one dtype and device (weights and biases too), all or none have a
bias, the linears are independent and sit in one grad-mode/autocast region, and the cost model
rates the grouped form faster on the device at hand.

Two grouped forms, the cost model picks the cheaper (and declines when neither beats G launches):

* ``triton``: one ``torch.ops.optimus.grouped_linear`` node (the Triton grouped kernel; forward,
  dX and dW one launch each). Offered on CUDA when Triton is installed.
* ``padded``: zero-pad every group to the largest (M, K, N), stack, one ``baddbmm``, slice each
  group back out as a contiguous tensor. Plain graph ops (not the custom op) so that Inductor can
  fuse the pads and the slices; in eager it costs about 4G launches and never pays, which the
  cost model says.

The Triton form is priced with its host time per call (``TRITON_HOST_LAUNCHES``, measured on an
H200), so on a GPU it pays only for large groups; small groups keep their separate GEMMs.
A cost model may name the forms it prices with ``grouped_linear_backends(device) -> tuple[str]``
(tests use it to run the Triton form on CPU under ``TRITON_INTERPRET=1``); without it the forms
offered are the device's own (above).

Conservative by design: members must be movable (not ordered, not reading a mutated value: see
``optimus.semantics.effects``), and a linear is keyed by the grad-mode/autocast region it sits in (the
engine's segment, :mod:`optimus.semantics.regions`), so linears under different
grad modes are never grouped. Groups whose members all share one shape are left to
``batch_linear``. Parameters are passed as they are (no stacking, no copy), so the rule needs
nothing from the parameter layout and works unchanged under ``RelayoutParams``: gradients land
on the original parameters and ``state_dict`` is untouched.
"""

from __future__ import annotations

from collections.abc import Hashable, Sequence
from typing import Any

import torch
import torch.nn.functional as F
from torch import fx

from optimus.engine.builder import Builder
from optimus.engine.context import RewriteContext
from optimus.engine.rule import Candidate, Cost, HorizontalRule
from optimus.kernels.grouped_linear import triton_installed
from optimus.semantics.meta import TensorMeta

_KERNEL_DTYPES = (torch.float32, torch.float16, torch.bfloat16)
_TILE = 64  # the grouped kernel's largest tile edge (see kernels.grouped_linear_triton.blocks_for)
# The Triton form's host time per call, in launches of the device constants: the custom op's
# dispatch, G output allocations, the launch tables and Triton's Python launcher. Measured on
# the lent H200 (torch 2.11, Triton 3.6; docs/perf.md "Grouped GEMM on a GPU"): 260 us per call
# for G = 3 against 34 us per F.linear in the same loop; inside a compiled dlrm `tiny` step the
# grouped op made the step 0.23 ms slower than the three GEMMs it replaced. 260 us is about 40
# launches at the CUDA constant (6 us). A cost model may state its own figure as
# ``grouped_kernel_host_launches`` (0 prices the kernel alone, as the interpreter tests do).
TRITON_HOST_LAUNCHES = 40.0


def _shapes(nodes: Sequence[fx.Node], ctx: RewriteContext) -> list[tuple[int, int, int]]:
    """(M, K, N) of each member."""
    out = []
    for node in nodes:
        canon = ctx.must_canon(node)
        x, w = ctx.meta(canon["input"]), ctx.meta(canon["weight"])
        assert x is not None and w is not None
        out.append((x.shape[0], x.shape[1], w.shape[0]))
    return out


def _round_up(v: int, to: int) -> int:
    return -(-v // to) * to


def _tile(size: int) -> int:
    return max(16, min(_TILE, 1 << max(size - 1, 0).bit_length()))


class GroupLinear(HorizontalRule):
    name = "group_linear"

    def key(self, node: fx.Node, ctx: RewriteContext) -> Hashable | None:
        canon = ctx.canon(node)
        if canon is None or canon.op != "linear":
            return None
        x, w, bias = ctx.meta(canon["input"]), ctx.meta(canon["weight"]), canon["bias"]
        if x is None or w is None or len(x.shape) != 2 or len(w.shape) != 2 or x.shape[1] != w.shape[1]:
            return None
        b = ctx.meta(bias) if bias is not None else None
        if bias is not None and (b is None or b.shape != (w.shape[0],) or b.dtype != x.dtype):
            return None
        if w.dtype != x.dtype or w.device != x.device:
            return None
        return ("group_linear", x.dtype, x.device, bias is not None, ctx.index.regions.of(node))

    def match(self, ctx: RewriteContext) -> list[Candidate]:
        out = []
        for cand in ctx.horizontal_candidates(self):
            shapes = _shapes(cand.nodes, ctx)
            if len(set(shapes)) > 1:  # one shape only: batch_linear's business
                out.append(cand)
        return out

    # -- pricing ----------------------------------------------------------------------------------
    def backends(self, nodes: Sequence[fx.Node], ctx: RewriteContext) -> tuple[str, ...]:
        device = ctx.device_of(nodes)
        declared = getattr(ctx.cost_model, "grouped_linear_backends", None)
        if callable(declared):
            offered = tuple(declared(device))
        elif device.type == "cuda" and triton_installed():
            offered = ("triton", "padded")
        else:
            offered = ("padded",)
        meta = ctx.meta(ctx.must_canon(nodes[0])["input"])
        if meta is None or meta.dtype not in _KERNEL_DTYPES:  # the kernel's tl.dot dtypes
            offered = tuple(b for b in offered if b != "triton")
        return offered

    def options(self, nodes: Sequence[fx.Node], ctx: RewriteContext) -> tuple[Cost, dict[str, Cost]]:
        """The members' cost as they are, and the cost of each grouped form offered."""
        meta = ctx.meta(ctx.must_canon(nodes[0])["input"])
        assert isinstance(meta, TensorMeta)
        item = meta.dtype.itemsize
        has_bias = ctx.must_canon(nodes[0])["bias"] is not None
        shapes = _shapes(nodes, ctx)
        g = len(shapes)
        each = [(m * k + n * k + m * n + (n if has_bias else 0)) * item for m, k, n in shapes]
        flops = sum(2.0 * m * k * n for m, k, n in shapes)
        before = Cost(launches=g, bytes=float(sum(each)), flops=flops)
        out: dict[str, Cost] = {}
        for backend in self.backends(nodes, ctx):
            if backend == "triton":
                bm, bn = _tile(max(s[0] for s in shapes)), _tile(max(s[2] for s in shapes))
                tile_flops = sum(2.0 * _round_up(m, bm) * _round_up(n, bn) * k for m, k, n in shapes)
                table = (9 * g + g + 1) * 8.0
                host = float(getattr(ctx.cost_model, "grouped_kernel_host_launches", TRITON_HOST_LAUNCHES))
                out[backend] = Cost(launches=2.0 + host, bytes=before.bytes + table, flops=tile_flops)
            elif backend == "padded":
                mm = max(s[0] for s in shapes)
                kk = max(s[1] for s in shapes)
                nn = max(s[2] for s in shapes)
                padded = g * (mm * kk + nn * kk + mm * nn + (nn if has_bias else 0)) * item
                if ctx.inductor:  # pads + stacks fuse into one kernel per operand; slices into one
                    launches = (3.0 if has_bias else 2.0) + 1.0 + 1.0
                else:  # pad and stack each operand, bmm, a contiguous copy per output
                    launches = (3.0 if has_bias else 2.0) * (g + 1) + 1.0 + 1.1 * g
                out[backend] = Cost(
                    launches=launches, bytes=before.bytes + 2.0 * padded, flops=2.0 * g * mm * kk * nn
                )
        return before, out

    def choose(self, nodes: Sequence[fx.Node], ctx: RewriteContext) -> tuple[Cost, str, Cost]:
        """(cost before, the cheapest form on this device, its cost)."""
        before, options = self.options(nodes, ctx)
        if not options:  # nothing offered (e.g. only triton, for a dtype it lacks): no change
            return before, "none", before
        device = ctx.device_of(nodes)
        best = min(options, key=lambda k: ctx.cost_model.seconds(options[k], device))
        return before, best, options[best]

    def cost(self, nodes: Sequence[fx.Node], ctx: RewriteContext) -> tuple[Cost, Cost]:
        before, _, after = self.choose(nodes, ctx)
        return before, after

    # -- rewriting --------------------------------------------------------------------------------
    def fuse(self, nodes: Sequence[fx.Node], b: Builder) -> Sequence[fx.Node] | None:
        canons = [b.ctx.must_canon(n) for n in nodes]
        _, backend, _ = self.choose(nodes, b.ctx)
        if backend == "none":
            return None
        xs = [c["input"] for c in canons]
        ws = [c["weight"] for c in canons]
        bs = [c["bias"] for c in canons] if canons[0]["bias"] is not None else []
        if backend == "triton":
            out = b.call(torch.ops.optimus.grouped_linear.default, xs, ws, bs, "none", "triton")
            return [b.getitem(out, i) for i in range(len(nodes))]
        return _padded(xs, ws, bs, _shapes(nodes, b.ctx), b)


def _padded(
    xs: list[Any], ws: list[Any], bs: list[Any], shapes: list[tuple[int, int, int]], b: Builder
) -> list[fx.Node]:
    """pad + stack + baddbmm + contiguous slices (see the module docstring)."""
    mm, kk, nn = (max(s[i] for s in shapes) for i in range(3))
    xp = b.call(
        torch.stack,
        [b.call(F.pad, x, (0, kk - k, 0, mm - m)) for x, (m, k, _) in zip(xs, shapes, strict=True)],
    )
    wp = b.call(
        torch.stack,
        [b.call(F.pad, w, (0, kk - k, 0, nn - n)) for w, (_, k, n) in zip(ws, shapes, strict=True)],
    )
    wt = b.method("transpose", wp, 1, 2)
    if bs:
        bp = b.call(
            torch.stack,
            [b.call(F.pad, bias, (0, nn - n)) for bias, (_, _, n) in zip(bs, shapes, strict=True)],
        )
        out = b.call(torch.baddbmm, b.method("unsqueeze", bp, 1), xp, wt)
    else:
        out = b.call(torch.bmm, xp, wt)
    pieces = b.unbind(out, len(shapes))
    return [
        b.method(
            "clone",
            b.call(torch.narrow, b.call(torch.narrow, p, 0, 0, m), 1, 0, n),
            memory_format=torch.contiguous_format,
        )
        for p, (m, _, n) in zip(pieces, shapes, strict=True)
    ]
