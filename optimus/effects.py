"""Which nodes have effects (mutation, randomness, side effects) and which values they touch.

WHY: Dynamo's pre-grad graphs are not functional: ``x.add_(y)``, ``F.relu(x, inplace=True)``,
``operator.iadd`` and dropout appear as ordinary nodes. A rewrite may move a pure computation
freely (only data dependencies matter), but must never move anything across an effect that can
change what it reads. We therefore:

* mark *ordered* nodes: effectful ones (mutation, RNG, unknown modules, fx-impure calls) and
  every node reading or producing a value in the alias class of a mutated value. Their relative
  order is kept by the driver (chain edges) and rules never touch them;
* compute alias classes only when the graph mutates something (the common case is fast).
"""

from __future__ import annotations

import operator
from collections.abc import Iterable

import torch
from torch import fx

from .normalize import VIEW_OPS, Canon

_RANDOM_FUNCTIONS = {
    torch.rand,
    torch.randn,
    torch.randint,
    torch.rand_like,
    torch.randn_like,
    torch.randint_like,
    torch.bernoulli,
    torch.multinomial,
    torch.normal,
    torch.poisson,
    torch.randperm,
    torch.nn.functional.rrelu,
    torch.nn.functional.alpha_dropout,
    torch.nn.functional.feature_alpha_dropout,
    torch.nn.functional.dropout1d,
    torch.nn.functional.dropout2d,
    torch.nn.functional.dropout3d,
    torch.nn.functional.gumbel_softmax,
}
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
_RANDOM_METHODS = {
    "bernoulli",
    "bernoulli_",
    "uniform_",
    "normal_",
    "random_",
    "exponential_",
    "geometric_",
    "cauchy_",
    "log_normal_",
}


def _target_name(node: fx.Node) -> str:
    target = node.target
    return target if isinstance(target, str) else getattr(target, "__name__", "")


def is_random(node: fx.Node, canon: Canon | None) -> bool:
    if canon is not None and canon.op == "dropout":
        return bool(canon["training"]) and canon["p"] != 0
    if node.op == "call_function":
        try:
            return node.target in _RANDOM_FUNCTIONS
        except TypeError:
            return False
    return node.op == "call_method" and _target_name(node) in _RANDOM_METHODS


def mutated_args(node: fx.Node, canon: Canon | None) -> list[fx.Node]:
    """The values this node writes in place (empty for a pure node)."""
    if canon is not None:
        first = canon.kwargs.get("input")
        return [first] if canon.inplace and isinstance(first, fx.Node) else []
    out = node.kwargs.get("out")
    written: list[fx.Node] = [out] if isinstance(out, fx.Node) else []
    name = _target_name(node)
    in_place = (node.op == "call_method" and name.endswith("_") and not name.endswith("__")) or (
        node.op == "call_function"
        and (_is_mutating_function(node) or (name.endswith("_") and not name.startswith("_")))
    )
    if in_place and node.args and isinstance(node.args[0], fx.Node):
        written.append(node.args[0])
    if node.kwargs.get("inplace") is True and node.args and isinstance(node.args[0], fx.Node):
        written.append(node.args[0])
    return written


def _is_mutating_function(node: fx.Node) -> bool:
    try:
        return node.target in _MUTATING_FUNCTIONS
    except TypeError:
        return False


def is_effectful(node: fx.Node, canon: Canon | None) -> bool:
    """Mutation, randomness, an unknown module, or anything fx itself calls impure."""
    if node.op in ("placeholder", "output", "get_attr"):
        return False
    if node.op == "call_module" and canon is None:
        return True  # an arbitrary module may update buffers or draw random numbers
    if mutated_args(node, canon) or is_random(node, canon):
        return True
    try:
        return bool(node.is_impure())
    except Exception:  # fx may not know the target
        return False


class _UnionFind:
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


def _may_alias_output(node: fx.Node, canon: Canon | None) -> bool:
    """Can this node's output share storage with an input? Unknown ops: assume yes."""
    if node.op in ("placeholder", "get_attr", "output"):
        return False
    if canon is None:
        return True
    return canon.op in VIEW_OPS or canon.inplace


def ordered_nodes(nodes: Iterable[fx.Node], canons: dict[fx.Node, Canon | None]) -> set[fx.Node]:
    """Nodes whose order relative to each other must be kept, and that rules must not rewrite:
    effectful nodes plus every member of a mutated alias class (and their direct readers)."""
    node_list = list(nodes)
    effectful = {n for n in node_list if is_effectful(n, canons.get(n))}
    written = [m for n in effectful for m in mutated_args(n, canons.get(n))]
    if not written:
        return effectful
    classes = _UnionFind()
    for node in node_list:
        if _may_alias_output(node, canons.get(node)):
            for inp in node.all_input_nodes:
                classes.union(node, inp)
    bad_roots = {classes.find(m) for m in written}
    ordered = set(effectful)
    for node in node_list:
        if classes.find(node) in bad_roots:
            ordered.add(node)
            ordered.update(u for u in node.users if u.op != "output")
    return ordered
