"""batch_gate_pool: T gate-weighted poolings of ONE experts tensor -> one ``bmm``:

    (g_t[B, E, 1] * S[B, E, D]).sum(1)       for t < T  ->  bmm(stack(g_t.squeeze(-1), 1), S)[:, t]
    matmul(g_t[B, 1, E], S[B, E, D])         for t < T  ->  bmm(stack(g_t.squeeze(1), 1), S)[:, t:t+1]

(``*``/``torch.mul``/``.mul`` then ``.sum(1)``/``torch.sum(x, 1)``, keepdim or not, ``-2`` for 1;
``torch.matmul``/``@``/``.matmul``/``torch.bmm``/``.bmm``.)

WHY: multi-task models pool one stack of experts once per task: this repository's mmoe writes
``(softmax(gate(x)).unsqueeze(-1) * experts).sum(1)``, DeepCTR's MMOE
``matmul(softmax(gate).unsqueeze(1), stack(experts, 1))``. T poolings read S T times and launch
T (matmul) or 2T (multiply, sum) ops forward and more backward; one ``bmm`` over the stacked
gates ``[B, T, E]`` reads S once. (DeepCTR's PLE pools a *different* stack per task, task experts
plus shared ones: nothing to share, the rule leaves it alone.)

Price: one stack of the gates, one bmm, views per task, and a ``.contiguous()`` copy for each
result whose strides a consumer can observe (``keep_layouts``; the pieces ``out[:, t]`` are strided
where eager's results are contiguous). On CPU with a gradient the bmm's backward runs one small
GEMM per batch row (measured in ``vector_matmul``'s docstring): the bmm is priced at
``vector_matmul.PER_ROW_LAUNCHES`` launches per row, once for the T tasks. The members are priced
by the same functions ``vector_matmul`` uses for the two single-task forms, so the two rules agree:
T matmuls cost T per-row backward passes, one bmm of T rows costs one, so the matmul form is
batched even where ``vector_matmul`` would turn each matmul into a multiply and sum.
The multiply-and-sum form in training on CPU is declined outright: measured forward+backward
(1 thread, loaded machine) the bmm was slower at T=2, E=4, D=32 for B=64 and B=1024 (the
backward of the per-task views and the per-row GEMMs), faster only at T=3, E=8, D=64, B=1024; the
analytic model overprices the cache-sized [B, E, D] product and would fire at the slower shapes.
No ping-pong: the bmm this rule builds has T >= 2 rows, which ``vector_matmul`` never rewrites,
and the multiply-and-sums ``vector_matmul`` makes (on CPU, in training) are the form this rule
declines there. Where both offer a rewrite of the same matmuls the driver applies the one the cost
model rates higher; neither undoes the other. Listed before ``vector_matmul`` in the registry
(ties go to the batched form).

Exactness: the same products summed in another order (values within rounding); shape, dtype,
grad mode and contiguity are eager's. Declines: not float32/float64 or the operands' dtypes differ
from the result's (autocast, half precision: the sum would accumulate otherwise), a multiply and
sum under autocast (the bmm would run in low precision there), a multiply whose product has
another reader or lies in another grad/autocast region than its sum, broadcasting (batch or
expert dims that differ), D = 1 (which operand is the gate is ambiguous). In-place writes and
random ops are ordered by the engine (``optimus.semantics.effects``): a pooling that reads a written experts
tensor or gate is not movable and is never grouped. Groups are split by region and by
``requires_grad`` by the engine (``RewriteContext.horizontal_candidates``).
"""

from __future__ import annotations

import operator
from collections.abc import Hashable, Sequence

import torch
from torch import fx

from optimus.engine.builder import Builder
from optimus.engine.context import RewriteContext
from optimus.engine.rule import Cost, HorizontalRule
from optimus.rules.batch.vector_matmul import (
    PER_ROW_LAUNCHES,
    matmul_operands,
    row_matmul_cost,
    row_mul_sum_cost,
)
from optimus.semantics.layouts import copies_if_strided
from optimus.semantics.meta import TensorMeta, output_requires_grad

_MULS = (operator.mul, torch.mul)
_DTYPES = (torch.float32, torch.float64)


def _sum_parts(node: fx.Node) -> tuple[fx.Node, int, bool] | None:
    """(input, dim, keepdim) of ``x.sum(dim)`` / ``torch.sum(x, dim)`` with no dtype."""
    if not (
        (node.op == "call_method" and node.target == "sum")
        or (node.op == "call_function" and node.target is torch.sum)
    ):
        return None
    args, kwargs = list(node.args), dict(node.kwargs)
    if not args or set(kwargs) - {"dim", "keepdim"} or len(args) > 3:
        return None
    x = args[0]
    dim = args[1] if len(args) > 1 else kwargs.get("dim")
    keepdim = args[2] if len(args) > 2 else kwargs.get("keepdim", False)
    if isinstance(dim, (list, tuple)) and len(dim) == 1:
        dim = dim[0]
    if not isinstance(x, fx.Node) or not isinstance(dim, int) or not isinstance(keepdim, bool):
        return None
    return x, dim, keepdim


def _mul_operands(node: fx.Node) -> tuple[fx.Node, fx.Node] | None:
    if node.kwargs or len(node.args) != 2:
        return None
    if not (
        (node.op == "call_function" and node.target in _MULS)
        or (node.op == "call_method" and node.target == "mul")
    ):
        return None
    a, c = node.args
    return (a, c) if isinstance(a, fx.Node) and isinstance(c, fx.Node) else None


def _under_autocast(node: fx.Node, ctx: RewriteContext) -> bool:
    """Does ``node`` run inside an autocast region (or after a context we cannot read)?"""
    regions = ctx.index.regions
    seg = regions.of(node)
    if regions.trivial or seg is None:
        return False
    depth = 0
    for boundary in regions.boundaries:
        if regions.segment[boundary] >= seg:
            break
        if boundary.target is torch.amp.autocast_mode._enter_autocast:
            depth += 1
        elif boundary.target is torch.amp.autocast_mode._exit_autocast:
            depth -= 1
        elif boundary.op == "call_function" and boundary.target is not torch._C._set_grad_enabled:
            return True  # inference mode or an unknown context: be safe
    return depth > 0


def pooling(node: fx.Node, ctx: RewriteContext) -> tuple[str, fx.Node, fx.Node, bool] | None:
    """(form, gate, experts, keepdim) of a gate-weighted pooling, ``form`` "mul" or "matmul"."""
    summed = _sum_parts(node)
    if summed is not None:
        mul, dim, keepdim = summed
        ops = _mul_operands(mul)
        if ops is None or len(mul.users) != 1 or not ctx.movable(mul):
            return None
        regions = ctx.index.regions
        if not regions.trivial and regions.of(mul) != regions.of(node):
            return None
        a, c = (ctx.meta(o) for o in ops)
        if a is None or c is None or len(a.shape) != 3 or len(c.shape) != 3 or dim not in (1, -2):
            return None
        if a.shape[2] == 1 and c.shape[2] > 1:
            gate, experts = ops
        elif c.shape[2] == 1 and a.shape[2] > 1:
            experts, gate = ops
        else:
            return None
        return "mul", gate, experts, keepdim
    ops = matmul_operands(node)
    if ops is None:
        return None
    return "matmul", ops[0], ops[1], True


class BatchGatePool(HorizontalRule):
    name = "batch_gate_pool"

    def key(self, node: fx.Node, ctx: RewriteContext) -> Hashable | None:
        found = pooling(node, ctx)
        if found is None:
            return None
        form, gate, experts, keepdim = found
        g, s, out = ctx.meta(gate), ctx.meta(experts), ctx.meta(node)
        if g is None or s is None or out is None or len(g.shape) != 3 or len(s.shape) != 3:
            return None
        b, e, d = s.shape
        want = (b, e, 1) if form == "mul" else (b, 1, e)
        if g.shape != want or d < 2:
            return None
        if g.dtype not in _DTYPES or not g.dtype == s.dtype == out.dtype:
            ctx.decline("batch_gate_pool: not float32/float64, or autocast changes the dtype")
            return None
        if form == "mul" and s.device.type == "cpu" and output_requires_grad(node):
            ctx.decline("batch_gate_pool: multiply and sum in training on CPU (the bmm backward is per row)")
            return None
        if form == "mul" and _under_autocast(node, ctx):
            ctx.decline("batch_gate_pool: multiply and sum under autocast (the bmm would not be float32)")
            return None
        return (form, experts, keepdim, s.shape, s.dtype, s.device)

    def fuse(self, nodes: Sequence[fx.Node], b: Builder) -> Sequence[fx.Node] | None:
        found = [pooling(n, b.ctx) for n in nodes]
        if any(f is None for f in found):
            return None
        form, _, experts, keepdim = found[0]  # type: ignore[misc]
        squeeze = -1 if form == "mul" else 1
        gates = b.stack([b.method("squeeze", f[1], squeeze) for f in found if f is not None], 1)
        out = b.call(torch.bmm, gates, experts)  # [B, T, D]
        if keepdim:
            return [b.method("narrow", out, 1, t, 1) for t in range(len(nodes))]
        return [b.method("select", out, 1, t) for t in range(len(nodes))]

    def cost(self, nodes: Sequence[fx.Node], ctx: RewriteContext) -> tuple[Cost, Cost]:
        form, gate, experts, _ = pooling(nodes[0], ctx)  # type: ignore[misc]
        g, s = ctx.meta(gate), ctx.meta(experts)
        assert g is not None and s is not None
        t = len(nodes)
        grad = output_requires_grad(nodes[0]) is True
        per_row = PER_ROW_LAUNCHES if grad and s.device.type == "cpu" else 0.0
        one = row_matmul_cost if form == "matmul" else row_mul_sum_cost
        before = Cost()
        for _ in nodes:
            before = before + one(g, s, grad, per_row)
        stacked = TensorMeta((s.shape[0], t, s.shape[1]), g.dtype, g.device, None)
        after = row_matmul_cost(stacked, s, grad, per_row)
        gate_bytes = 2.0 * t * g.nbytes * (2.0 if grad else 1.0)  # the stack, and its backward
        pieces = Cost(launches=0.1 * t)  # views of [B, T, D]
        if grad:  # each view's backward fills a zero [B, T, D] and autograd adds the T of them
            out_bytes = float(s.shape[0] * t * s.shape[2] * s.dtype.itemsize)
            pieces = pieces + Cost(launches=3.0 * t - 1.0, bytes=(4.0 * t - 3.0) * out_bytes)
        after = after + Cost(launches=(2.0 if grad else 1.0) + 0.1 * t, bytes=gate_bytes) + pieces
        after = after + copies_if_strided(nodes, ctx)
        return before, after


__all__ = ["BatchGatePool", "pooling"]
