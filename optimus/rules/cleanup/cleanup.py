"""Cleanup rules, run at the start of every driver round (always a win, never cost-checked).

dce: a pure node nobody uses -> nothing. Effectful nodes (random draws, BatchNorm in train mode,
    mutation, context changes; see effects) are kept even when unused.
cse: two pure nodes computing the same canonical call on the same inputs in the same region
    (grad mode / autocast, see regions) -> one. Calls are compared in canonical form (see
    normalize), so ``torch.relu(x)``, ``F.relu(x, False)`` and ``x.relu()`` are recognised as the
    same value; merging a node refreshes its users' canonical forms, so chains of identical calls
    collapse in one sweep (twenty ``nan_to_num(x).tanh()`` -> one), before any batching rule sees
    them. Random, effectful and mutated values are never merged, nor two values that are both
    returned to the caller (the outputs would become one tensor: an in-place op on one would
    change the other).
"""

from __future__ import annotations

from collections.abc import Hashable
from typing import Any

from torch import fx

from optimus.engine.context import RewriteContext
from optimus.engine.rule import CleanupRule
from optimus.semantics.effects import effect_reason, may_alias_output
from optimus.semantics.normalize import _hashable


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
            if node.users or node.op in ("placeholder", "output"):
                continue
            if node in ctx.index.ordered:
                reason = effect_reason(node, ctx.canon(node))
                if reason in ("random op", "state-updating op", "unknown module"):
                    ctx.decline(f"dce: unused {reason}: kept")
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
        regions = ctx.index.regions
        effect_keys: dict[Hashable, fx.Node] = {}
        for node in list(ctx.graph.nodes):
            if node.op in ("placeholder", "output"):
                continue
            if not ctx.movable(node) or _impure(node):
                reason = effect_reason(node, ctx.canon(node))
                key = _key(node, ctx) if reason is not None and reason != "region boundary" else None
                if key is not None:  # an identical effect seen before: say why it stays
                    key = (regions.of(node), key)
                    if key in effect_keys:
                        ctx.decline(f"cse: {reason}: not merged")
                    effect_keys.setdefault(key, node)
                continue
            key = _key(node, ctx)
            if key is None:
                continue
            key = (regions.of(node), key)  # never merge across a grad-mode / autocast region
            first = seen.get(key)
            if first is None:
                seen[key] = node
                continue
            if _escapes(node, ctx) and _escapes(first, ctx):
                ctx.decline(
                    "cse: both values are outputs: not merged (the caller would get one tensor twice)"
                )
                continue
            for user in node.users:
                ctx.forget_canon([user])  # its canonical form named the merged node
            node.replace_all_uses_with(first)
            ctx.graph.erase_node(node)
            merged += 1
        return merged


def _escapes(node: fx.Node, ctx: RewriteContext) -> bool:
    """Returned to the caller, as is or through a chain of values that may share its storage
    (views, no-op dropouts, unknown ops): merging two such values would make two outputs share
    memory, so an in-place op on one would change the other (``sigmoid(a).as_strided(...)``
    returned beside an identical ``sigmoid(a)``)."""
    stack, seen = [node], {node}
    while stack:
        value = stack.pop()
        for user in value.users:
            if user.op == "output":
                return True
            if user not in seen and may_alias_output(user, ctx.canon(user)):
                seen.add(user)
                stack.append(user)
    return False


def _impure(node: fx.Node) -> bool:
    try:
        return bool(node.is_impure())
    except Exception:
        return True


def _key(node: fx.Node, ctx: RewriteContext) -> Hashable | None:
    """What a node computes, as a hashable key (None: not comparable)."""
    if node.op == "call_module" and ctx.canon(node) is None:
        return None
    canon = ctx.canon(node)
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
        return None
    return key
