"""Cleanup rules, run at the start of every driver round (always a win, never cost-checked).

dce: a pure node nobody uses -> nothing.
cse: two pure nodes computing the same canonical call on the same inputs -> one. Calls are
    compared in canonical form (see normalize), so ``torch.relu(x)``, ``F.relu(x, False)`` and
    ``x.relu()`` are recognised as the same value. Random, effectful and mutated values are never
    merged.
"""

from __future__ import annotations

from collections.abc import Hashable
from typing import Any

from torch import fx

from ..context import RewriteContext
from ..normalize import _hashable
from .base import CleanupRule


def _freeze(value: Any) -> Hashable:
    if isinstance(value, fx.Node):
        return ("node", id(value))
    if isinstance(value, (list, tuple)):
        return (type(value).__name__, tuple(_freeze(v) for v in value))
    if isinstance(value, dict):
        return ("dict", tuple(sorted((str(k), _freeze(v)) for k, v in value.items())))
    if isinstance(value, slice):
        return ("slice", _freeze(value.start), _freeze(value.stop), _freeze(value.step))
    return _hashable(value)


class DeadCode(CleanupRule):
    name = "dce"

    def run(self, ctx: RewriteContext) -> int:
        removed = 0
        for node in reversed(list(ctx.graph.nodes)):
            if node.users or node.op in ("placeholder", "output") or node in ctx.index.ordered:
                continue
            if node.op == "call_module" and ctx.canon(node) is None:
                continue
            try:
                if node.is_impure():
                    continue
            except Exception:
                continue
            ctx.graph.erase_node(node)
            removed += 1
        return removed


class CommonSubexpression(CleanupRule):
    name = "cse"

    def run(self, ctx: RewriteContext) -> int:
        seen: dict[Hashable, fx.Node] = {}
        merged = 0
        for node in list(ctx.graph.nodes):
            if node.op in ("placeholder", "output") or not ctx.movable(node):
                continue
            if node.op == "call_module" and ctx.canon(node) is None:
                continue
            canon = ctx.canon(node)
            try:
                if node.is_impure():
                    continue
            except Exception:
                continue
            if canon is not None:  # kwargs hold every parameter of the op, in schema order
                key: Hashable = (
                    "canon",
                    canon.op,
                    canon.inplace,
                    tuple(_freeze(v) for v in canon.kwargs.values()),
                )
            else:
                key = (node.op, _freeze(node.target), _freeze(node.args), _freeze(node.kwargs))
            try:
                hash(key)
            except TypeError:
                continue
            first = seen.get(key)
            if first is None:
                seen[key] = node
                continue
            node.replace_all_uses_with(first)
            ctx.graph.erase_node(node)
            merged += 1
        return merged
