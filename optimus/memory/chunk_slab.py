"""A chunked chain's input that is a column slab of one linear: computed per chunk, not whole.

WHY: ``merge_shared_linear`` computes MMoE's experts' first layers and the tasks' gates as one
GEMM over the shared input, ``[B, E * H + gates]``; the experts' chain reads its ``[E, B, H]``
slab as ``movedim(unflatten(narrow(L, 1, 0, E * H), 1, (E, H)), 1, 0)`` and the gates read the
rest. Chunked (:mod:`optimus.memory.chunked`), the experts ran two at a time while ``L`` stayed
alive whole (2.1 MB at medium, B = 256, E = 8, H = 256) until the last gate's softmax: MMoE
medium inference peaked 8.0% above plain compile, which runs one expert's GEMM at a time.
Computed per chunk, ``linear(x, W[rows], b[rows])`` over the chunk's members' rows, and the
columns read elsewhere by a linear of their own rows, ``L`` never exists whole.

Each output column of a linear is the dot product of ``x`` with one row of ``W`` plus one bias
entry: the same values over any subset of rows, up to the last bits a GEMM library may block
otherwise for another width (as batching itself does). Where the rest of ``L`` is read in a way
this cannot show (a reader other than a column ``narrow`` or a ``split`` read by ``getitem``, or
columns the slab overlaps), the slab is not recognised and the chunks read ``narrow`` views of
the whole value, as before.
"""

from __future__ import annotations

import itertools
import operator
from dataclasses import dataclass
from typing import Any

import torch
import torch.nn.functional as F
from torch import fx

from optimus.semantics.meta import propagate, tensor_meta
from optimus.semantics.normalize import canonicalize
from optimus.semantics.views import pieces_of


@dataclass(frozen=True)
class Slab:
    """``source`` is ``movedim(unflatten(narrow(linear, 1, offset, G * width), 1, (G, width)), 1, 0)``
    (without the ``narrow`` when the slab starts at column 0 and is the whole output)."""

    source: fx.Node
    linear: fx.Node
    x: fx.Node
    weight: fx.Node
    bias: fx.Node | None
    offset: int
    width: int
    chain: tuple[fx.Node, ...]  # the views between source and linear: unflatten, narrow?
    rest: tuple[int, int] = (0, 0)  # the columns [lo, hi) the linear's other readers read


def _call(node: Any, name: str) -> bool:
    """``node`` calls ``torch.<name>`` or the method ``<name>``."""
    return (
        isinstance(node, fx.Node)
        and node.op in ("call_method", "call_function")
        and (node.target == name or node.target is getattr(torch, name, None))
    )


def _shape(node: Any) -> tuple[int, ...] | None:
    m = tensor_meta(node) if isinstance(node, fx.Node) else None
    return None if m is None else tuple(m.shape)


def _dim1(dim: Any) -> bool:
    return isinstance(dim, int) and dim in (1, -1)  # of a 2-D value


def _columns(node: fx.Node) -> tuple[int, int] | None:
    """(start, length) of ``narrow(v, 1, start, length)`` on a 2-D ``v``, else None."""
    if not _call(node, "narrow") or node.kwargs or len(node.args) != 4 or not _dim1(node.args[1]):
        return None
    start, length = node.args[2], node.args[3]
    if not isinstance(start, int) or not isinstance(length, int) or start < 0 or length < 0:
        return None
    return start, length


def _members(unflat: Any) -> tuple[int, int] | None:
    """(G, width) of ``unflatten(v, 1, (G, width))``, else None."""
    if not _call(unflat, "unflatten") or unflat.kwargs or len(unflat.args) != 3 or unflat.args[1] != 1:
        return None
    sizes = unflat.args[2]
    if not isinstance(sizes, (tuple, list)) or len(sizes) != 2:
        return None
    g, width = sizes
    if not isinstance(g, int) or not isinstance(width, int) or g <= 0 or width <= 0:
        return None
    return g, width


def find(source: fx.Node, ordered: set[fx.Node]) -> Slab | None:
    """The slab ``source`` reads, when it is one this module can compute per chunk; ``ordered``
    is the alias class of values written in place (none of the nodes may be in it)."""
    if not _call(source, "movedim") or source.kwargs or tuple(source.args[1:]) != (1, 0):
        return None
    unflat = source.args[0]
    sizes = _members(unflat)
    if sizes is None or not isinstance(unflat, fx.Node) or len(unflat.users) != 1:
        return None
    members, width = sizes
    inner = unflat.args[0]
    offset, chain = 0, [unflat]
    if isinstance(inner, fx.Node) and _call(inner, "narrow"):
        cols = _columns(inner)
        if cols is None or len(inner.users) != 1 or cols[1] != members * width:
            return None
        offset = cols[0]
        chain.append(inner)
        inner = inner.args[0]
    if not isinstance(inner, fx.Node):
        return None
    canon = canonicalize(inner)
    if canon is None or canon.op != "linear" or canon.inplace:
        return None
    x, weight, bias = canon["input"], canon["weight"], canon["bias"]
    x_shape, w_shape, out_shape = _shape(x), _shape(weight), _shape(inner)
    if x_shape is None or w_shape is None or out_shape is None or len(x_shape) != 2 or len(w_shape) != 2:
        return None
    if not isinstance(x, fx.Node) or not isinstance(weight, fx.Node):
        return None
    if bias is not None and (not isinstance(bias, fx.Node) or _shape(bias) != (w_shape[0],)):
        return None
    if offset + members * width > out_shape[1]:
        return None
    if any(n in ordered for n in [source, *chain, inner, x, weight, *([bias] if bias is not None else [])]):
        return None
    chain_nodes = (*chain, source)
    rest = _rest_columns(inner, out_shape[1], chain_nodes)
    if rest is None:
        return None
    lo, hi = rest
    if lo < hi and not (hi <= offset or offset + members * width <= lo):
        return None  # the rest overlaps the slab: computing it again per chunk would not pay
    return Slab(source, inner, x, weight, bias, offset, width, tuple(chain), rest)


def _split_sizes(node: fx.Node, total: int) -> list[int] | None:
    """The pieces' widths of a ``split`` along dim 1 of a ``[B, total]`` value, else None."""
    canon = canonicalize(node)
    if canon is None or canon.op != "split" or not _dim1(canon["dim"]):
        return None
    sections = canon["split_size_or_sections"]
    if isinstance(sections, int) and sections > 0:
        return [min(sections, total - i) for i in range(0, total, sections)]
    if isinstance(sections, (list, tuple)) and all(isinstance(s, int) for s in sections):
        return list(sections) if sum(sections) == total else None
    return None


def _rest_columns(linear: fx.Node, total: int, chain: tuple[fx.Node, ...]) -> tuple[int, int] | None:
    """The column range ``[lo, hi)`` the linear's readers outside the slab's ``chain`` read
    (``(0, 0)`` when none), or None when a reader is not a column ``narrow`` or a ``split``
    read only by ``getitem``."""
    lo, hi = total, 0
    for user in linear.users:
        if user in chain:
            continue
        if _call(user, "narrow"):
            cols = _columns(user)
            if cols is None:
                return None
            lo, hi = min(lo, cols[0]), max(hi, cols[0] + cols[1])
            continue
        sizes = _split_sizes(user, total)
        pieces = pieces_of(user)
        if sizes is None or pieces.others or any(not 0 <= i < len(sizes) for i in pieces.items):
            return None
        bounds = list(itertools.accumulate(sizes, initial=0))
        for i in pieces.items:
            lo, hi = min(lo, bounds[i]), max(hi, bounds[i + 1])
    return (lo, hi) if lo < hi else (0, 0)


def emit(graph: fx.Graph, slab: Slab, start: int, length: int, after: fx.Node) -> fx.Node:
    """Members ``[start, start + length)`` of the slab as ``[length, B, width]``, computed from
    their own rows of the weight, inserted after ``after``; returns the last node made."""
    rows, count = slab.offset + start * slab.width, length * slab.width
    made: list[fx.Node] = [after]

    def add(target: Any, *args: Any) -> fx.Node:
        with graph.inserting_after(made[-1]):
            node = graph.call_function(target, args)
        propagate(node)
        made.append(node)
        return node

    weight = add(torch.narrow, slab.weight, 0, rows, count)
    bias = add(torch.narrow, slab.bias, 0, rows, count) if slab.bias is not None else None
    out = add(F.linear, slab.x, weight, bias)
    out = add(torch.unflatten, out, 1, (length, slab.width))
    return add(torch.movedim, out, 1, 0)


def restrict(graph: fx.Graph, slab: Slab) -> None:
    """After the chunks replaced the slab's chain: the linear computes only the columns its
    other readers read (each re-pointed to the narrower result), or goes when none are left."""
    linear = slab.linear
    if any(u in slab.chain or u is slab.source for u in linear.users):
        return  # the chain is still read: the whole value stays
    if not linear.users:
        graph.erase_node(linear)
        return
    total = _shape(linear)
    if total is None or slab.rest == (0, total[1]):
        return
    lo, hi = slab.rest
    with graph.inserting_before(linear):
        weight = graph.call_function(torch.narrow, (slab.weight, 0, lo, hi - lo))
        propagate(weight)
        bias = None
        if slab.bias is not None:
            bias = graph.call_function(torch.narrow, (slab.bias, 0, lo, hi - lo))
            propagate(bias)
        narrower = graph.call_function(F.linear, (slab.x, weight, bias))
        propagate(narrower)
    for user in list(linear.users):
        cols = _columns(user)
        if cols is not None:
            with graph.inserting_before(user):
                new = graph.call_function(torch.narrow, (narrower, 1, cols[0] - lo, cols[1]))
            propagate(new)
            user.replace_all_uses_with(new)
            graph.erase_node(user)
            continue
        _repoint_split(graph, user, narrower, lo, total[1])
    graph.erase_node(linear)


def _repoint_split(graph: fx.Graph, split: fx.Node, narrower: fx.Node, lo: int, total: int) -> None:
    """``split``'s pieces, read by ``getitem``, taken from ``narrower`` (columns from ``lo`` on)."""
    sizes = _split_sizes(split, total)
    assert sizes is not None
    bounds = list(itertools.accumulate(sizes, initial=0))
    items = pieces_of(split).items
    first, last = min(items), max(items) + 1
    width = _shape(narrower)
    assert width is not None
    with graph.inserting_before(split):
        piece = narrower
        if (bounds[first] - lo, bounds[last] - lo) != (0, width[1]):
            piece = graph.call_function(
                torch.narrow, (narrower, 1, bounds[first] - lo, bounds[last] - bounds[first])
            )
            propagate(piece)
        new = graph.call_function(torch.split, (piece, sizes[first:last], 1))
    propagate(new)
    for g in list(split.users):
        index = g.args[1]
        assert isinstance(index, int)
        with graph.inserting_before(g):
            item = graph.call_function(operator.getitem, (new, index - first))
        propagate(item)
        g.replace_all_uses_with(item)
        graph.erase_node(g)
    graph.erase_node(split)
