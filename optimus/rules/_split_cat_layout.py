"""Layout and dtype guards for rewrites that hand back a different tensor object for the same values.

WHY: cat and stack always return a new contiguous tensor; ``cat(split(x)) -> x`` or a cat of a
run -> ``x.narrow(..)`` return ``x``'s own layout, which may be strided. The values are equal,
but a later ``.view(..)`` (or ``.stride()``, ``.as_strided``) that worked on the contiguous
copy can raise on the strided one, and pointwise ops carry input strides forward to what they
produce. So a layout-changing replacement is allowed only when no stride-sensitive op is
reachable downstream, or when the recorded strides of old and new values are known and equal.
Likewise cat/stack promote mixed input dtypes, so ``split(cat(xs))[j] -> xs[j]`` needs every
input to have the output's dtype.

Graph outputs are not treated as stride-sensitive (a caller calling ``.view`` on a returned
strided tensor is the remaining risk, noted in the family's report).
"""

from __future__ import annotations

import weakref
from typing import TYPE_CHECKING, Any

import torch
from torch import fx

if TYPE_CHECKING:
    from ..context import RewriteContext

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

_CACHE: weakref.WeakKeyDictionary[Any, set[fx.Node]] = weakref.WeakKeyDictionary()


def _is_sensitive_op(node: fx.Node) -> bool:
    if node.op == "call_method":
        return str(node.target) in _SENSITIVE_METHODS
    if node.op == "call_function":
        try:
            return node.target in _SENSITIVE_FUNCTIONS
        except TypeError:
            return False
    return False


def _is_barrier(node: fx.Node, ctx: RewriteContext) -> bool:
    canon = ctx.canon(node)
    if canon is not None and canon.op in _BARRIER_CANON:
        return True
    if node.op == "call_function":
        try:
            return node.target in _BARRIER_FUNCTIONS
        except TypeError:
            return False
    return False


def _sensitive_set(ctx: RewriteContext) -> set[fx.Node]:
    """Nodes whose layout can reach a stride-sensitive op (one reverse pass per round)."""
    found = _CACHE.get(ctx.index)
    if found is not None:
        return found
    sensitive: set[fx.Node] = set()
    for node in reversed(ctx.index.nodes):
        for user in node.users:
            if _is_sensitive_op(user) or (user in sensitive and not _is_barrier(user, ctx)):
                sensitive.add(node)
                break
    _CACHE[ctx.index] = sensitive
    return sensitive


def stride_sensitive(node: fx.Node, ctx: RewriteContext) -> bool:
    if node not in ctx.index.pos:
        return True  # made this round: not indexed, assume the worst
    return node in _sensitive_set(ctx)


def _strides(node: Any) -> tuple[int, ...] | None:
    if not isinstance(node, fx.Node):
        return None
    for key in ("example_value", "val"):
        value = node.meta.get(key)
        if isinstance(value, torch.Tensor):
            try:
                return tuple(int(s) for s in value.stride())
            except Exception:  # symbolic strides
                return None
    return None


def layout_safe(old: fx.Node, new: fx.Node | None, ctx: RewriteContext) -> bool:
    """May ``old`` be replaced by ``new`` (None: a view built by the rewrite, layout unknown)?"""
    if not stride_sensitive(old, ctx):
        return True
    if new is None:
        return False
    a, b = _strides(old), _strides(new)
    return a is not None and a == b


def same_dtypes(values: Any, like: fx.Node, ctx: RewriteContext) -> bool:
    """Every value has ``like``'s dtype (no promotion happened in the cat/stack)."""
    out = ctx.meta(like)
    if out is None:
        return False
    for v in values:
        meta = ctx.meta(v)
        if meta is None or meta.dtype != out.dtype:
            return False
    return True
