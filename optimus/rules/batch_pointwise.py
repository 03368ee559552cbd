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
"""

from __future__ import annotations

from collections.abc import Hashable, Sequence
from typing import Any

from torch import fx

from ..builder import Builder
from ..context import RewriteContext
from ..normalize import EMIT, OPS, UNARY_POINTWISE, _hashable
from .base import Cost, HorizontalRule


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
        x = b.stack([c["input"] for c in canons])
        return b.unbind(b.call(EMIT[op], x, **settings), len(nodes))

    def cost(self, nodes: Sequence[fx.Node], ctx: RewriteContext) -> tuple[Cost, Cost]:
        inputs = [ctx.must_canon(n)["input"] for n in nodes]
        nbytes = float(sum(m.nbytes for m in (ctx.meta(v) for v in inputs) if m is not None))
        stack_bytes = ctx.stack_bytes(inputs)
        before = Cost(launches=len(nodes), bytes=2 * nbytes, flops=nbytes / 4)
        after = Cost(launches=1.5 + (stack_bytes > 0), bytes=2 * nbytes + stack_bytes, flops=nbytes / 4)
        return before, after


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
        a = b.stack([f[0] for f in forms])  # type: ignore[index]
        second = forms[0][1]  # type: ignore[index]
        bb = b.stack([f[1] for f in forms]) if isinstance(second, fx.Node) else second  # type: ignore[index]
        out = b.call(EMIT[canon.op], a, bb, **forms[0][2])  # type: ignore[index]
        return b.unbind(out, len(nodes))

    def cost(self, nodes: Sequence[fx.Node], ctx: RewriteContext) -> tuple[Cost, Cost]:
        forms = [self._form(n, ctx) for n in nodes]
        firsts = [f[0] for f in forms]  # type: ignore[index]
        nbytes = float(sum(m.nbytes for m in (ctx.meta(v) for v in firsts) if m is not None))
        stacks = ctx.stack_bytes(firsts)
        launches = 1.5 + (stacks > 0)
        reads = 2.0
        if isinstance(forms[0][1], fx.Node):  # type: ignore[index]
            seconds = [f[1] for f in forms]  # type: ignore[index]
            more = ctx.stack_bytes(seconds)
            stacks += more
            launches += more > 0
            reads = 3.0
        before = Cost(launches=len(nodes), bytes=reads * nbytes, flops=nbytes / 4)
        after = Cost(launches=launches, bytes=reads * nbytes + stacks, flops=nbytes / 4)
        return before, after
