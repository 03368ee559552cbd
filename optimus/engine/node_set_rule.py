"""NodeSetRule: a rule base for rewrites that replace several nodes at once.

WHY: a split's pieces are separate ``getitem`` nodes, so undoing a cat->split round trip means
replacing every getitem of the split, not one node. The engine's horizontal commit path already
does what such a rewrite needs (one replacement per member, all placed at one label, undone as a
unit on rollback); this base only finds a label that fits every member and keeps one rule's
rewrites of one round from building on each other's leftovers. It belongs in the engine as a
third rule kind ("node set"); it lives here because the split/cat rules must not edit engine files.
"""

from __future__ import annotations

import logging
import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, ClassVar

from torch import fx

from optimus.engine.rule import Candidate, Cost
from optimus.semantics.views import all_movable, nodes_of_kind

if TYPE_CHECKING:
    from optimus.engine.builder import Builder
    from optimus.engine.context import RewriteContext

log = logging.getLogger("optimus")


@dataclass(frozen=True)
class Found:
    """One rewrite a :class:`NodeSetRule` offers: replace each of ``members`` (by ``build``)."""

    members: tuple[fx.Node, ...]
    before: Cost
    after: Cost
    data: Any = None
    reads: tuple[fx.Node, ...] = ()  # nodes the rewrite is built from: no other rewrite of this
    # rule may replace them in the same round (the result would still be right, but built from a
    # node that is on its way out, e.g. two nested merges at once leave the middle split alive)
    consumed: tuple[fx.Node, ...] = ()  # nodes that die with the rewrite: listed in the candidate
    # (replaced by themselves) so that no other rule rewrites them in the same round for nothing,
    # when one label fits them and the members (else the rewrite goes ahead without them)


def fitting_label(members: Sequence[fx.Node], ctx: RewriteContext) -> float | None:
    """A label strictly between every member's inputs and users (the engine's placement rule),
    or None when the members' windows do not overlap."""
    lo = max(ctx.index.input_label(m) for m in members)
    hi = min(ctx.index.user_label(m) for m in members)
    if not lo < hi:
        return None
    return lo + 0.5 if math.isinf(hi) else (lo + hi) / 2.0


class NodeSetRule:
    """Replace a set of nodes at once (one replacement each). Override ``find`` and ``build``.

    ``find(node, ctx)`` looks at one anchor node and returns a :class:`Found` (or None);
    ``build(members, data, b)`` returns one replacement per member: an existing node or one built
    with ``b``. The engine's horizontal path commits it (kind "horizontal"), rewiring each
    member's users and undoing all of it together on rollback."""

    name: ClassVar[str] = ""
    kind: ClassVar[str] = "horizontal"
    anchors: ClassVar[frozenset[str]] = frozenset()  # op kinds ``find`` can anchor on (see op_kind)

    def find(self, node: fx.Node, ctx: RewriteContext) -> Found | None:
        raise NotImplementedError

    def build(self, members: Sequence[fx.Node], data: Any, b: Builder) -> Sequence[fx.Node] | None:
        raise NotImplementedError

    def match(self, ctx: RewriteContext) -> list[Candidate]:
        out: list[Candidate] = []
        claimed: set[fx.Node] = set()
        for node in nodes_of_kind(ctx, self.anchors):
            if not ctx.movable(node):
                continue
            try:
                found = self.find(node, ctx)
            except Exception as exc:  # a node form we did not foresee: skip it, keep optimizing
                log.debug(
                    "optimus: %s skipped %s (%s: %s)", self.name, node.format_node(), type(exc).__name__, exc
                )
                continue
            if found is None or not found.members or not all_movable(found.members, ctx):
                continue
            consumed = tuple(c for c in dict.fromkeys(found.consumed) if c not in found.members)
            nodes = (*found.members, *consumed)
            label = fitting_label(nodes, ctx) if all_movable(consumed, ctx) else None
            if label is None:
                nodes = found.members
                label = fitting_label(nodes, ctx)
            if ctx.index.regions.one_segment(nodes) is False:  # grad mode / autocast differ
                ctx.decline(f"{self.name}: rewrite across {ctx.region_name(nodes)} region")
                continue
            touched = (*nodes, *found.reads)
            if label is None or any(m in claimed for m in touched):
                continue  # unplaceable, or one rewrite per node per round
            claimed.update(touched)
            data = (len(found.members), found.data)
            out.append(Candidate(self.name, nodes, found.before, found.after, label, data))
        return out

    def apply(self, cand: Candidate, b: Builder) -> Sequence[fx.Node] | None:
        count, data = cand.data
        built = self.build(cand.nodes[:count], data, b)
        if built is None:
            return None
        return [*built, *cand.nodes[count:]]  # consumed nodes: replaced by themselves
