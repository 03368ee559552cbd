"""noop_dropout: ``dropout(x, p=0, ...)`` or ``dropout(x, p, training=False)`` -> ``x``.

WHY: model zoos put a dropout after every layer and ship ``p = 0`` as the default (DeepCTR's
``dnn_dropout=0``); in eval mode every dropout is off. ATen's dropout then returns its input
*itself*: no copy, no RNG draw. In the graph it still sits between every linear and the next op,
so the stacked output of a batched group cannot be read straight by the next batched group: the
next op's inputs are dropout results, not pieces of one tensor, and stacking them again costs a
copy (the cost model then declines batching the experts of an MMoE). Replacing the node by its
input is exact: eager hands the consumers that very tensor (same storage, strides, grad flag,
autograd history), so values, gradients, aliasing and the RNG stream are unchanged.

Only out-of-place call_function/call_method forms whose ``p`` and ``training`` are literals are
rewritten: an ``nn.Dropout`` module call reads ``self.p`` and ``self.training`` at run time, so
it is left alone, as is a dropout with ``p > 0`` in training (it draws from the RNG).
"""

from __future__ import annotations

from torch import fx

from optimus.engine.context import RewriteContext
from optimus.engine.rule import CleanupRule


def _is_literal_zero(p: object) -> bool:
    return isinstance(p, (int, float)) and not isinstance(p, bool) and p == 0


class NoopDropout(CleanupRule):
    name = "noop_dropout"

    def run(self, ctx: RewriteContext) -> int:
        removed = 0
        for node in list(ctx.graph.nodes):
            if node.op not in ("call_function", "call_method"):
                continue
            canon = ctx.canon(node)
            if canon is None or canon.op != "dropout" or canon.inplace:
                continue
            x, training = canon["input"], canon["training"]
            if not isinstance(x, fx.Node) or not (training is False or _is_literal_zero(canon["p"])):
                continue
            users = list(node.users)
            node.replace_all_uses_with(x)
            ctx.forget_canon(users)  # their canonical forms named the dropout
            ctx.graph.erase_node(node)
            removed += 1
        return removed


__all__ = ["NoopDropout"]
