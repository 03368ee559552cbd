"""vector_matmul: a batched matmul with one row on the left or one column on the right, in
training on CPU -> a broadcast multiply and a sum:

    matmul(a[B, 1, E], S[B, E, D]) -> (a.transpose(1, 2) * S).sum(1, keepdim=True)   # [B, 1, D]
    matmul(S[B, M, E], v[B, E, 1]) -> (S * v.transpose(1, 2)).sum(2, keepdim=True)   # [B, M, 1]

(``torch.matmul``, ``@``, ``x.matmul``, ``torch.bmm``, ``x.bmm``).

WHY: this is how multi-task models pool their experts: MMoE and PLE compute
``matmul(gate.unsqueeze(1), stack(experts, 1))`` once per task (and attention-pooling models the
column form). On CPU the backward of such a bmm runs one small GEMM per batch row (the gradient of
``S`` is an outer product per sample), about 0.55 us each beyond the arithmetic. Measured side by
side (1 thread, forward+backward, a loss that is not a plain sum): B=1024, E=4, D=32: 890 us
against 320 us for the multiply-and-sum; at B=64, E=4, D=128: 124 against 108 us. (With
``out.sum().backward()`` the incoming gradient is an expanded, stride-0 tensor and the bmm
backward is 4-6x slower still.) Forward alone the bmm is as fast or faster at small B, so the rule
fires only where the result requires grad, and the cost model prices the bmm's backward at 0.07
launches per batch row against the multiply's bytes (the [B, E, D] product is written and read,
forward and backward). On CUDA a batched GEMM has no such per-row cost: the rule does not fire.

Exactness: the same products, summed in another order: values within rounding, as every batching
rule. Shape, dtype and the contiguous result are eager's. Declines: no gradient (forward only),
not float32/float64 (a half-precision sum accumulates otherwise), an output dtype other than the
operands' (autocast runs the matmul in low precision, the multiply would not), batch dims that
differ (broadcasting), both M and N above 1.
"""

from __future__ import annotations

import operator
from collections.abc import Sequence
from typing import Any

import torch
from torch import fx

from optimus.engine.builder import Builder
from optimus.engine.context import RewriteContext
from optimus.engine.node_set_rule import Found, NodeSetRule
from optimus.engine.rule import Cost
from optimus.semantics.layouts import built_meta, layout_safe
from optimus.semantics.meta import TensorMeta, output_requires_grad

_FUNCTIONS = (torch.matmul, operator.matmul, torch.bmm)
_METHODS = ("matmul", "__matmul__", "bmm")
_DTYPES = (torch.float32, torch.float64)
PER_ROW_LAUNCHES = 0.07  # the bmm backward's cost per batch row (0.55 us) in CPU launches (8 us)


def matmul_operands(node: fx.Node) -> tuple[fx.Node, fx.Node] | None:
    """The two operands of a matmul/bmm call (function, operator or method), else None."""
    if node.kwargs or len(node.args) != 2:
        return None
    if not (
        (node.op == "call_function" and node.target in _FUNCTIONS)
        or (node.op == "call_method" and node.target in _METHODS)
    ):
        return None
    a, s = node.args
    return (a, s) if isinstance(a, fx.Node) and isinstance(s, fx.Node) else None


def row_matmul_cost(a: TensorMeta, s: TensorMeta, grad: bool, per_row: float) -> Cost:
    """``matmul(a[B, M, E], s[B, E, D])`` forward (and backward with ``grad``): ``per_row``
    launches per batch row for the bmm backward. Shared with ``batch_gate_pool`` so the two rules
    price the same forms alike."""
    (b, m, e), d = a.shape, s.shape[2]
    out = float(b * m * d * a.dtype.itemsize)
    flops = 2.0 * b * m * e * d
    if not grad:
        return Cost(launches=1.0, bytes=a.nbytes + s.nbytes + out, flops=flops)
    return Cost(launches=3.0 + per_row * b, bytes=3.0 * (a.nbytes + s.nbytes + out), flops=3 * flops)


def row_mul_sum_cost(a: TensorMeta, s: TensorMeta, grad: bool, per_row: float = 0.0) -> Cost:
    """``(a.transpose(1, 2) * s).sum(1)`` for ``a`` [B, 1, E] or [B, E, 1] and ``s`` [B, E, D]: the
    [B, E, D] product is written and read (forward and backward). ``per_row`` is unused (no bmm)."""
    b, e, d = s.shape
    product = float(b * e * d * s.dtype.itemsize)
    flops = 2.0 * b * e * d
    if not grad:
        return Cost(launches=2.0, bytes=2.0 * product + a.nbytes + s.nbytes + product / e, flops=flops)
    return Cost(launches=2.0 + 4.0, bytes=7.0 * product + 3.0 * (a.nbytes + s.nbytes), flops=3 * flops)


def _row(a: torch.Tensor, s: torch.Tensor) -> torch.Tensor:
    return (a.transpose(1, 2) * s).sum(1, keepdim=True)


def _column(s: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
    return (s * v.transpose(1, 2)).sum(2, keepdim=True)


class VectorMatmul(NodeSetRule):
    name = "vector_matmul"
    anchors = frozenset({"matmul", "bmm"})

    def find(self, node: fx.Node, ctx: RewriteContext) -> Found | None:
        ops = matmul_operands(node)
        if ops is None:
            return None
        a, s = ctx.meta(ops[0]), ctx.meta(ops[1])
        out = ctx.meta(node)
        if a is None or s is None or out is None or len(a.shape) != 3 or len(s.shape) != 3:
            return None
        (b, m, e), (b2, e2, n) = a.shape, s.shape
        if b != b2 or e != e2 or not (m == 1 or n == 1):
            return None
        if a.device.type != "cpu":
            return None  # a batched GEMM's backward has no per-row cost there
        if not output_requires_grad(node):
            ctx.decline("vector_matmul: no gradient (forward only: the bmm is as fast)")
            return None
        if a.dtype not in _DTYPES or not a.dtype == s.dtype == out.dtype:
            ctx.decline("vector_matmul: not float32/float64, or autocast changes the dtype")
            return None
        form = _row if m == 1 else _column
        if not layout_safe(node, built_meta(form, ops[0], ops[1]), ctx):
            return None
        before = row_matmul_cost(a, s, True, PER_ROW_LAUNCHES)
        if m == 1:
            after = row_mul_sum_cost(a, s, True)
        else:  # the column form: the [B, M, E] product
            product = float(b * m * e * a.dtype.itemsize)
            flops = 2.0 * b * m * e * n
            after = Cost(launches=6.0, bytes=7.0 * product + 3.0 * (a.nbytes + s.nbytes), flops=3 * flops)
        return Found((node,), before, after, "row" if m == 1 else "column")

    def build(self, members: Sequence[fx.Node], data: Any, b: Builder) -> Sequence[fx.Node] | None:
        ops = matmul_operands(members[0])
        if ops is None:
            return None
        x, y = ops
        if data == "row":
            product = b.call(torch.mul, b.method("transpose", x, 1, 2), y)
            return [b.call(torch.sum, product, 1, keepdim=True)]
        product = b.call(torch.mul, x, b.method("transpose", y, 1, 2))
        return [b.call(torch.sum, product, 2, keepdim=True)]


__all__ = ["PER_ROW_LAUNCHES", "VectorMatmul", "matmul_operands", "row_matmul_cost", "row_mul_sum_cost"]
