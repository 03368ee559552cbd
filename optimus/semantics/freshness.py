"""Freshness of cat/stack results: when handing back a view instead is observable.

WHY: ``torch.cat`` and ``torch.stack`` always return new storage. The split/cat rules replace
such a result (or a piece of it) by a tensor the graph already has, or a view of one: ``cat(split(x))
-> x``, ``unbind(stack(xs))[i] -> xs[i]``, a cat of a run of pieces -> ``x.narrow(..)``. The values
are equal, but the result now shares memory with ``x``. Inside the graph that is harmless (a value
that is written in place is ordered, see :mod:`optimus.semantics.effects`, and the rules leave it alone);
the caller, though, receives the graph's outputs and may write into them. So the rewrite is
observable exactly when the replaced value reaches a graph output (itself or through a view) and
the tensor it would become a view of is

* a model input or parameter/buffer (or a view of one): the caller's write changes them;
* itself reaching the graph output some other way: two outputs that were independent now share
  memory;
* the new value of another replaced output (``stack([y, y])`` unbound into two outputs);

or when the replaced value is a view of a fresh tensor that also reaches the output some other
way (a returned piece of a returned stack stops sharing its memory). The rules decline those
rewrites: the copy the cat makes is then the very copy the caller needs.
"""

from __future__ import annotations

import weakref
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from torch import fx

from optimus.semantics.effects import UnionFind, may_alias_output

if TYPE_CHECKING:
    from optimus.semantics.graph_view import GraphView


class _Aliases(UnionFind):
    """Alias classes of one round's graph, which nodes reach the output, which classes hold a
    model input or parameter."""

    def __init__(self, ctx: GraphView) -> None:
        super().__init__()
        self.ctx = ctx
        nodes = ctx.index.nodes
        self.aliasing = {n for n in nodes if may_alias_output(n, ctx.canon(n))}
        for node in self.aliasing:
            for inp in node.all_input_nodes:
                self.union(node, inp)
        outputs: set[fx.Node] = set()
        for node in nodes:
            if node.op == "output":
                outputs.update(node.all_input_nodes)
        # reaches the output itself or through a chain of may-alias users
        self.escapes: set[fx.Node] = set()
        for node in reversed(nodes):
            if node in outputs or any(u in self.aliasing and u in self.escapes for u in node.users):
                self.escapes.add(node)
        self.escapers: dict[fx.Node, list[fx.Node]] = {}
        self.sourced: set[fx.Node] = set()
        # alias roots a rewrite found this round will hand to the caller, by the values it
        # replaces: two returned cats of one tensor must not both become it (they would share
        # memory), even though each one alone is fine
        self.claimed: dict[fx.Node, frozenset[fx.Node]] = {}
        for node in nodes:
            root = self.find(node)
            if node in self.escapes:
                self.escapers.setdefault(root, []).append(node)
            if node.op in ("placeholder", "get_attr"):
                self.sourced.add(root)

    def descendants(self, olds: Sequence[fx.Node]) -> set[fx.Node]:
        """``olds`` and every value that may be a view of one of them."""
        found = set(olds)
        stack = list(olds)
        while stack:
            for user in stack.pop().users:
                if user in self.aliasing and user not in found:
                    found.add(user)
                    stack.append(user)
        return found


_CACHE: weakref.WeakKeyDictionary[Any, _Aliases] = weakref.WeakKeyDictionary()


def _aliases(ctx: GraphView) -> _Aliases:
    found = _CACHE.get(ctx.index)
    if found is None:
        found = _CACHE[ctx.index] = _Aliases(ctx)
    return found


def breaks_freshness(pairs: Sequence[tuple[fx.Node, Any]], ctx: GraphView) -> bool:
    """Would replacing each ``old`` (a cat/stack result or a piece of one) by ``new`` or a view of
    ``new`` be observable by the caller? (see the module docstring). ``new`` None: a fresh value."""
    if any(old not in ctx.index.pos for old, _ in pairs):
        return True  # made this round: not indexed, assume the worst
    classes = _aliases(ctx)
    escaping = [(old, new) for old, new in pairs if old in classes.escapes]
    if not escaping:
        return False
    old_set = frozenset(old for old, _ in pairs)
    moved = classes.descendants([old for old, _ in pairs])
    for old, _ in escaping:
        if any(e not in moved for e in classes.escapers.get(classes.find(old), ())):
            return True  # the fresh tensor old is part of stays visible to the caller
    seen: set[fx.Node] = set()
    for _, new in escaping:
        if not isinstance(new, fx.Node):
            continue
        if new not in ctx.index.pos:
            return True
        root = classes.find(new)
        if root in classes.sourced or classes.escapers.get(root) or root in seen:
            return True
        if classes.claimed.get(root, old_set) != old_set:
            return True  # another rewrite of this round already hands this tensor to the caller
        seen.add(root)
    for root in seen:
        classes.claimed[root] = old_set
    return False
