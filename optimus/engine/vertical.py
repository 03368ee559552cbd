"""Vertical chains: a fused group and the per-member chain after it, gated as one rewrite.

WHY: the driver prices and gates one horizontal candidate at a time. Fusing a tower stack
(linear -> layer norm -> activation -> gate) is several such candidates, one per layer, all
found in the same round (their members are independent within each layer). Alone, each layer
looks like it keeps G outputs alive through unbind pieces and copies its inputs into a stack;
together, each layer reads the previous layer's stacked output (``Builder.stack`` sees the
unbind and reuses its source: no seam copy, no per-member intermediates), and the stacked
buffer of one layer dies when the next has run. With the memory gate on, judging the layers one
by one declined the links that looked peak-raising alone and cut the chain at a seam (or left it
unfused) although the whole chain may raise nothing. So, while the gate is active, the
candidates of one round that form such a chain are applied together and judged together: the
chain's time saved against the exact change of the graph's estimated peak.

Which candidates form a chain (``chains``): candidates of this round's batching rules
(``HorizontalRule``s; not the node-set split/cat rules, which only remove copies), each the best
rated one for all its members, linked when a member of one reads a member of the other and the
feeding candidate is *interior*: each of its members has exactly one reader, a member of a
linked candidate (a per-member chain: no branch, no graph output, no external reader in the
middle, where the stacked buffer would be kept alive by that reader; there the chain is cut),
all in one grad-mode/autocast region. Several links may feed one (a tower and its gate into the
gating multiply).
Only links rated faster on their own are considered; safety is each link's own (a rule never
offers members that read a mutated value, or that straddle a region boundary): a chain only
changes *when* links are taken, never *what* a link rewrites.

How it is judged (``driver._apply_chain``): its links are applied upstream first (so each link
re-reads its inputs as the pieces of the previous fused output and stacks them for free), the
graph's live-bytes estimate (``optimus.memory.live``) is recomputed once before and once after, and
the chain is kept unless it lifts the estimated peak above ``memory_budget_bytes`` or lifts it
while saving no more than ``memory_margin`` of its own time (``chain_gain``: each link priced
again after its predecessors, so the seam copies it no longer makes are credited). A refused
chain is undone exactly and its links are then judged one by one, as before; so is a chain one
of whose links cannot be placed after the links feeding it (its label, chosen when it was
matched alone, may no longer sit above their new nodes). A layout that changes the module as it
lays parameters out is replaced by ``ProbeLayout`` for the trial (see there).
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import torch
from torch import fx

from optimus.engine.candidate import Candidate
from optimus.engine.context import RewriteContext
from optimus.engine.param_layout import RuntimeStack

if TYPE_CHECKING:
    from optimus.engine.builder import Builder


@dataclass(eq=False)
class Chain:
    """Linked candidates, upstream first (each link after every link that feeds it)."""

    links: list[Candidate]

    @property
    def name(self) -> str:
        return "vertical chain (" + " > ".join(c.rule for c in self.links) + ")"

    @property
    def nodes(self) -> list[fx.Node]:
        return [n for c in self.links for n in c.nodes]


def chains(
    candidates: Sequence[Candidate], fusing: Iterable[str], ctx: RewriteContext
) -> dict[Candidate, Chain]:
    """Each candidate that belongs to a chain of two or more links -> that chain (see the module
    docstring); ``fusing`` names the batching rules whose candidates may link. O(candidate
    members + their users)."""
    kinds = set(fusing)
    owner: dict[fx.Node, Candidate] = {}
    for cand in candidates:  # best rated first: the candidate the greedy order would take
        if cand.gain > 0 and cand.rule in kinds:
            for node in cand.nodes:
                owner.setdefault(node, cand)
    eligible = [
        c for c in candidates if c.gain > 0 and c.rule in kinds and all(owner.get(n) is c for n in c.nodes)
    ]
    ok = set(eligible)
    regions = ctx.index.regions
    parent: dict[Candidate, Candidate] = {c: c for c in eligible}

    def find(c: Candidate) -> Candidate:
        while parent[c] is not c:
            parent[c] = parent[parent[c]]
            c = parent[c]
        return c

    feeds: dict[Candidate, set[Candidate]] = {c: set() for c in eligible}
    for cand in eligible:
        readers: set[Candidate] = set()
        interior = True
        for node in cand.nodes:
            users = list(node.users)
            reader = owner.get(users[0]) if len(users) == 1 else None
            if reader is None or reader not in ok or reader is cand:
                interior = False  # a branch, an external reader, an output: the chain ends here
                break
            readers.add(reader)
        if not interior or not readers:
            continue
        if not regions.trivial and any(regions.of(r.nodes[0]) != regions.of(cand.nodes[0]) for r in readers):
            continue
        feeds[cand] = readers
        for reader in readers:
            parent[find(reader)] = find(cand)
    members: dict[Candidate, list[Candidate]] = {}
    for cand in eligible:
        members.setdefault(find(cand), []).append(cand)
    out: dict[Candidate, Chain] = {}
    for group in members.values():
        if len(group) < 2:
            continue
        chain = Chain(_upstream_first(group, feeds, ctx))
        for cand in group:
            out[cand] = chain
    return out


def _upstream_first(
    group: list[Candidate], feeds: dict[Candidate, set[Candidate]], ctx: RewriteContext
) -> list[Candidate]:
    """The links in an order where every link comes after each link feeding it (Kahn's order;
    ties by graph position, so it is deterministic)."""
    pos = ctx.index.pos
    inside = set(group)
    waiting = {c: 0 for c in group}
    for c in group:
        for r in feeds[c]:
            if r in inside:
                waiting[r] += 1

    def first(c: Candidate) -> int:
        return min(pos.get(n, 0) for n in c.nodes)

    ready = sorted((c for c in group if waiting[c] == 0), key=first)
    order: list[Candidate] = []
    while ready:
        cand = ready.pop(0)
        order.append(cand)
        for r in sorted(feeds[cand] & inside, key=first):
            waiting[r] -= 1
            if waiting[r] == 0:
                ready.append(r)
        ready.sort(key=first)
    return order


STAND_IN = "optimus_stand_in"  # node.meta key of a ProbeLayout stand-in: how many members it stands for


class ProbeLayout:
    """The parameter layout used while a chain is on trial, in place of one that changes the
    module when it lays parameters out (``RelayoutParams`` re-points the parameters into new
    storage as it builds the ``get_attr``; undoing the graph edit would not undo that, and a
    refused chain would leave the parameters grouped its way, so the links taken one by one
    afterwards fall back to stacking per call).

    Where the real layout's tensor is free (it moves no bytes: a ``get_attr`` of storage it would
    make), a zero-stride view of the first parameter with the stacked shape stands in: the same
    shape, dtype and device for the nodes after it, no bytes for the estimate, no effect. Elsewhere
    ``RuntimeStack``, which the real layout falls back to there. Prices are the real layout's. The
    probe graph is only estimated, never run: a chain that passes is undone and applied again with
    the real layout."""

    stands_in = True  # reads one parameter for a group (the gradient-path check knows it)

    def __init__(self, real: Any) -> None:
        self.real = real
        self.fallback = RuntimeStack()

    def _stand_in(self, params: Sequence[fx.Node], b: Builder, shape: tuple[int, ...]) -> fx.Node:
        node = b.call(torch.as_strided, params[0], shape, (0,) * len(shape))
        node.meta[STAND_IN] = len(params)  # the group the real layout would make (its members)
        return node

    def stacked(self, params: Sequence[fx.Node], b: Builder, transpose: bool = False) -> fx.Node:
        meta = b.ctx.meta(params[0])
        if meta is None or self.real.bytes_moved(params, b.ctx) != 0 or (transpose and len(meta.shape) != 2):
            return self.fallback.stacked(params, b, transpose)
        inner = tuple(reversed(meta.shape)) if transpose else tuple(meta.shape)
        return self._stand_in(params, b, (len(params), *inner))

    def concatenated(self, params: Sequence[fx.Node], b: Builder) -> fx.Node:
        metas = [b.ctx.meta(p) for p in params]
        free = getattr(self.real, "concatenation_is_free", None)
        if any(m is None or not m.shape for m in metas) or free is None or not free(params):
            return self.fallback.concatenated(params, b)
        first = metas[0]
        assert first is not None
        rows = sum(m.shape[0] for m in metas if m is not None)
        return self._stand_in(params, b, (rows, *first.shape[1:]))

    def bytes_moved(self, params: Sequence[fx.Node], ctx: RewriteContext) -> float:
        return float(self.real.bytes_moved(params, ctx))

    def launches(self, params: Sequence[fx.Node], transpose: bool = False) -> float:
        return float(self.real.launches(params, transpose))
