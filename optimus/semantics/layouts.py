"""Layout and dtype guards for rewrites that hand back a different tensor object for the same values.

WHY: cat and stack always return a new contiguous tensor; ``cat(split(x)) -> x`` or a cat of a
run -> ``x.narrow(..)`` return ``x``'s own layout, which may be strided. The values are equal,
but a later ``.view(..)`` (or ``.stride()``, ``.as_strided``) that worked on the contiguous
copy can raise on the strided one, and pointwise ops carry input strides forward to what they
produce. So a layout-changing replacement is allowed only when no stride-sensitive op is
reachable downstream, or when the recorded strides of old and new values are known and equal.
Likewise cat/stack promote mixed input dtypes, so ``split(cat(xs))[j] -> xs[j]`` needs every
input to have the output's dtype.

What counts as observing a layout (``stride_sensitive``): a graph output (the caller may call
``.view``), a stride-reading op (``view``, ``as_strided``, ``stride``, ...), an in-place op (it
writes through the layout), and any op the engine does not know; ops that carry their input's
layout forward (pointwise, views, reductions) pass the question on to their users; ops that
always return a fresh contiguous tensor (linear, matmul, cat, stack, ``contiguous``) end it.
Horizontal rules ask the same question (``layout_observed``) before handing back a batched
result's strided piece, and add a ``.contiguous()`` copy only where the answer is yes.
"""

from __future__ import annotations

import itertools
import weakref
from typing import TYPE_CHECKING, Any

import torch
from torch import fx

from optimus.cost.price import Cost
from optimus.semantics.effects import mutated_args
from optimus.semantics.meta import TensorMeta

if TYPE_CHECKING:
    from optimus.semantics.graph_view import GraphView

_SENSITIVE_METHODS = frozenset(
    {"view", "view_as", "as_strided", "is_contiguous", "stride", "data_ptr", "storage_offset"}
)
_SENSITIVE_FUNCTIONS: frozenset[Any] = frozenset(
    {torch.Tensor.view, torch.Tensor.view_as, torch.as_strided, torch.Tensor.as_strided}
)
# ops whose output layout does not follow their inputs' (fresh contiguous results)
_BARRIER_CANON = frozenset({"linear", "layer_norm", "cat", "stack", "contiguous"})
_BARRIER_FUNCTIONS: frozenset[Any] = frozenset(
    {torch.bmm, torch.baddbmm, torch.mm, torch.matmul, torch.addmm}
)

# ops the engine has no canonical form for but whose output layout follows their input's (or is
# fresh): their users decide. Anything else unknown is assumed to observe the layout.
_PROPAGATING_FUNCTIONS: frozenset[Any] = frozenset(
    {
        torch.sum,
        torch.mean,
        torch.amax,
        torch.amin,
        torch.softmax,
        torch.log_softmax,
        torch.nn.functional.softmax,
        torch.nn.functional.log_softmax,
        torch.where,
        torch.clone,
        torch.narrow,
        torch.select,
        torch.movedim,
        torch.unflatten,
        torch.squeeze,
        torch.unsqueeze,
        torch.t,
        torch.detach,
        torch.masked_fill,
    }
)
_PROPAGATING_METHODS = frozenset(
    {
        "sum",
        "mean",
        "amax",
        "amin",
        "softmax",
        "log_softmax",
        "clone",
        "narrow",
        "select",
        "movedim",
        "unflatten",
        "t",
        "detach",
        "to",
        "float",
        "double",
        "half",
        "bfloat16",
        "type_as",
        "expand",
        "expand_as",
        "masked_fill",
        "size",
        "dim",
        "numel",
    }
)

# view-like ops: their output's strides are their input's strides rearranged, so an observer of
# the output's exact strides observes the input's (pointwise ops only pass the stride order on)
_VIEW_CANON = frozenset({"split", "chunk", "unbind", "getitem", "reshape", "view", "permute", "transpose"})
_VIEW_CANON |= frozenset({"flatten", "unsqueeze", "squeeze", "dropout"})
_VIEW_FUNCTIONS: frozenset[Any] = frozenset(
    {torch.narrow, torch.select, torch.movedim, torch.unflatten, torch.squeeze, torch.unsqueeze, torch.t}
) | frozenset({torch.detach})
_VIEW_METHODS = frozenset(
    {"narrow", "select", "movedim", "unflatten", "t", "detach", "to", "expand", "expand_as"}
)

EXACT = 2  # the exact strides can be observed
ORDER = 1  # only the order of the strides (pointwise results follow it)
NONE = 0

_CACHE: weakref.WeakKeyDictionary[Any, dict[fx.Node, int]] = weakref.WeakKeyDictionary()


def _is_sensitive_op(node: fx.Node) -> bool:
    if node.op == "call_method":
        return str(node.target) in _SENSITIVE_METHODS
    if node.op == "call_function":
        try:
            return node.target in _SENSITIVE_FUNCTIONS
        except TypeError:
            return False
    return False


def _in(node: fx.Node, functions: frozenset[Any], methods: frozenset[str]) -> bool:
    if node.op == "call_method":
        return str(node.target) in methods
    if node.op == "call_function":
        try:
            return node.target in functions
        except TypeError:
            return False
    return False


def _is_barrier(node: fx.Node, ctx: GraphView) -> bool:
    canon = ctx.canon(node)
    if canon is not None and canon.op in _BARRIER_CANON:
        return True
    return _in(node, _BARRIER_FUNCTIONS, frozenset())


def _is_view(node: fx.Node, ctx: GraphView) -> bool:
    canon = ctx.canon(node)
    if canon is not None:
        return canon.op in _VIEW_CANON
    return _in(node, _VIEW_FUNCTIONS, _VIEW_METHODS)


def _is_known(node: fx.Node, ctx: GraphView) -> bool:
    """The engine knows how this op treats its input's layout (canonical, or listed above)."""
    if ctx.canon(node) is not None:
        return True
    return _in(
        node,
        _PROPAGATING_FUNCTIONS | _BARRIER_FUNCTIONS | _VIEW_FUNCTIONS,
        _PROPAGATING_METHODS | _VIEW_METHODS,
    )


def _observes(user: fx.Node, value: fx.Node, ctx: GraphView) -> bool:
    """Does ``user`` observe ``value``'s exact layout itself (not through its own users)?"""
    if user.op == "output" or _is_sensitive_op(user):
        return True
    if value in mutated_args(user, ctx.canon(user)):
        return True  # writes through the layout
    return not _is_known(user, ctx)


def _levels(ctx: GraphView) -> dict[fx.Node, int]:
    """How much of each node's layout can be observed (one reverse pass per round)."""
    found = _CACHE.get(ctx.index)
    if found is not None:
        return found
    level: dict[fx.Node, int] = {}
    for node in reversed(ctx.index.nodes):
        best = NONE
        for user in node.users:
            if _observes(user, node, ctx):
                best = EXACT
                break
            if _is_barrier(user, ctx):
                continue
            seen = level.get(user, NONE)
            best = max(best, seen if _is_view(user, ctx) else min(seen, ORDER))
        if best:
            level[node] = best
    _CACHE[ctx.index] = level
    return level


def observed_level(node: fx.Node, ctx: GraphView) -> int:
    """EXACT, ORDER or NONE: what a consumer (or the caller) can observe of ``node``'s strides."""
    if node not in ctx.index.pos:
        return EXACT  # made this round: not indexed, assume the worst
    return _levels(ctx).get(node, NONE)


def copies_if_strided(nodes: Any, ctx: GraphView) -> Cost:
    """What ``.contiguous()`` copies of the members whose exact strides are observed cost: the
    price of handing back a strided piece of a batched result (see ``rules.base.keep_layouts``)."""
    from optimus.semantics.meta import tensor_meta

    total = Cost()
    for node in nodes:
        if observed_level(node, ctx) == EXACT:
            meta = tensor_meta(node)
            total = total + Cost(launches=1.0, bytes=0.0 if meta is None else 2.0 * meta.nbytes)
    return total


def stride_sensitive(node: fx.Node, ctx: GraphView) -> bool:
    return observed_level(node, ctx) != NONE


def _norm(meta: TensorMeta) -> tuple[int, ...] | None:
    """Strides with the (meaningless) strides of size-1 dims blanked out."""
    if meta.stride is None:
        return None
    return tuple(0 if size == 1 else s for size, s in zip(meta.shape, meta.stride, strict=True))


def row_major(meta: TensorMeta) -> bool:
    """Strides decrease along the dims (size-1 dims ignored): a pointwise op on it returns a
    contiguous tensor, gaps or not."""
    strides = [s for size, s in zip(meta.shape, meta.stride or (), strict=False) if size != 1]
    return meta.stride is not None and all(a >= b for a, b in itertools.pairwise(strides))


def compatible(eager: TensorMeta | None, new: TensorMeta | None, level: int) -> bool:
    """May a value with layout ``new`` stand for one eager laid out as ``eager``, when ``level``
    of its layout is observed?"""
    if level == NONE:
        return True
    if eager is None or new is None or eager.stride is None or new.stride is None:
        return False
    if _norm(eager) == _norm(new):
        return True
    return level == ORDER and row_major(eager) and row_major(new)


def layout_observed(node: fx.Node, new: TensorMeta | None, ctx: GraphView) -> bool:
    """Would replacing ``node`` by a value laid out as ``new`` be observable?"""
    from optimus.semantics.meta import tensor_meta

    return not compatible(tensor_meta(node), new, observed_level(node, ctx))


def layout_safe(old: fx.Node, new: fx.Node | TensorMeta | None, ctx: GraphView) -> bool:
    """May ``old`` be replaced by ``new`` (a node, the layout of a value the rewrite will build,
    see ``built_meta``, or None: layout unknown)?"""
    from optimus.semantics.meta import tensor_meta

    level = observed_level(old, ctx)
    if level == NONE:
        return True
    if new is None:
        return False
    return compatible(tensor_meta(old), new if isinstance(new, TensorMeta) else tensor_meta(new), level)


def built_meta(fn: Any, *nodes: Any) -> TensorMeta | None:
    """The layout of ``fn(*values)`` where ``values`` are ``nodes``' recorded metas, run on the
    meta device (the strides the real op will produce); None if a meta is unknown or fn fails."""
    from optimus.semantics.meta import _from_value, tensor_meta

    tensors = []
    for node in nodes:
        meta = tensor_meta(node) if isinstance(node, fx.Node) else None
        if meta is None or meta.stride is None:
            return None
        tensors.append(torch.empty_strided(meta.shape, meta.stride, dtype=meta.dtype, device="meta"))
    try:
        found = _from_value(fn(*tensors))
    except Exception:
        return None
    return found if isinstance(found, TensorMeta) else None


def views_as(meta: TensorMeta | None, shape: tuple[int, ...]) -> bool | None:
    """Can a tensor laid out as ``meta`` be viewed as ``shape`` (reshape without a copy)?"""
    if meta is None or meta.stride is None:
        return None
    t = torch.empty_strided(meta.shape, meta.stride, dtype=meta.dtype, device="meta")
    try:
        t.view(shape)
    except RuntimeError:
        return False
    return True


def fresh_meta(node: fx.Node) -> TensorMeta | None:
    """The layout of a fresh contiguous tensor with ``node``'s shape (what a cat/stack makes)."""
    from optimus.semantics.meta import contiguous_stride, tensor_meta

    meta = tensor_meta(node)
    return (
        None
        if meta is None
        else TensorMeta(meta.shape, meta.dtype, meta.device, contiguous_stride(meta.shape))
    )


def same_dtypes(values: Any, like: fx.Node, ctx: GraphView) -> bool:
    """Every value has ``like``'s dtype (no promotion happened in the cat/stack)."""
    out = ctx.meta(like)
    if out is None:
        return False
    for v in values:
        meta = ctx.meta(v)
        if meta is None or meta.dtype != out.dtype:
            return False
    return True
