"""batch_slice_matmul: G matmuls with slices ``P[..][e]`` of one tensor -> one ``bmm`` over
the unsliced ``P``:

    x_e @ P[e]        (x_e [..., M, a], P [E, a, b])   ->  bmm(stack(x_e.reshape(-1, a)), P)
    P[e] @ x_e        (x_e [..., b, 1], P [E, a, b])   ->  bmm(stack(x_e.reshape(-1, b)), P.mT)

(``P[e].t()`` too, ``P[i][e]`` for a 4-D ``P``, ``torch.matmul``/``@``/``.matmul``), then one
``reshape`` and ``unbind`` back to each member's shape. The slices must be a run of consecutive
``e`` (``P.narrow``, a view: no copy of the parameter); a shared ``x`` is expanded, not copied.

WHY: DeepCTR's DCNMix runs, per layer and expert, ``matmul(V[i][e].t(), x)``,
``matmul(C[i][e], v)``, ``matmul(U[i][e], v)`` with ``V``, ``C``, ``U`` parameters of shape
``[L, E, in, r]``: 3 * L * E small GEMMs, each a launch forward and two backward. One bmm per
(layer, role) does the same arithmetic in one launch. Gradients land on ``P`` as before (through
the narrow instead of E selects); values within rounding (the same dot products).

Only ``x`` whose last dim is 1 for the weight-on-the-left form (DCNMix's column vectors: the GEMM
folds into rows); any ``x`` with two or more dims for the weight on the right. Priced: the stack of
the inputs (none when they are one tensor), the bmm, and a ``.contiguous()`` copy where a consumer
observes a member's strides (``keep_layouts``); declined where the slices are not consecutive,
the dtypes differ (autocast, mixed precision), or the shapes are not the ones above. In-place
writes to ``P`` or an input order the nodes (``optimus.semantics.effects``): such matmuls are not movable.
"""

from __future__ import annotations

import operator
from collections.abc import Hashable, Sequence
from dataclasses import dataclass

import torch
from torch import fx

from optimus.engine.builder import Builder
from optimus.engine.context import RewriteContext
from optimus.engine.rule import Cost, HorizontalRule
from optimus.rules.batch.vector_matmul import matmul_operands
from optimus.semantics.layouts import copies_if_strided
from optimus.semantics.meta import output_requires_grad


@dataclass(frozen=True)
class SliceMatmul:
    """One member: ``out = rows(x) @ wt`` with ``wt`` the slice ``index`` of ``base`` (transposed
    when ``flip``): ``base`` is ``root[prefix]``."""

    root: fx.Node
    prefix: tuple[int, ...]
    index: int
    flip: bool
    left: bool  # the slice is the left operand
    x: fx.Node


def _slice(node: fx.Node) -> tuple[fx.Node, tuple[int, ...]] | None:
    """(root, indices) of ``root[i][j]..`` (``operator.getitem`` with int indices), else None."""
    indices: list[int] = []
    while node.op == "call_function" and node.target is operator.getitem and len(node.args) == 2:
        base, i = node.args
        if not isinstance(base, fx.Node) or not isinstance(i, int) or isinstance(i, bool) or i < 0:
            return None
        indices.append(i)
        node = base
    return (node, tuple(reversed(indices))) if indices else None


def _weight(node: fx.Node) -> tuple[fx.Node, tuple[int, ...], bool] | None:
    """(root, indices, transposed) of a slice ``P[..]`` or ``P[..].t()``."""
    flip = node.op == "call_method" and node.target == "t" and len(node.args) == 1 and not node.kwargs
    inner = node.args[0] if flip else node
    if not isinstance(inner, fx.Node):
        return None
    found = _slice(inner)
    return None if found is None else (*found, flip)


def slice_matmul(node: fx.Node, ctx: RewriteContext) -> SliceMatmul | None:
    ops = matmul_operands(node)
    if ops is None or node.target in (torch.bmm, "bmm"):
        return None
    for left in (True, False):
        w, x = ops if left else (ops[1], ops[0])
        found = _weight(w)
        if found is None:
            continue
        root, indices, flip = found
        wm, xm = ctx.meta(w), ctx.meta(x)
        if wm is None or xm is None or len(wm.shape) != 2 or len(xm.shape) < 2:
            continue
        if left and xm.shape[-1] != 1:
            continue  # P[e] @ x folds into rows only for column vectors
        return SliceMatmul(root, indices[:-1], indices[-1], flip, left, x)
    return None


def _shapes(node: fx.Node, m: SliceMatmul, ctx: RewriteContext) -> tuple[int, int, int] | None:
    """(rows M, inner k, cols c) of ``rows(x)[M, k] @ wt[k, c]``."""
    xm, out = ctx.meta(m.x), ctx.meta(node)
    if xm is None or out is None:
        return None
    k = xm.shape[-2] if m.left else xm.shape[-1]
    rows = xm.numel // max(k, 1)
    return rows, k, out.numel // max(rows, 1)


class BatchSliceMatmul(HorizontalRule):
    name = "batch_slice_matmul"

    def key(self, node: fx.Node, ctx: RewriteContext) -> Hashable | None:
        m = slice_matmul(node, ctx)
        if m is None:
            return None
        base = ctx.meta(m.root)
        xm, out, w = ctx.meta(m.x), ctx.meta(node), ctx.meta(node.args[0] if m.left else node.args[1])
        if base is None or xm is None or out is None or w is None:
            return None
        if len(base.shape) != len(m.prefix) + 3 or not out.dtype == xm.dtype == w.dtype:
            if len(base.shape) == len(m.prefix) + 3:
                ctx.decline("batch_slice_matmul: operand dtypes differ from the result's")
            return None
        if not out.dtype.is_floating_point:
            return None
        return (m.root, m.prefix, m.flip, m.left, xm.shape, xm.dtype, xm.device)

    def _members(self, nodes: Sequence[fx.Node], ctx: RewriteContext) -> list[SliceMatmul] | None:
        found = [slice_matmul(n, ctx) for n in nodes]
        members = [m for m in found if m is not None]
        if len(members) != len(nodes):
            return None
        first = min(m.index for m in members)
        if sorted(m.index for m in members) != list(range(first, first + len(members))):
            return None
        return members  # any order: member i reads piece ``index - first``

    def fuse(self, nodes: Sequence[fx.Node], b: Builder) -> Sequence[fx.Node] | None:
        members = self._members(nodes, b.ctx)
        shapes = _shapes(nodes[0], members[0], b.ctx) if members else None
        out = b.ctx.meta(nodes[0])
        if members is None or shapes is None or out is None:
            return None
        g, (rows, k, _), m0 = len(members), shapes, members[0]
        first = min(m.index for m in members)
        ordered = sorted(members, key=lambda m: m.index)
        base = m0.root
        for i in m0.prefix:
            base = b.getitem(base, i)
        w = b.method("narrow", base, 0, first, g)  # [G, p, q]: a view of P
        if m0.left != m0.flip:
            w = b.method("transpose", w, 1, 2)  # wt = P[e].mT
        xs = [m.x for m in ordered]
        if all(x is xs[0] for x in xs):
            x = b.method("expand", b.method("unsqueeze", b.method("reshape", xs[0], rows, k), 0), g, rows, k)
        else:
            x = b.stack([b.method("reshape", x, rows, k) for x in xs])
        batched = b.method("reshape", b.call(torch.bmm, x, w), g, *out.shape)
        pieces = b.unbind(batched, g)
        return [pieces[m.index - first] for m in members]

    def cost(self, nodes: Sequence[fx.Node], ctx: RewriteContext) -> tuple[Cost, Cost]:
        members = self._members(nodes, ctx)
        if members is None:
            ctx.decline("batch_slice_matmul: slices not consecutive")
            return Cost(), Cost(launches=1e9)  # never rated faster
        m0 = members[0]
        shapes, xm, out = _shapes(nodes[0], m0, ctx), ctx.meta(m0.x), ctx.meta(nodes[0])
        if shapes is None or xm is None or out is None:
            return Cost(), Cost(launches=1e9)
        g, (rows, k, c) = len(nodes), shapes
        grad = output_requires_grad(nodes[0]) is True
        passes = 3.0 if grad else 1.0  # forward, and the two GEMMs of the backward
        w_bytes = float(k * c * xm.dtype.itemsize)
        one = xm.nbytes + w_bytes + out.nbytes
        before = Cost(launches=g * passes, bytes=g * passes * one, flops=g * passes * 2.0 * rows * k * c)
        shared = all(m.x is m0.x for m in members)
        stack = (
            Cost()
            if shared
            else Cost(launches=2.0 if grad else 1.0, bytes=2.0 * g * xm.nbytes * (2 if grad else 1))
        )
        views = Cost(launches=0.1 * (g + 4))
        after = Cost(launches=passes, bytes=passes * g * one, flops=g * passes * 2.0 * rows * k * c)
        if shared and grad:  # the expand's backward sums G gradients of x
            after = after + Cost(launches=1.0, bytes=(g + 1.0) * xm.nbytes)
        return before, after + stack + views + copies_if_strided(nodes, ctx)


__all__ = ["BatchSliceMatmul", "slice_matmul"]
