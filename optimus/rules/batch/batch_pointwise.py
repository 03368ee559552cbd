"""Horizontal batching of pointwise ops.

batch_unary:  f(x_i, **s) for i < G -> unbind(f(stack(x_i), **s)), when f is the same unary
    pointwise op with equal settings (every argument of its schema: clamp bounds, nan_to_num
    values, negative_slope, approximate, ...), the x_i share shape/dtype/device, no call is in
    place, and the calls are independent.
batch_binary: g(a_i, b_i, **s) for i < G -> unbind(g(stack(a_i), stack(b_i), **s)) for
    add/sub/mul/div/maximum/minimum/pow, when the tensor operands all share one shape (no
    broadcasting), a scalar operand is equal across the group (``2 * x``, ``x / 3.0``), alpha and
    rounding_mode are equal, and nothing is in place. ``scalar + x`` / ``scalar * x`` are
    commuted; other scalar-first forms are left alone.

Layout: each result is a piece ``unbind(out, 0)[i]``; it is contiguous when the stacked input is
(a ``torch.stack`` copy). When the inputs are stacked as a free view of the pieces of one split
(``x.unflatten(d, (n, k)).movedim(d, 0)``), the results are strided slices of one tensor where
eager's are contiguous: where a consumer can observe that, the inputs are stacked with a real
copy instead (one copy, priced; contiguous results by construction).
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
from optimus.semantics.layouts import layout_observed
from optimus.semantics.meta import TensorMeta
from optimus.semantics.normalize import EMIT, OPS, UNARY_POINTWISE, _hashable


class BatchUnary(HorizontalRule):
    name = "batch_unary"

    def key(self, node: fx.Node, ctx: RewriteContext) -> Hashable | None:
        canon = ctx.canon(node)
        if canon is None or canon.op not in UNARY_POINTWISE or canon.inplace:
            return None
        if any(isinstance(v, fx.Node) for k, v in canon.kwargs.items() if k != "input"):
            return None  # e.g. clamp with tensor bounds
        x = ctx.meta(canon["input"])
        if x is None:
            return None
        return ("unary", canon.op, canon.settings("input"), x.shape, x.dtype, x.device)

    def fuse(self, nodes: Sequence[fx.Node], b: Builder) -> Sequence[fx.Node]:
        canons = [b.ctx.must_canon(n) for n in nodes]
        op = canons[0].op
        settings = {k: v for k, v in canons[0].kwargs.items() if k != "input"}
        inputs = [c["input"] for c in canons]
        copy = _strided_views(nodes, [inputs], b.ctx)
        x = _stack(inputs, copy[0], b)
        return b.unbind(b.call(EMIT[op], x, **settings), len(nodes))

    def cost(self, nodes: Sequence[fx.Node], ctx: RewriteContext) -> tuple[Cost, Cost]:
        inputs = [ctx.must_canon(n)["input"] for n in nodes]
        nbytes = float(sum(m.nbytes for m in (ctx.meta(v) for v in inputs) if m is not None))
        stack_bytes = 2 * nbytes if _strided_views(nodes, [inputs], ctx)[0] else ctx.stack_bytes(inputs)
        held, holds = horizontal_live(nodes, ctx.live, stack_bytes / 2)  # a copied stack: alive beside
        before = Cost(launches=len(nodes), bytes=2 * nbytes, flops=nbytes / 4, live_bytes=held)
        after = Cost(
            launches=1.5 + (stack_bytes > 0),
            bytes=2 * nbytes + stack_bytes,
            flops=nbytes / 4,
            live_bytes=holds,
        )
        return before, after


def _stack(values: Sequence[Any], copy: bool, b: Builder) -> fx.Node:
    """A real (contiguous) stack when ``copy``, else ``Builder.stack`` (a view where it can)."""
    return b.call(torch.stack, list(values)) if copy else b.stack(values)


def _strided_views(
    nodes: Sequence[fx.Node], operands: Sequence[Sequence[Any]], ctx: RewriteContext
) -> list[bool]:
    """For each operand list: stack it with a real copy instead of the free view ``Builder.stack``
    would make? Yes for a strided view when the results' layout (a pointwise op follows its
    inputs' strides) would differ from eager's where a consumer can observe it."""
    probe = Builder.__new__(Builder)
    probe.ctx = ctx
    views: list[TensorMeta | None] = []
    for values in operands:
        tensors = all(isinstance(v, fx.Node) for v in values)
        views.append(probe.stack_view_meta(values) if tensors else None)
    strided = [v is not None and v.is_contiguous is False for v in views]
    if not any(strided):
        return strided
    first = ctx.meta(nodes[0])
    metas = [m for m in views if m is not None and m.stride is not None]
    if first is None or len(metas) != sum(1 for v in views if v is not None):
        return strided  # layout unknown: copy
    shape = (len(nodes), *first.shape)
    ts = [torch.empty_strided(m.shape, m.stride, device="meta") for m in metas]  # type: ignore[arg-type]
    result = ts[0] if len(ts) == 1 else ts[0] + ts[1]  # (+ of the other, contiguous operand: same order)
    piece = torch.empty(shape, device="meta")[0] if result.shape != shape else result[0]
    found = TensorMeta(tuple(piece.shape), first.dtype, first.device, tuple(piece.stride()))
    if any(layout_observed(n, found, ctx) for n in nodes):
        return strided
    return [False] * len(strided)


_COMMUTATIVE = {"add", "mul", "maximum", "minimum"}
_SCALAR_OK = {"add", "sub", "mul", "div", "pow"}


def _operands(canon: Any) -> tuple[str, str, dict[str, Any]]:
    first, second = (name for name, _ in OPS[canon.op][:2])
    rest = {k: v for k, v in canon.kwargs.items() if k not in (first, second)}
    return first, second, rest


class BatchBinary(HorizontalRule):
    name = "batch_binary"

    def _form(self, node: fx.Node, ctx: RewriteContext) -> tuple[Any, Any, dict[str, Any]] | None:
        """(tensor-or-scalar a, tensor-or-scalar b, settings) with a tensor first, or None."""
        canon = ctx.canon(node)
        if (
            canon is None
            or canon.op not in EMIT
            or canon.inplace
            or canon.op not in ("add", "sub", "mul", "div", "maximum", "minimum", "pow")
        ):
            return None
        first, second, rest = _operands(canon)
        a, bb = canon[first], canon[second]
        if any(isinstance(v, fx.Node) for v in rest.values()):
            return None
        if not isinstance(a, fx.Node):
            if not isinstance(bb, fx.Node) or canon.op not in _COMMUTATIVE or rest.get("alpha", 1) != 1:
                return None
            a, bb = bb, a
        return a, bb, rest

    def key(self, node: fx.Node, ctx: RewriteContext) -> Hashable | None:
        form = self._form(node, ctx)
        if form is None:
            return None
        a, bb, rest = form
        canon = ctx.canon(node)
        assert canon is not None
        ma = ctx.meta(a)
        if ma is None:
            return None
        if isinstance(bb, fx.Node):
            mb = ctx.meta(bb)
            if mb is None or mb.shape != ma.shape or mb.device != ma.device:
                return None
            other: Hashable = ("tensor", mb.dtype)
        elif isinstance(bb, (int, float, bool)) and canon.op in _SCALAR_OK:
            other = ("scalar", _hashable(bb))
        else:
            return None
        settings = tuple((k, _hashable(v)) for k, v in rest.items())
        return ("binary", canon.op, settings, ma.shape, ma.dtype, ma.device, other)

    def fuse(self, nodes: Sequence[fx.Node], b: Builder) -> Sequence[fx.Node]:
        forms = [self._form(n, b.ctx) for n in nodes]
        canon = b.ctx.canon(nodes[0])
        assert canon is not None and all(f is not None for f in forms)
        firsts = [f[0] for f in forms]  # type: ignore[index]
        second = forms[0][1]  # type: ignore[index]
        seconds = [f[1] for f in forms] if isinstance(second, fx.Node) else None  # type: ignore[index]
        copy = _strided_views(nodes, [firsts] if seconds is None else [firsts, seconds], b.ctx)
        a = _stack(firsts, copy[0], b)
        bb = second if seconds is None else _stack(seconds, copy[1], b)
        out = b.call(EMIT[canon.op], a, bb, **forms[0][2])  # type: ignore[index]
        return b.unbind(out, len(nodes))

    def cost(self, nodes: Sequence[fx.Node], ctx: RewriteContext) -> tuple[Cost, Cost]:
        forms = [self._form(n, ctx) for n in nodes]
        firsts = [f[0] for f in forms]  # type: ignore[index]
        nbytes = float(sum(m.nbytes for m in (ctx.meta(v) for v in firsts) if m is not None))
        binary = isinstance(forms[0][1], fx.Node)  # type: ignore[index]
        seconds = [f[1] for f in forms] if binary else []  # type: ignore[index]
        copy = _strided_views(nodes, [firsts, seconds] if binary else [firsts], ctx)
        stacks = 2 * nbytes if copy[0] else ctx.stack_bytes(firsts)
        launches = 1.5 + (stacks > 0)
        reads = 2.0
        if binary:
            more = 2 * nbytes if copy[1] else ctx.stack_bytes(seconds)
            stacks += more
            launches += more > 0
            reads = 3.0
        held, holds = horizontal_live(nodes, ctx.live, stacks / 2)
        before = Cost(launches=len(nodes), bytes=reads * nbytes, flops=nbytes / 4, live_bytes=held)
        after = Cost(launches=launches, bytes=reads * nbytes + stacks, flops=nbytes / 4, live_bytes=holds)
        return before, after
