"""Which nodes have effects (mutation, randomness, side effects) and which values they touch.

WHY: Dynamo's pre-grad graphs are not functional: ``x.add_(y)``, ``F.relu(x, inplace=True)``,
``operator.iadd``, dropout and ``F.batch_norm`` in train mode (it updates the running statistics)
appear as ordinary nodes. A rewrite may move a pure computation freely (only data dependencies
matter), but must never move anything across an effect that can change what it reads, and CSE/DCE
must never merge or drop an effect. We therefore:

* read randomness, writes and output aliasing from the op schema (:mod:`optimus.semantics.op_schema`);
  only Python operators (``operator.iadd`` ...) and calls with no schema use the rules here;
* mark *ordered* nodes: effectful ones (mutation, RNG, unknown modules, fx-impure calls, context
  nodes such as ``_set_grad_enabled``) and every node reading or producing a value in the alias
  class of a mutated value. Their relative order is kept by the driver (chain edges) and rules
  never touch them;
* compute alias classes only when the graph mutates something (the common case is fast). A value
  is in its input's class when the op may return (a view of) its input: a view or in-place op, an
  op whose schema return is alias-annotated, or one that returns its input as is (dropout with
  ``training=False`` or ``p=0``, ``type_as`` ...; see ``op_schema.MAY_RETURN_INPUT``).
"""

from __future__ import annotations

import operator
from collections.abc import Iterable

import torch
import torch.nn.functional as F
from torch import fx

from optimus.semantics.normalize import VIEW_OPS, Canon
from optimus.semantics.op_schema import OpFacts, op_facts
from optimus.semantics.regions import context_kind

_MUTATING_FUNCTIONS = {
    operator.setitem,
    operator.iadd,
    operator.isub,
    operator.imul,
    operator.itruediv,
    operator.ifloordiv,
    operator.ipow,
    operator.iand,
    operator.ior,
    operator.ixor,
    operator.imatmul,
}


def _target_name(node: fx.Node) -> str:
    target = node.target
    return target if isinstance(target, str) else getattr(target, "__name__", "")


def _canon_dropout_off(canon: Canon) -> bool:
    """Canonical dropout that returns its input unchanged (no RNG draw): eval mode or p == 0."""
    return canon.op == "dropout" and (canon["training"] is False or canon["p"] == 0)


def is_random(node: fx.Node, canon: Canon | None, facts: OpFacts | None = None) -> bool:
    """Does this node draw from the RNG (so it must not be merged, dropped or reordered)?"""
    if canon is not None:  # every canonical op is deterministic, except dropout
        return canon.op == "dropout" and not _canon_dropout_off(canon)
    if node.op not in ("call_function", "call_method"):
        return False
    facts = facts if facts is not None else op_facts(node)
    return facts is not None and facts.random


def mutated_args(node: fx.Node, canon: Canon | None, facts: OpFacts | None = None) -> list[fx.Node]:
    """The values this node writes in place (empty for a pure node)."""
    if canon is not None:
        first = canon.kwargs.get("input")
        return [first] if canon.inplace and isinstance(first, fx.Node) else []
    out = node.kwargs.get("out")
    written: list[fx.Node] = [out] if isinstance(out, fx.Node) else []
    if node.op in ("call_function", "call_method"):
        facts = facts if facts is not None else op_facts(node)
        if facts is not None:
            written.extend(n for n in facts.writes if n not in written)
            if not _is_mutating_function(node):
                return written
    name = _target_name(node)
    in_place = (node.op == "call_method" and name.endswith("_") and not name.endswith("__")) or (
        node.op == "call_function"
        and (_is_mutating_function(node) or (name.endswith("_") and not name.startswith("_")))
    )
    if in_place and node.args and isinstance(node.args[0], fx.Node) and node.args[0] not in written:
        written.append(node.args[0])
    if node.kwargs.get("inplace") is True and node.args and isinstance(node.args[0], fx.Node):
        written.append(node.args[0])
    return written


def _is_mutating_function(node: fx.Node) -> bool:
    try:
        return node.target in _MUTATING_FUNCTIONS
    except TypeError:
        return False


def is_effectful(node: fx.Node, canon: Canon | None, facts: OpFacts | None = None) -> bool:
    """Mutation, randomness, a context change, an unknown module, or anything fx calls impure."""
    if node.op in ("placeholder", "output", "get_attr"):
        return False
    if node.op == "call_module" and canon is None:
        return True  # an arbitrary module may update buffers or draw random numbers
    if context_kind(node) is not None:
        return True  # grad mode / autocast / other context: a region boundary
    if mutated_args(node, canon, facts) or is_random(node, canon, facts):
        return True
    try:
        return bool(node.is_impure())
    except Exception:  # fx may not know the target
        return False


def effect_reason(node: fx.Node, canon: Canon | None) -> str | None:
    """Why a node is effectful, in two or three words (for the report), or None if it is not:
    "region boundary", "unknown module", "random op", "state-updating op" (writes a value other
    than its first input, e.g. BatchNorm's running statistics) or "in-place op"."""
    if node.op in ("placeholder", "output", "get_attr"):
        return None
    if node.op == "call_module" and canon is None:
        return "unknown module"
    if context_kind(node) is not None:
        return "region boundary"
    if is_random(node, canon):
        return "random op"
    written = mutated_args(node, canon)
    if written:
        first = node.args[0] if node.args else None
        return "in-place op" if all(w is first for w in written) else "state-updating op"
    return None


class UnionFind:
    """Alias classes of fx nodes (union-find with path halving)."""

    def __init__(self) -> None:
        self.parent: dict[fx.Node, fx.Node] = {}

    def find(self, x: fx.Node) -> fx.Node:
        parent = self.parent.setdefault(x, x)
        while parent is not x:
            self.parent[x] = self.parent.setdefault(parent, parent)
            x, parent = parent, self.parent[parent]
        return x

    def union(self, a: fx.Node, b: fx.Node) -> None:
        ra, rb = self.find(a), self.find(b)
        if ra is not rb:
            self.parent[ra] = rb


def _may_alias_output(node: fx.Node, canon: Canon | None, facts: OpFacts | None = None) -> bool:
    """Can this node's output share storage with an input? Unknown ops: assume yes."""
    if node.op in ("placeholder", "get_attr", "output"):
        return False
    if canon is not None:
        return canon.op in VIEW_OPS or canon.inplace or _canon_dropout_off(canon)
    if node.op in ("call_function", "call_method"):
        facts = facts if facts is not None else op_facts(node)
        if facts is not None:
            return facts.may_alias
    return True


def may_alias_output(node: fx.Node, canon: Canon | None) -> bool:
    """Public form of :func:`_may_alias_output`: may this node's output share storage with an
    input (a view, an in-place result, a no-op dropout, an unknown op)?"""
    return _may_alias_output(node, canon)


def ordered_nodes(nodes: Iterable[fx.Node], canons: dict[fx.Node, Canon | None]) -> set[fx.Node]:
    """Nodes whose order relative to each other must be kept, and that rules must not rewrite:
    effectful nodes plus every member of a mutated alias class (and their direct readers)."""
    return ordered_and_mutated(nodes, canons)[0]


def ordered_and_mutated(
    nodes: Iterable[fx.Node], canons: dict[fx.Node, Canon | None]
) -> tuple[set[fx.Node], set[fx.Node]]:
    """(:func:`ordered_nodes`, the members of the mutated alias classes themselves: values that
    something in the graph writes in place, directly or through an alias)."""
    node_list = list(nodes)
    facts: dict[fx.Node, OpFacts | None] = {
        n: op_facts(n) if canons.get(n) is None and n.op in ("call_function", "call_method") else None
        for n in node_list
    }
    effectful = {n for n in node_list if is_effectful(n, canons.get(n), facts[n])}
    written = [m for n in effectful for m in mutated_args(n, canons.get(n), facts[n])]
    if not written:
        return effectful, set()
    classes = UnionFind()
    for node in node_list:
        if _may_alias_output(node, canons.get(node), facts[node]):
            for inp in node.all_input_nodes:
                classes.union(node, inp)
    bad_roots = {classes.find(m) for m in written}
    ordered = set(effectful)
    mutated: set[fx.Node] = set()
    for node in node_list:
        if classes.find(node) in bad_roots:
            mutated.add(node)
            ordered.add(node)
            ordered.update(u for u in node.users if u.op != "output")
    return ordered, mutated


_PRIVATE_UPDATE_TARGETS = frozenset({F.batch_norm, torch.batch_norm})


def private_updates(nodes: Iterable[fx.Node], ordered: set[fx.Node], mutated: set[fx.Node]) -> set[fx.Node]:
    """Ordered nodes that only update state nothing else in the graph reads or writes: BatchNorm
    calls in train mode whose running statistics are ``get_attr`` nodes read by that call alone
    (no other node reads the same attribute, or the module holding it), whose other inputs are
    not mutated values, and whose own result nothing writes in place (``mutated``: the members of
    the mutated alias classes, :func:`ordered_and_mutated`).

    WHY: such a call is effectful (the running statistics change), so it is kept and never merged
    or dropped, but its effect commutes with every other node: moving it, or computing it
    together with other such calls (``batch_batch_norm``), changes nothing another node can see.
    Keeping it *blocked* like other effects stopped every rewrite around it (a tower's
    ``Linear -> BatchNorm1d -> ReLU`` could not batch the ReLU, which reads an effect's result).
    """
    node_list = list(nodes)
    by_target: dict[str, int] = {}
    for node in node_list:
        if node.op in ("get_attr", "call_module"):
            target = str(node.target)
            by_target[target] = by_target.get(target, 0) + 1
    found: set[fx.Node] = set()
    for node in node_list:
        if node not in ordered or node in mutated or node.op != "call_function":
            continue
        try:
            if node.target not in _PRIVATE_UPDATE_TARGETS:
                continue
        except TypeError:
            continue
        written = mutated_args(node, None)
        if not written:
            continue
        ok = True
        for w in written:
            target = str(w.target)
            shared = by_target.get(target, 0) > 1 or any(
                t != target and target.startswith(t + ".") for t in by_target
            )
            if w.op != "get_attr" or len(w.users) != 1 or shared:
                ok = False
                break
        others = [i for i in node.all_input_nodes if i not in written]
        if ok and not any(i in ordered for i in others):
            found.add(node)
    return found
