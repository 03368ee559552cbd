"""Topological index of a graph: positions, depth labels, ordered (effectful) nodes, reachability.

WHY: the driver must decide, for thousands of candidate nodes, which ones can be computed
together, in about linear time. Three facts make that cheap:

* ``depth`` is a labelling that strictly increases along every dependency (data edges, plus chain
  edges between consecutive *ordered* nodes, see :mod:`optimus.semantics.effects`). Nodes with equal depth
  are never connected.
* A set of nodes can be fused into one computation placed at label ``l`` when, for every member,
  ``max(depth of its inputs) < l < min(depth of its users)``. Giving the fused nodes label ``l``
  keeps the labelling valid, so any number of such fusions in one round never creates a cycle
  (:func:`stab_groups` picks the groups; each check is O(degree)).
* Exact reachability, for rules that need it, is a bitset of ancestors per node (a Python int),
  built lazily in one pass over the topological order (``reaches``/``independent``).
* Context nodes (grad mode, autocast, ... see :mod:`optimus.semantics.regions`) are barriers: a node's label
  exceeds that of the boundary opening its segment, and a boundary's label exceeds every label of
  the segment before it. The topological sort keeps the same barriers.
"""

from __future__ import annotations

import bisect
import itertools
import math
from collections.abc import Callable, Hashable, Iterable, Sequence
from typing import TypeVar

from torch import fx

from optimus.semantics.effects import ordered_and_mutated, private_updates
from optimus.semantics.normalize import Canon, canonicalize
from optimus.semantics.regions import Regions, context_kind, is_free, segments

T = TypeVar("T")


class GraphIndex:
    """Built once per driver round; rules read it, never mutate it."""

    def __init__(self, graph: fx.Graph, modules: dict | None = None) -> None:
        self.graph = graph
        self.nodes: list[fx.Node] = list(graph.nodes)
        self.pos: dict[fx.Node, int] = {n: i for i, n in enumerate(self.nodes)}
        self.canons: dict[fx.Node, Canon | None] = {n: canonicalize(n, modules) for n in self.nodes}
        self.ordered: set[fx.Node]
        self.ordered, mutated = ordered_and_mutated(self.nodes, self.canons)
        self.regions = Regions(self.nodes)
        # state updates nothing else in the graph sees (see ``private_updates``): ordered, so they
        # are never dropped or merged, but outside the chain of effects, so a rule may move them
        self.private: set[fx.Node] = private_updates(self.nodes, self.ordered, mutated)
        private_state = {w for n in self.private for w in n.all_input_nodes if w in self.ordered}
        # the effects whose relative order is kept (chain edges in labels and in stable_toposort)
        self.chained: set[fx.Node] = self.ordered - self.private - private_state
        chained = self.chained
        self.depth: dict[fx.Node, float] = {}
        last_ordered = -1.0
        seg_floor = seg_max = -1.0  # label of the current segment's boundary / its largest label
        barriers = not self.regions.trivial
        for node in self.nodes:
            d = 0.0
            for inp in node.all_input_nodes:
                d = max(d, self.depth.get(inp, 0.0) + 1)
            boundary = barriers and node in self.regions.boundaries_set
            if barriers and not is_free(node):
                d = max(d, seg_max + 1) if boundary else max(d, seg_floor + 1)
            if node in chained or node.op == "output":
                d = max(d, last_ordered + 1)
                last_ordered = d
            if boundary:
                seg_floor = seg_max = d
            elif barriers and not is_free(node):
                seg_max = max(seg_max, d)
            self.depth[node] = d
        self._ancestors: dict[fx.Node, int] | None = None
        # nodes rules must not rewrite: ordered ones and their direct readers (computed once)
        self.blocked: set[fx.Node] = set()
        for node in chained:
            self.blocked.add(node)
            self.blocked.update(node.users)

    # -- labels ---------------------------------------------------------------------------
    def input_label(self, node: fx.Node) -> float:
        """Largest label among the node's inputs (-1 if none)."""
        return max((self.depth[i] for i in node.all_input_nodes if i in self.depth), default=-1.0)

    def user_label(self, node: fx.Node) -> float:
        """Smallest label among the node's users (inf if none)."""
        return min((self.depth[u] for u in node.users if u in self.depth), default=math.inf)

    def set_label(self, nodes: Iterable[fx.Node], label: float) -> None:
        """Give nodes created by a rewrite the label of the computation they replace."""
        for node in nodes:
            self.depth[node] = label

    def movable(self, node: fx.Node) -> bool:
        """May a rule rewrite this node? Not if it is ordered or reads an ordered value."""
        return node not in self.blocked

    # -- exact reachability --------------------------------------------------------------------
    def _build_ancestors(self) -> dict[fx.Node, int]:
        anc: dict[fx.Node, int] = {}
        for node in self.nodes:
            bits = 0
            for inp in node.all_input_nodes:
                bits |= anc.get(inp, 0) | (1 << self.pos[inp])
            anc[node] = bits
        return anc

    def reaches(self, a: fx.Node, b: fx.Node) -> bool:
        """True if there is a data path a -> b (in the graph as indexed)."""
        if self._ancestors is None:
            self._ancestors = self._build_ancestors()
        return bool(self._ancestors[b] >> self.pos[a] & 1)

    def independent(self, nodes: Sequence[fx.Node]) -> bool:
        """No member reaches another (one bitset test per member)."""
        if self._ancestors is None:
            self._ancestors = self._build_ancestors()
        mask = 0
        for node in nodes:
            mask |= 1 << self.pos[node]
        return all(not (self._ancestors[n] & mask) for n in nodes)


def stab_groups(
    items: Sequence[T],
    interval: Callable[[T], tuple[float, float, float]],
    min_size: int,
    max_size: int,
) -> list[tuple[float, list[T]]]:
    """Split ``items`` into groups that can each be placed at one label.

    ``interval(item)`` gives (lo, own, hi): the item may move to any label strictly between lo and
    hi (own is its current label). Candidate labels are the items' own labels; we repeatedly take
    the label covering most remaining items (ties: smallest label), keeping item order. Coverage of
    a label is ``#(lo < l) - #(hi <= l)``, two bisections. Groups larger than ``max_size`` are cut
    into consecutive chunks; groups under ``min_size`` are dropped.
    """
    spans = {i: interval(it) for i, it in enumerate(items)}
    out: list[tuple[float, list[T]]] = []
    labels = sorted({own for _, own, _ in spans.values()})
    # fast path (the usual case): no item can move to another item's label, so the groups are
    # exactly "same own label", found in one pass.
    if all(
        bisect.bisect_right(labels, lo) + 1 == bisect.bisect_left(labels, hi) for lo, _, hi in spans.values()
    ):
        by_label: dict[float, list[int]] = {}
        for i, (_, own, _) in spans.items():
            by_label.setdefault(own, []).append(i)
        for label in sorted(by_label, key=lambda lb: (-len(by_label[lb]), lb)):
            chosen = by_label[label]
            for start in range(0, len(chosen), max_size):
                chunk = chosen[start : start + max_size]
                if len(chunk) >= min_size:
                    out.append((label, [items[i] for i in chunk]))
        return out
    while len(spans) >= min_size:
        los = sorted(lo for lo, _, _ in spans.values())
        his = sorted(hi for _, _, hi in spans.values())
        best_label, best_cover = 0.0, 0
        for label in sorted({own for _, own, _ in spans.values()}):
            cover = bisect.bisect_left(los, label) - bisect.bisect_right(his, label)
            if cover > best_cover:
                best_label, best_cover = label, cover
        if best_cover < min_size:
            break
        chosen = [i for i, (lo, _, hi) in spans.items() if lo < best_label < hi]
        for i in chosen:
            del spans[i]
        for start in range(0, len(chosen), max_size):
            chunk = chosen[start : start + max_size]
            if len(chunk) >= min_size:
                out.append((best_label, [items[i] for i in chunk]))
    return out


def group_by_key(
    nodes: Iterable[fx.Node], key: Callable[[fx.Node], Hashable | None]
) -> dict[Hashable, list[fx.Node]]:
    """Bucket nodes by a rule's key (None: the rule declines the node). Keeps graph order."""
    buckets: dict[Hashable, list[fx.Node]] = {}
    for node in nodes:
        k = key(node)
        if k is not None:
            buckets.setdefault(k, []).append(node)
    return buckets


def _barrier_deps(nodes: Sequence[fx.Node]) -> dict[fx.Node, list[fx.Node]]:
    """Extra dependencies that keep every node between its segment's boundaries: a node depends on
    the boundary opening its segment, a boundary on every node of the segment before it."""
    seg, boundaries = segments(nodes)
    if not boundaries:
        return {}
    is_boundary = set(boundaries)
    extra: dict[fx.Node, list[fx.Node]] = {}
    opening: fx.Node | None = None
    since: list[fx.Node] = []
    for node in nodes:
        if node not in seg:
            continue
        if node in is_boundary:
            extra[node] = since
            since = []
            opening = node
            continue
        if opening is not None:
            extra[node] = [opening]
        since.append(node)
    return extra


class CycleError(RuntimeError):
    """The graph has a dependency cycle (a rewrite went wrong)."""


def stable_toposort(graph: fx.Graph, ordered: set[fx.Node]) -> bool:
    """Reorder ``graph`` topologically, moving as little as possible: each node goes where it is,
    unless an input comes later, in which case the input (and its inputs) move up. Ordered nodes
    (effects, mutated values) keep their relative order through chain edges. Returns True if
    anything moved; raises CycleError on a cycle. O(nodes + edges)."""
    nodes = list(graph.nodes)
    chain: dict[fx.Node, fx.Node] = {}
    last: fx.Node | None = None
    for node in nodes:
        if node in ordered or node.op == "output" or context_kind(node) is not None:
            if last is not None:
                chain[node] = last
            last = node
    barrier = _barrier_deps(nodes)

    def deps(node: fx.Node) -> list[fx.Node]:
        found = list(node.all_input_nodes)
        if node in chain:
            found.append(chain[node])
        return [*found, *barrier.get(node, ())]

    placed: set[fx.Node] = set()
    out: list[fx.Node] = []
    for root in nodes:
        if root in placed:
            continue
        visiting = {root}
        stack = [(root, iter(deps(root)))]
        while stack:
            node, pending = stack[-1]
            for dep in pending:
                if dep in placed:
                    continue
                if dep in visiting:
                    raise CycleError(f"cycle through {dep.format_node()}")
                visiting.add(dep)
                stack.append((dep, iter(deps(dep))))
                break
            else:
                stack.pop()
                visiting.discard(node)
                placed.add(node)
                out.append(node)
    if out == nodes:
        return False
    if out[0] is not nodes[0]:
        nodes[0].prepend(out[0])
    for prev, node in itertools.pairwise(out):
        if node.prev is not prev:
            prev.append(node)
    return True
