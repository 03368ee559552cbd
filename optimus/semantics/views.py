"""Shared reading of split / cat / stack / unbind nodes for the split/cat rule family.

WHY one module: the same tensor split reaches a graph as ``torch.split(x, 2, 1)``,
``x.split([2, 2], dim=-1)``, ``torch.chunk``, ``x.split_with_sizes``, ``torch.tensor_split`` or
(after another rewrite) a tuple slice of a split; cats come as ``torch.cat`` / ``torch.concat`` /
``torch.concatenate`` with the dim positional, by keyword, negative or missing. Every rule here
reads them through :func:`split_view`, :func:`cat_view`, :func:`stack_view` and
:func:`unbind_view`, which answer in one form (input, non-negative dim, sizes read from the
shapes the capture recorded), so no rule repeats the call-form cases or gets a negative dim
wrong. They answer None whenever shapes are unknown or symbolic: rules then decline.

Costs of these ops are in :mod:`._split_cat_cost`; the rule base the family uses (several nodes
replaced at once) is :mod:`._node_set_rule`.
"""

from __future__ import annotations

import operator
import weakref
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import torch
from torch import fx

from optimus.semantics.meta import TensorMeta

if TYPE_CHECKING:
    from optimus.semantics.graph_view import GraphView

CALLS = ("call_function", "call_method")

# Call forms the engine's normalize table does not know (read here by signature). The ATen
# ``tensor_split`` overloads name their second argument ``sections`` or ``indices``; the
# ``tensor_indices_or_sections`` overload (a tensor) is not read (a node there declines).
_TENSOR_SPLIT_FUNCS: tuple[Any, ...] = (
    torch.tensor_split,
    torch.ops.aten.tensor_split.sections,
    torch.ops.aten.tensor_split.indices,
    torch.ops.aten.tensor_split,
)
_SPLIT_WITH_SIZES_FUNCS: tuple[Any, ...] = tuple(
    f for f in (getattr(torch, "split_with_sizes", None),) if f is not None
)


SPLITS = frozenset({"split", "chunk", "tensor_split", "split_with_sizes"})
_KIND_BY_NAME = {
    "tensor_split": "tensor_split",
    "split_with_sizes": "split_with_sizes",
    "narrow": "narrow",
    "matmul": "matmul",  # torch.matmul, operator.matmul, x.matmul (vector_matmul anchors on them)
    "__matmul__": "matmul",
    "bmm": "bmm",
    "embedding": "embedding",  # F.embedding (embedding_index_select anchors on it)
}
_KINDS: weakref.WeakKeyDictionary[Any, dict[str, list[fx.Node]]] = weakref.WeakKeyDictionary()


def op_kind(node: fx.Node, ctx: GraphView) -> str | None:
    """The canonical op of a call, or the name of a split-family target the engine does not know."""
    if node.op not in CALLS:
        return None
    canon = ctx.canon(node)
    if canon is not None:
        return canon.op
    if node.op == "call_function" and node.target in _TENSOR_SPLIT_FUNCS:
        return "tensor_split"
    name = node.target if isinstance(node.target, str) else getattr(node.target, "__name__", "")
    return _KIND_BY_NAME.get(name)


def nodes_of_kind(ctx: GraphView, kinds: frozenset[str]) -> list[fx.Node]:
    """The indexed nodes whose ``op_kind`` is in ``kinds``, in graph order (bucketed once per
    round, so each rule visits only the nodes it can anchor on)."""
    buckets = _KINDS.get(ctx.index)
    if buckets is None:
        buckets = {}
        for node in ctx.index.nodes:
            kind = op_kind(node, ctx)
            if kind is not None:
                buckets.setdefault(kind, []).append(node)
        _KINDS[ctx.index] = buckets
    found = [n for k in kinds for n in buckets.get(k, ())]
    if len(kinds) > 1:
        found.sort(key=ctx.index.pos.__getitem__)
    return found


# -- small readers ------------------------------------------------------------------------------
def norm_dim(dim: Any, rank: int | None) -> int | None:
    """``dim`` in [0, rank) or None if it is not a plain int in [-rank, rank)."""
    if rank is None or isinstance(dim, bool) or not isinstance(dim, int):
        return None
    if not -rank <= dim < rank:
        return None
    return dim % rank if rank else None


def piece_metas(node: fx.Node, ctx: GraphView) -> tuple[TensorMeta, ...] | None:
    metas = ctx.value_meta(node)
    if not isinstance(metas, tuple) or not all(isinstance(m, TensorMeta) for m in metas):
        return None
    return metas


_BIND_ALIASES = {
    "tensor": "input",
    "self": "input",
    "axis": "dim",
    "sections": "indices_or_sections",
    "indices": "indices_or_sections",
}


def _bind(node: fx.Node, names: Sequence[str], defaults: dict[str, Any]) -> dict[str, Any] | None:
    """Bind a call's args/kwargs to ``names`` (first is the tensor). None if it does not fit."""
    args = list(node.args)
    if len(args) > len(names):
        return None
    out = dict(zip(names, args, strict=False))
    for key, value in node.kwargs.items():
        # ``axis=``: NumPy's name for ``dim``, taken by these builtins' argument parser
        key = _BIND_ALIASES.get(key, key)
        if key in out or key not in names:
            return None
        out[key] = value
    for key, value in defaults.items():
        out.setdefault(key, value)
    return out if all(n in out for n in names) else None


# -- views ---------------------------------------------------------------------------------------
@dataclass(frozen=True)
class SplitView:
    """A node returning contiguous, non-overlapping pieces of ``input`` along ``dim``, in order,
    that together cover it: ``sizes[i]`` is piece i's extent. Covers split (int or list),
    split_with_sizes, chunk and tensor_split (when its pieces tile the input)."""

    node: fx.Node
    input: fx.Node
    dim: int
    sizes: tuple[int, ...]
    form: str  # "split" | "chunk" | "split_with_sizes" | "tensor_split"

    @property
    def offsets(self) -> tuple[int, ...]:
        out, acc = [], 0
        for s in self.sizes:
            out.append(acc)
            acc += s
        return tuple(out)

    @property
    def total(self) -> int:
        return sum(self.sizes)


def _split_args(node: fx.Node, ctx: GraphView) -> tuple[fx.Node, Any, str] | None:
    """(input, dim, form) for any split-like call form, else None."""
    if node.op not in CALLS:
        return None
    canon = ctx.canon(node)
    if canon is not None and canon.op in ("split", "chunk") and not canon.inplace:
        return canon["input"], canon["dim"], canon.op
    name = node.target if node.op == "call_method" else None
    if (node.op == "call_function" and node.target in _TENSOR_SPLIT_FUNCS) or name == "tensor_split":
        bound = _bind(node, ("input", "indices_or_sections", "dim"), {"dim": 0})
        if bound is None or isinstance(bound["indices_or_sections"], fx.Node):
            return None
        return bound["input"], bound["dim"], "tensor_split"
    if (node.op == "call_function" and node.target in _SPLIT_WITH_SIZES_FUNCS) or name == "split_with_sizes":
        bound = _bind(node, ("input", "split_sizes", "dim"), {"dim": 0})
        if bound is None:
            return None
        return bound["input"], bound["dim"], "split_with_sizes"
    return None


def split_view(node: Any, ctx: GraphView) -> SplitView | None:
    if not isinstance(node, fx.Node):
        return None
    found = _split_args(node, ctx)
    if found is None:
        return None
    inp, dim, form = found
    if not isinstance(inp, fx.Node):
        return None
    whole = ctx.meta(inp)
    pieces = piece_metas(node, ctx)
    if whole is None or pieces is None or not pieces:
        return None
    d = norm_dim(dim, len(whole.shape))
    if d is None:
        return None
    for p in pieces:  # every piece keeps the rank and the other extents
        if len(p.shape) != len(whole.shape) or any(
            a != b for i, (a, b) in enumerate(zip(p.shape, whole.shape, strict=True)) if i != d
        ):
            return None
    sizes = tuple(p.shape[d] for p in pieces)
    if sum(sizes) != whole.shape[d]:
        return None  # tensor_split with unsorted indices overlaps: not a tiling
    return SplitView(node, inp, d, sizes, form)


@dataclass(frozen=True)
class UnbindView:
    node: fx.Node
    input: fx.Node
    dim: int
    count: int


def unbind_view(node: Any, ctx: GraphView) -> UnbindView | None:
    if not isinstance(node, fx.Node) or node.op not in CALLS:
        return None
    canon = ctx.canon(node)
    if canon is None or canon.op != "unbind" or not isinstance(canon["input"], fx.Node):
        return None
    whole = ctx.meta(canon["input"])
    pieces = piece_metas(node, ctx)
    if whole is None or pieces is None:
        return None
    d = norm_dim(canon["dim"], len(whole.shape))
    if d is None or len(pieces) != whole.shape[d]:
        return None
    return UnbindView(node, canon["input"], d, len(pieces))


@dataclass(frozen=True)
class ListView:
    """``torch.cat(tensors, dim)`` or ``torch.stack(tensors, dim)`` with ``dim`` non-negative
    (relative to the output's rank). A cat may read a split's whole tuple (symbolic_trace leaves
    ``torch.cat(torch.split(x, 2))`` so): ``whole`` is then that split node and ``tensors`` empty."""

    node: fx.Node
    op: str  # "cat" | "stack"
    tensors: tuple[fx.Node, ...]
    dim: int
    whole: fx.Node | None = None


def _list_view(node: Any, ctx: GraphView, op: str) -> ListView | None:
    if not isinstance(node, fx.Node) or node.op not in CALLS:
        return None
    canon = ctx.canon(node)
    if canon is None or canon.op != op:
        return None
    out = ctx.meta(node)
    if out is None:
        return None
    d = norm_dim(canon["dim"], len(out.shape))
    if d is None:
        return None
    tensors = canon["tensors"]
    if isinstance(tensors, fx.Node):  # the whole tuple of a split, passed as one value
        if op != "cat" or split_view(tensors, ctx) is None:
            return None
        return ListView(node, op, (), d, whole=tensors)
    if not isinstance(tensors, (list, tuple)) or not tensors:
        return None
    if not all(isinstance(t, fx.Node) for t in tensors):
        return None
    for t in tensors:  # legacy cat accepts 1-D empty tensors of any shape: not ours to reason about
        meta = ctx.meta(t)
        if meta is None or len(meta.shape) != (len(out.shape) if op == "cat" else len(out.shape) - 1):
            return None
    return ListView(node, op, tuple(tensors), d)


def cat_view(node: Any, ctx: GraphView) -> ListView | None:
    return _list_view(node, ctx, "cat")


def stack_view(node: Any, ctx: GraphView) -> ListView | None:
    return _list_view(node, ctx, "stack")


# -- getitem bookkeeping -------------------------------------------------------------------------
def _is_getitem(node: fx.Node) -> bool:
    return node.op == "call_function" and node.target is operator.getitem


def item_of(node: Any) -> tuple[fx.Node, int] | None:
    """``getitem(T, i)`` -> (T, i), seeing through tuple slices ``getitem(getitem(T, a:b), i)``."""
    if not isinstance(node, fx.Node) or not _is_getitem(node) or len(node.args) != 2:
        return None
    src, idx = node.args
    if not isinstance(src, fx.Node) or isinstance(idx, bool) or not isinstance(idx, int) or idx < 0:
        return None
    if _is_getitem(src) and len(src.args) == 2 and isinstance(src.args[1], slice):
        sl = src.args[1]
        base = src.args[0]
        if not isinstance(base, fx.Node) or sl.step not in (None, 1):
            return None
        start = sl.start or 0
        if not isinstance(start, int) or start < 0:
            return None
        return base, start + idx
    return src, idx


@dataclass(frozen=True)
class Pieces:
    """Users of a tuple-valued node: ``items[i]`` lists the ``getitem(node, i)`` users."""

    items: dict[int, list[fx.Node]]
    others: list[fx.Node]  # users that are not plain int getitems (e.g. a cat of the whole tuple)


def unbind_run(tensors: Sequence[Any], ctx: GraphView) -> tuple[fx.Node, UnbindView, list[int]] | None:
    """(unbind tuple, its view, indices) when ``tensors`` are consecutive pieces of one unbind, else None.

    Why shared: stack(unbind(x)) and cat(unbind(x)) elimination both start from this same run."""
    items = [item_of(t) for t in tensors]
    if any(it is None for it in items):
        return None
    sources = {it[0] for it in items if it is not None}
    if len(sources) != 1:
        return None
    source = sources.pop()
    unbind = unbind_view(source, ctx)
    indices = [it[1] for it in items if it is not None]
    first = indices[0]
    if unbind is None or indices != list(range(first, first + len(indices))) or indices[-1] >= unbind.count:
        return None
    return source, unbind, indices


def pieces_of(node: fx.Node) -> Pieces:
    items: dict[int, list[fx.Node]] = {}
    others: list[fx.Node] = []
    for u in node.users:
        if _is_getitem(u) and len(u.args) == 2 and isinstance(u.args[1], int) and u.args[0] is node:
            items.setdefault(u.args[1], []).append(u)
        else:
            others.append(u)
    return Pieces(items, others)


def only_used_by(node: fx.Node, users: Sequence[fx.Node]) -> bool:
    """Every user of ``node`` is in ``users`` (so ``node`` dies when they stop reading it)."""
    allowed = set(users)
    return all(u in allowed for u in node.users)


def tuple_dies_with(node: fx.Node, readers: Sequence[fx.Node]) -> bool:
    """A tuple-valued node dies if each of its users is a getitem used only by ``readers``
    (or is itself one of ``readers``)."""
    allowed = set(readers)
    for u in node.users:
        if u in allowed:
            continue
        if not _is_getitem(u) or not only_used_by(u, readers):
            return False
    return True


@dataclass(frozen=True)
class Piece:
    """A value that is ``source[..., start:start+length, ...]`` along ``dim``: a getitem of a split,
    ``torch.narrow`` / ``Tensor.narrow``, or a basic slice ``x[:, a:b]`` (step 1). ``holders`` are
    the view nodes that exist only to produce it (the split, or the narrow/slice node itself)."""

    node: fx.Node
    source: fx.Node
    dim: int
    start: int
    length: int
    holder: fx.Node  # the split (tuple) or the narrow/slice node


def piece_of(node: Any, ctx: GraphView) -> Piece | None:
    if not isinstance(node, fx.Node) or node.op not in CALLS:
        return None
    item = item_of(node)
    if item is not None:
        split = split_view(item[0], ctx)
        if split is not None and item[1] < len(split.sizes):
            i = item[1]
            return Piece(node, split.input, split.dim, split.offsets[i], split.sizes[i], item[0])
        if split is not None or not isinstance(node.args[1], (slice, tuple)):
            return None
    return _narrow_piece(node, ctx) or _slice_piece(node, ctx)


def adjacent_pieces(tensors: Sequence[Any], ctx: GraphView) -> list[Piece] | None:
    """The pieces of ``tensors`` if they are adjacent equal runs of one source along one dim, in
    order (``source[k*L : (k+1)*L]`` for k = 0, 1, ...; L > 0), else None."""
    pieces: list[Piece] = []
    for k, t in enumerate(tensors):
        p = piece_of(t, ctx)
        first = pieces[0] if pieces else p
        if (
            p is None
            or first is None
            or first.length == 0
            or p.source is not first.source
            or p.dim != first.dim
            or p.length != first.length
            or p.start != first.start + k * first.length
        ):
            return None
        pieces.append(p)
    return pieces or None


def _narrow_piece(node: fx.Node, ctx: GraphView) -> Piece | None:
    is_narrow = (node.op == "call_function" and node.target is torch.narrow) or (
        node.op == "call_method" and node.target == "narrow"
    )
    if not is_narrow:
        return None
    bound = _bind(node, ("input", "dim", "start", "length"), {})
    if bound is None or not isinstance(bound["input"], fx.Node):
        return None
    meta = ctx.meta(bound["input"])
    d = norm_dim(bound["dim"], None if meta is None else len(meta.shape))
    start, length = bound["start"], bound["length"]
    if meta is None or d is None or not all(type(v) is int for v in (start, length)):
        return None
    if start < 0:
        start += meta.shape[d]
    if not (start >= 0 and length >= 0 and start + length <= meta.shape[d]):
        return None
    return Piece(node, bound["input"], d, start, length, node)


def _slice_piece(node: fx.Node, ctx: GraphView) -> Piece | None:
    """``x[a:b]`` or ``x[:, a:b]``: exactly one restricting slice with step 1, others ``:``."""
    if not _is_getitem(node) or len(node.args) != 2 or not isinstance(node.args[0], fx.Node):
        return None
    source, index = node.args[0], node.args[1]
    assert isinstance(source, fx.Node)
    meta = ctx.meta(source)
    slices = index if isinstance(index, tuple) else (index,)
    if meta is None or not slices or len(slices) > len(meta.shape):
        return None
    found: tuple[int, int, int] | None = None
    for d, sl in enumerate(slices):
        if not isinstance(sl, slice) or not all(v is None or type(v) is int for v in (sl.start, sl.stop)):
            return None
        if sl.step not in (None, 1):
            return None
        start, stop, _ = sl.indices(meta.shape[d])
        if (start, stop) == (0, meta.shape[d]):
            continue
        if found is not None:
            return None
        found = (d, start, max(stop - start, 0))
    if found is None:
        return None
    return Piece(node, source, found[0], found[1], found[2], node)


def all_movable(nodes: Sequence[Any], ctx: GraphView) -> bool:
    """No node is ordered (effectful, or in the alias class of a mutated value)."""
    return all(not isinstance(n, fx.Node) or ctx.movable(n) for n in nodes)


def is_graph_output_alias(old: fx.Node, new: fx.Node) -> bool:
    """Would replacing ``old`` (a graph output) by ``new`` or a view of ``new`` hand the caller a
    model input or parameter's own storage instead of a copy? We decline that: a caller writing
    into the output would write into the input."""
    return new.op in ("placeholder", "get_attr") and any(u.op == "output" for u in old.users)


def run_at(tensors: Sequence[Any], i: int, ctx: GraphView) -> tuple[Any, ...] | None:
    """("run", Y, e, start, n, count, tuple) if tensors[i:i+n] (n >= 2) are consecutive pieces of
    one ``unbind(Y, e)``, taking the longest such run; else None."""
    first = item_of(tensors[i])
    if first is None:
        return None
    source, start = first
    unbind = unbind_view(source, ctx)
    if unbind is None:
        return None
    n = 1
    while i + n < len(tensors) and item_of(tensors[i + n]) == (source, start + n):
        n += 1
    if n < 2 or start + n > unbind.count:
        return None
    return ("run", unbind.input, unbind.dim, start, n, unbind.count, source)


def split_runs(tensors: Sequence[Any], ctx: GraphView) -> list[tuple[Any, ...]]:
    """``tensors`` cut into ("one", t) items and ("run", Y, e, start, n, count, tuple) runs of two
    or more consecutive pieces of one ``unbind(Y, e)`` (see ``run_at``), in order."""
    parts: list[tuple[Any, ...]] = []
    i = 0
    while i < len(tensors):
        run = run_at(tensors, i, ctx)
        if run is not None:
            parts.append(run)
            i += run[4]
        else:
            parts.append(("one", tensors[i]))
            i += 1
    return parts
