"""matmul_as_linear: ``x @ W``, ``torch.matmul(x, W)``, ``x.matmul(W)`` and
``torch.tensordot(x, W, dims=1)`` (or ``dims=([-1], [0])``) with ``W`` a 2-D parameter or buffer
(a ``get_attr``, or a graph input under ``torch.compile``, where parameters are inputs)
-> ``F.linear(x, W.t())``.

WHY: model zoos write projections as matmuls with a parameter (AutoInt's and FiBiNET's attention
``tensordot(x, W_q)``, DCN-v2's ``x @ W``). They are linears, but the batching and merge rules only
see ``linear``, so parallel projections of one input stay G separate GEMMs. Rewritten, every
linear rule sees them; the re-layout stacks the ``W.t()`` members from the parameters themselves
(see ``RelayoutParams``: a transposed parameter is its parameter, laid out the other way).

Exactness: ``linear(x, W.t())`` runs the same GEMM on the same operands (``mm(x, W)``), so values,
dtype, gradients and the contiguous ``[..., N]`` result are eager's. The new node keeps the
matmul's captured meta (its ``requires_grad`` included); when its computed shape, dtype or strides
differ from the matmul's, the rewrite is undone. A cleanup: it changes no kernel, so it is never
a loss by itself; what it enables is priced by the rules that batch it.
"""

from __future__ import annotations

import operator
from typing import Any

import torch
import torch.nn.functional as F
from torch import fx

from optimus.engine.context import RewriteContext
from optimus.engine.rule import CleanupRule
from optimus.semantics.meta import tensor_meta

_MATMULS = (torch.matmul, operator.matmul)


def _operands(node: fx.Node) -> tuple[Any, Any] | None:
    """(x, W) of a matmul-shaped call contracting x's last dim with W's first, else None."""
    if node.op == "call_function" and node.target in _MATMULS and len(node.args) == 2 and not node.kwargs:
        return node.args[0], node.args[1]
    if node.op == "call_method" and node.target in ("matmul", "__matmul__") and len(node.args) == 2:
        return node.args[0], node.args[1]
    if node.op == "call_function" and node.target is torch.tensordot:
        args: list[Any] = list(node.args) + [None] * (3 - len(node.args))
        x, w = args[0], args[1]
        dims: Any = node.kwargs.get("dims", args[2])
        if set(node.kwargs) - {"dims"}:
            return None
        x_meta = tensor_meta(x) if isinstance(x, fx.Node) else None
        last = len(x_meta.shape) - 1 if x_meta is not None else None
        if dims == 1 or (
            isinstance(dims, (list, tuple))
            and len(dims) == 2
            and list(dims[1]) == [0]
            and len(dims[0]) == 1
            and dims[0][0] in (-1, last)
        ):
            return x, w
    return None


class MatmulAsLinear(CleanupRule):
    name = "matmul_as_linear"

    def run(self, ctx: RewriteContext) -> int:
        graph = ctx.graph
        changed = 0
        for node in list(graph.nodes):
            found = _operands(node)
            if found is None or not ctx.movable(node):
                continue
            x, w = found
            # W a parameter or buffer: a get_attr here, a graph input under torch.compile
            if (
                not isinstance(x, fx.Node)
                or not isinstance(w, fx.Node)
                or w.op not in ("get_attr", "placeholder")
            ):
                continue
            x_meta, w_meta, out_meta = tensor_meta(x), tensor_meta(w), tensor_meta(node)
            if (
                x_meta is None
                or w_meta is None
                or out_meta is None
                or len(w_meta.shape) != 2
                or not x_meta.shape
            ):
                continue
            with graph.inserting_before(node):
                weight = graph.call_method("t", (w,))
                new = graph.call_function(F.linear, (x, weight))
            if tensor_meta(new) != out_meta or out_meta.stride is None:
                graph.erase_node(new)
                graph.erase_node(weight)
                ctx.decline("matmul_as_linear: linear's result would differ in shape, dtype or layout")
                continue
            new.meta.update(node.meta)  # the captured value (requires_grad) of the same tensor
            node.replace_all_uses_with(new)
            graph.erase_node(node)
            changed += 1
        return changed
