"""Live bytes: how much tensor memory a graph holds at once, and what a horizontal fusion adds.

WHY: horizontal fusion computes G members as one op, so their G outputs exist together (one
stacked buffer, freed only when the last member piece dies) where the unfused graph may have
held one member's output at a time, and a stack that cannot be a view copies its inputs while
the originals are still alive. The time-based cost model cannot see that; the driver weighs
these bytes against the graph's estimated peak (``OptimusConfig.memory_margin`` and
``memory_budget_bytes``, see docs/optimus.md, "Memory is a cost").

The estimate, forward only and in the graph's current node order:

- a node whose output is new storage (not a view, not in place: ``effects.may_alias_output``)
  holds ``nbytes`` of its tensor meta from its own position through its last reader, where a
  reader that may alias it (a view, ``getitem`` of a split/unbind) passes on its own last reader;
- graph inputs (placeholders) are held through the whole graph; parameters and buffers
  (``get_attr``) are not counted: they are alive in every mode, whatever the optimizer does;
- unknown sizes count 0, so the estimate is a lower bound.

In training, autograd keeps saved activations past their last forward reader; that is not
modelled (the estimate prices the forward's own working set).
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from itertools import accumulate
from typing import Any

from torch import fx

from optimus.semantics.effects import may_alias_output
from optimus.semantics.meta import TensorMeta, value_meta


def output_bytes(node: fx.Node) -> int:
    """Bytes of the tensor(s) ``node`` returns, by its meta (0 where unknown)."""
    value = value_meta(node)
    metas = value if isinstance(value, tuple) else (value,)
    return sum(m.nbytes for m in metas if isinstance(m, TensorMeta))


@dataclass(frozen=True)
class LiveEstimate:
    """Live bytes at every position of one node order (see the module docstring)."""

    live: tuple[float, ...]  # live[i]: bytes held while node i runs
    last: dict[fx.Node, int]  # position of the last reader of each node's storage
    pos: dict[fx.Node, int]

    @property
    def peak(self) -> float:
        return max(self.live, default=0.0)

    def at(self, node: fx.Node) -> float:
        """Live bytes while ``node`` runs (0 for a node not in this order)."""
        i = self.pos.get(node)
        return self.live[i] if i is not None else 0.0


def estimate(nodes: Sequence[fx.Node], canons: dict[fx.Node, Any]) -> LiveEstimate:
    """The live-bytes curve of ``nodes`` (a graph's nodes in order); O(nodes + edges)."""
    pos = {n: i for i, n in enumerate(nodes)}
    end = len(nodes) - 1
    aliases = {n: n.op != "output" and may_alias_output(n, canons.get(n)) for n in nodes}  # once each
    last: dict[fx.Node, int] = {}
    for node in reversed(nodes):
        if node.op == "placeholder":
            last[node] = end
            continue
        reach = pos[node]
        for user in node.users:
            if user not in pos:
                continue
            reach = max(reach, pos[user])
            if aliases[user]:
                reach = max(reach, last.get(user, pos[user]))
        last[node] = reach
    delta = [0.0] * (len(nodes) + 1)
    for node in nodes:
        nbytes = 0 if aliases[node] or node.op in ("get_attr", "output") else output_bytes(node)
        if nbytes:
            delta[pos[node]] += nbytes
            delta[last[node] + 1] -= nbytes
    live = tuple(accumulate(delta[:-1]))
    return LiveEstimate(live, last, pos)


def most_alive_at_once(members: Iterable[fx.Node], est: LiveEstimate, nbytes: Sequence[float]) -> float:
    """The largest total of ``nbytes`` over members whose storages are alive together in the
    current order (a sweep over their [position, last reader] intervals)."""
    events: list[tuple[int, int, float]] = []
    for node, size in zip(members, nbytes, strict=True):
        start = est.pos.get(node)
        if start is None:
            continue
        events.append((start, 0, size))  # starts sort before ends at the same position
        events.append((est.last.get(node, start), 1, -size))
    best = cur = 0.0
    for _, _, size in sorted(events):
        cur += size
        best = max(best, cur)
    return best


def horizontal_live(
    nodes: Sequence[fx.Node], est: LiveEstimate, fresh_inputs: float = 0.0, kept: float = 0.0
) -> tuple[float, float]:
    """(before, after) live bytes of fusing ``nodes`` into one op whose output is stacked.

    before: the most member outputs the current order holds at once. after: all member outputs
    together (one stacked buffer lives until its last piece dies), plus ``fresh_inputs`` (stacked
    input copies, alive beside the originals while the fused op runs) and ``kept`` (per-call
    buffers such as weights stacked at run time)."""
    sizes = [float(output_bytes(n)) for n in nodes]  # members are fresh ops (linear, norm, ...)
    return most_alive_at_once(nodes, est, sizes), sum(sizes) + fresh_inputs + kept
