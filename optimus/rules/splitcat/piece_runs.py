"""Runs of adjacent equal pieces inside a longer cat/stack input list.

WHY: Inductor's split/cat passes rewrite a run of split pieces that sits among other tensors in a
bigger cat or stack (``stack([a, *split(x, 2, 1), b])``): the run becomes one input and the other
inputs stay. ``cat_pieces``, ``stack_pieces`` and ``reshape_pieces`` each take such a run; they
differ only in how a piece is read (a piece itself, or the piece a reshape reads) and in what the
run becomes, so the cutting of the input list into runs and single inputs is here, once.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from torch import fx

from optimus.rules.splitcat.pricing import copy_cost, views
from optimus.semantics.layouts import fresh_meta, layout_safe
from optimus.semantics.views import Piece, all_movable, only_used_by, tuple_dies_with

if TYPE_CHECKING:
    from optimus.cost.price import Cost
    from optimus.engine.context import RewriteContext


@dataclass(frozen=True)
class Run:
    """``tensors[first:first + len(pieces)]`` read ``pieces``: adjacent equal ranges of one source
    along one dim, in order (two or more)."""

    first: int
    pieces: tuple[Piece, ...]

    @property
    def n(self) -> int:
        return len(self.pieces)


def _follows(prev: Piece, p: Piece) -> bool:
    return (
        p.source is prev.source
        and p.dim == prev.dim
        and p.length == prev.length
        and p.start == prev.start + prev.length
    )


def piece_runs(
    tensors: Sequence[Any], ctx: RewriteContext, piece: Callable[[Any], Piece | None]
) -> list[Run | fx.Node]:
    """``tensors`` cut, in order, into maximal :class:`Run` s (two or more consecutive inputs whose
    ``piece`` are adjacent equal pieces with one shape) and the single inputs between them."""
    found = [piece(t) for t in tensors]
    shapes = [None if (m := ctx.meta(t)) is None else m.shape for t in tensors]
    parts: list[Run | fx.Node] = []
    i = 0
    while i < len(tensors):
        p = found[i]
        end = i + 1
        if p is not None and p.length > 0 and shapes[i] is not None:
            while end < len(tensors):
                q, prev = found[end], found[end - 1]
                if q is None or prev is None or not _follows(prev, q) or shapes[end] != shapes[i]:
                    break
                end += 1
        if end - i >= 2:
            parts.append(Run(i, tuple(found[i:end])))  # type: ignore[arg-type]
        else:
            parts.extend(tensors[i:end])
        i = end
    return parts


def runs_of(parts: Sequence[Run | fx.Node]) -> list[Run]:
    return [p for p in parts if isinstance(p, Run)]


def dying_holders(runs: Sequence[Run], readers: Sequence[fx.Node]) -> int:
    """How many view nodes (a split tuple, or a narrow/slice node) that hold the runs' pieces die
    once ``readers`` stop reading them."""
    holders = {p.holder: p.holder is p.node for r in runs for p in r.pieces}
    return sum(
        1 for h, own in holders.items() if (only_used_by(h, readers) if own else tuple_dies_with(h, readers))
    )


def movable_runs(
    node: fx.Node, tensors: Sequence[Any], ctx: RewriteContext, piece: Callable[[Any], Piece | None]
) -> tuple[list[Run | fx.Node], list[Run], Cost] | None:
    """(parts, runs, what ``node`` costs now) for the cat/stack ``node`` over ``tensors``, when it
    holds a run a rule may rewrite: None when it holds none, when anything involved is mutated or
    effectful, or when a fresh result would break a layout a consumer observes. The one check
    every rule that takes a run inside a bigger cat/stack makes before pricing its own form."""
    parts = piece_runs(tensors, ctx, piece)
    runs = runs_of(parts)
    if not runs:
        return None
    holders = [p.holder for r in runs for p in r.pieces]
    sources = [r.pieces[0].source for r in runs]
    if not all_movable([*tensors, *holders, *sources], ctx) or not layout_safe(node, fresh_meta(node), ctx):
        return None
    return parts, runs, copy_cost(node, ctx) + views(dying_holders(runs, [node]))


__all__ = ["Run", "dying_holders", "movable_runs", "piece_runs", "runs_of"]
