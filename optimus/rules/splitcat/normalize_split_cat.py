"""normalize_split_cat: every split/cat/stack/unbind call form -> one canonical form, when shapes are known.

    torch.split(x, 2, 1) | x.split(2, -1) | torch.chunk(x, 4, 1) | x.split_with_sizes([2, 2], 1)
        | torch.tensor_split(x, 2, 1)          -> torch.split(x, [2, 2, ...], dim=1)
    torch.cat(xs, -1) | torch.concat(xs, dim=1) | torch.concatenate(xs, axis=1) -> torch.cat([...], dim=1)
    torch.stack(xs, -1) | ...                   -> torch.stack([...], dim=d)   (d >= 0)
    x.unbind(-1) | torch.unbind(x, 1)           -> torch.unbind(x, dim=d)      (d >= 0)
    getitem(getitem(T, slice(a, b)), i)         -> getitem(T, a + i)   (left by merge_splits)

``axis=`` (NumPy's name for ``dim``, taken by the builtins) and the ATen overloads written directly
(``torch.ops.aten.split.Tensor``, ``split.sizes``, ``split_with_sizes``, ``chunk``,
``tensor_split``, ``unbind.int``, ``cat``, ``concat``, ``concatenate``, ``stack``) bind to the same
canonical ops (``optimus.semantics.normalize``), so they are rewritten to the forms above as well.

WHY: sizes become an explicit list (chunk and tensor_split sizes are read from the recorded
shapes, so chunk's "fewer pieces than asked" case is kept exactly), dims become non-negative
(a positional or omitted dim is left so: binding reads them all the same), so the other rules, CSE and later passes see one form. The value of every node is
unchanged, so it runs as a cleanup (each round, not cost-checked). Ordered nodes (effects,
mutated alias classes) are left alone. A tensor_split whose pieces do not tile the input
(unsorted indices) is not a split and is left alone.
"""

from __future__ import annotations

import logging
import operator
from typing import Any

import torch
from torch import fx

from optimus.engine.context import RewriteContext
from optimus.engine.rule import CleanupRule
from optimus.semantics.views import SPLITS, cat_view, nodes_of_kind, split_view, stack_view, unbind_view

log = logging.getLogger("optimus")
_KINDS = SPLITS | {"cat", "stack", "unbind", "getitem"}


def _canonical(node: fx.Node, ctx: RewriteContext) -> tuple[Any, tuple[Any, ...], dict[str, Any]] | None:
    """(target, args, kwargs) of ``node``'s canonical form, or None if we do not know it."""
    split = split_view(node, ctx)
    if split is not None:
        return torch.split, (split.input, list(split.sizes)), {"dim": split.dim}
    unbind = unbind_view(node, ctx)
    if unbind is not None:
        return torch.unbind, (unbind.input,), {"dim": unbind.dim}
    for view, target in ((cat_view(node, ctx), torch.cat), (stack_view(node, ctx), torch.stack)):
        if view is not None and view.whole is None:
            return target, (list(view.tensors),), {"dim": view.dim}
    return None


def _same(node: fx.Node, target: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> bool:
    """Already canonical? The dim may be positional or keyword (binding makes them the same for
    every reader; rewriting only that would churn nodes other rules emit)."""
    if node.op != "call_function" or node.target is not target:
        return False
    have_args, have_kwargs = list(node.args), dict(node.kwargs)
    if len(have_args) == len(args) + 1 and not have_kwargs:
        have_kwargs = {"dim": have_args.pop()}
    elif len(have_args) == len(args) and not have_kwargs:
        have_kwargs = {"dim": 0}  # the default
    if have_kwargs != kwargs or len(have_args) != len(args):
        return False
    for have, want in zip(have_args, args, strict=True):
        if isinstance(want, list):
            if not isinstance(have, list) or have != want:
                return False
        elif have is not want:
            return False
    return True


def _looks_canonical(node: fx.Node) -> bool:
    """Canonical on sight (no shapes needed): torch.split with a list of int sizes, or
    torch.cat/stack with a list, or torch.unbind, and a plain non-negative dim. Skipping these
    keeps the pass from computing shapes of the many nodes other rules already emit this way."""
    if node.op != "call_function" or node.target not in (torch.split, torch.cat, torch.stack, torch.unbind):
        return False
    at = 2 if node.target is torch.split else 1  # where a positional dim sits
    if node.target is torch.split and not (
        len(node.args) >= 2 and isinstance(node.args[1], list) and all(type(s) is int for s in node.args[1])
    ):
        return False
    if node.target in (torch.cat, torch.stack) and not (node.args and isinstance(node.args[0], list)):
        return False
    if len(node.args) > at + 1 or (node.kwargs and set(node.kwargs) != {"dim"}):
        return False
    dim = node.args[at] if len(node.args) == at + 1 else node.kwargs.get("dim", 0)
    return type(dim) is int and dim >= 0


def _folded_index(node: fx.Node) -> tuple[fx.Node, int] | None:
    """getitem(getitem(T, slice(a, b)), i) -> (T, a + i) for a plain forward slice."""
    if node.op != "call_function" or node.target is not operator.getitem or len(node.args) != 2:
        return None
    src, i = node.args
    if not isinstance(src, fx.Node) or isinstance(i, bool) or not isinstance(i, int) or i < 0:
        return None
    if src.op != "call_function" or src.target is not operator.getitem or len(src.args) != 2:
        return None
    base, sl = src.args
    if not isinstance(base, fx.Node) or not isinstance(sl, slice) or sl.step not in (None, 1):
        return None
    start = 0 if sl.start is None else sl.start
    if not isinstance(start, int) or start < 0:
        return None
    if sl.stop is not None and (not isinstance(sl.stop, int) or sl.stop < 0 or start + i >= sl.stop):
        return None
    return base, start + i


class NormalizeSplitCat(CleanupRule):
    name = "normalize_split_cat"

    def run(self, ctx: RewriteContext) -> int:
        # Decide everything on the graph as indexed, then rewrite in graph order, mapping
        # references to nodes replaced earlier in this pass (the cached canonical forms of their
        # users would otherwise still name the old node).
        plan: list[tuple[fx.Node, tuple[Any, tuple[Any, ...], dict[str, Any]]]] = []
        for node in nodes_of_kind(ctx, _KINDS):
            if not ctx.movable(node):
                continue
            folded = _folded_index(node)
            if folded is not None:
                plan.append((node, (operator.getitem, folded, {})))
                continue
            if _looks_canonical(node):
                continue
            try:
                call = _canonical(node, ctx)
            except Exception as exc:  # a node form we did not foresee: leave it as it is
                log.debug("optimus: normalize_split_cat skipped %s (%s)", node.format_node(), exc)
                continue
            if call is not None and not _same(node, *call):
                plan.append((node, call))
        replaced: dict[fx.Node, fx.Node] = {}
        for node, (target, args, kwargs) in plan:
            args = fx.node.map_arg(args, lambda n: replaced.get(n, n))
            with ctx.graph.inserting_before(node):
                new = ctx.graph.call_function(target, args, kwargs)
            new.meta.update(node.meta)  # same value, so the recorded shapes stay right
            inner = node.args[0] if target is operator.getitem else None
            node.replace_all_uses_with(new)
            ctx.graph.erase_node(node)
            replaced[node] = new
            if isinstance(inner, fx.Node) and not inner.users:  # the folded tuple slice, once unread
                ctx.graph.erase_node(inner)
        return len(plan)
