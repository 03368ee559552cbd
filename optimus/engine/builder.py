"""Builder: the only way rules create nodes. It inserts them, records them (for undo) and keeps
``node.meta`` right, so no rule repeats that bookkeeping.

It also owns the shared pieces of every fused form: ``stack`` (which sees through an ``unbind`` or
an equal-size ``split`` it can undo for free) and ``unbind``.
"""

from __future__ import annotations

import operator
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

import torch
from torch import fx

from optimus.semantics.meta import TensorMeta, _from_value, tensor_meta, value_meta

if TYPE_CHECKING:
    from optimus.engine.context import RewriteContext


CONSTANT_PREFIX = "_optimus_const_"  # buffers Builder.constant registers on the graph's module


def free_attr_name(module: torch.nn.Module, prefix: str) -> str:
    """The first ``f"{prefix}{i}"`` (i = 0, 1, ...) that ``module`` has no attribute of: where a
    rewrite registers a tensor it adds (a stacked parameter, a constant buffer)."""
    index = 0
    while hasattr(module, f"{prefix}{index}"):
        index += 1
    return f"{prefix}{index}"


class Builder:
    def __init__(self, ctx: RewriteContext, anchor: fx.Node) -> None:
        self.ctx = ctx
        self.graph = anchor.graph
        self.anchor = anchor
        self.created: list[fx.Node] = []

    def _add(self, node: fx.Node) -> fx.Node:
        """Record a new node. Its meta is computed lazily, on first use (see meta.value_meta)."""
        self.created.append(node)
        return node

    def call(self, target: Any, *args: Any, **kwargs: Any) -> fx.Node:
        with self.graph.inserting_before(self.anchor):
            return self._add(self.graph.call_function(target, tuple(args), dict(kwargs)))

    def method(self, name: str, *args: Any, **kwargs: Any) -> fx.Node:
        with self.graph.inserting_before(self.anchor):
            return self._add(self.graph.call_method(name, tuple(args), dict(kwargs)))

    def getitem(self, node: fx.Node, i: int) -> fx.Node:
        return self.call(operator.getitem, node, i)

    def constant(self, data: list[Any], dtype: torch.dtype | None = None, device: Any = None) -> fx.Node:
        """``torch.tensor(data, dtype=dtype, device=device)``, made once: a ``get_attr`` of a
        non-persistent buffer on the graph's module.

        WHY not ``torch.tensor(data)`` in the graph: that builds the tensor from Python on every
        call (43 us for a 325-entry index in eager, more than the gather it feeds). A buffer is
        made once, moves with ``.to(device)`` and stays out of ``state_dict``.

        Inside a Dynamo backend (the graph module has ``_param_name_to_source``) the graph keeps
        the ``torch.tensor`` call: AOT autograd there accepts no buffer Dynamo did not make, nor a
        real tensor attribute among its fake ones, and Inductor folds the call into a constant."""
        owner = self.graph.owning_module
        if owner is None or hasattr(owner, "_param_name_to_source"):
            return self.call(torch.tensor, data, dtype=dtype, device=device)
        name = free_attr_name(owner, CONSTANT_PREFIX)
        owner.register_buffer(name, torch.tensor(data, dtype=dtype, device=device), persistent=False)
        with self.graph.inserting_before(self.anchor):
            return self._add(self.graph.get_attr(name))

    # -- shared pieces of fused forms -------------------------------------------------------
    def stack(self, values: Sequence[fx.Node], dim: int = 0) -> fx.Node:
        """``torch.stack(values, dim)``, reusing the tensor they were unbound/split from if the
        values are exactly its pieces in order (then no copy is made)."""
        whole = self.unstacked_source(values, dim)
        if whole is not None:
            return whole
        runs = self.unbound_runs(values, dim)
        if runs is not None:  # all pieces of X1, then of X2, ...: cat([X1, X2, ..]), no getitems
            return self.call(torch.cat, runs, 0)
        split = self.split_source(values, dim)
        if split is not None:  # equal pieces of X along d: a view of X, no copy, no new pieces
            x, d, k, start = split
            x_meta = self.ctx.meta(x)
            if x_meta is None or len(values) * k != x_meta.shape[d]:  # a run inside a longer split
                x = self.call(torch.narrow, x, d, start, len(values) * k)
            return self.method("movedim", self.method("unflatten", x, d, (len(values), k)), d, 0)
        return self.call(torch.stack, list(values), dim)

    def split_source(self, values: Sequence[fx.Node], dim: int = 0) -> tuple[fx.Node, int, int, int] | None:
        """(X, d, k, start) if ``values`` are consecutive pieces ``i .. i+n-1``, in order, of
        ``split(X, sizes, d)`` (or all pieces of ``chunk``), each of size k, the first starting at
        ``start`` along d: then ``stack(values)`` is the view
        ``X.narrow(d, start, n*k).unflatten(d, (n, k)).movedim(d, 0)`` (no narrow when they are all
        of X). A run inside a longer split is the merged experts and gates of one shared-input
        linear (``[256] * 4 + [64] * 2``): the experts' next ops stack their pieces for free."""
        if dim != 0 or len(values) < 2:
            return None
        first = values[0]
        if not (first.op == "call_function" and first.target is operator.getitem):
            return None
        source = first.args[0]
        canon = self.ctx.canon(source)
        if canon is None or canon.op not in ("split", "chunk") or not isinstance(source, fx.Node):
            return None
        x = canon["input"]
        meta = self.ctx.meta(x)
        d = canon["dim"]
        if meta is None or not isinstance(d, int) or not -len(meta.shape) <= d < len(meta.shape):
            return None
        d %= len(meta.shape)
        n, total = len(values), meta.shape[d]
        i0 = first.args[1]
        if not isinstance(i0, int):
            return None
        if canon.op == "chunk":
            if canon["chunks"] != n or total % n or i0 != 0:
                return None
            sizes = [total // n] * n
        else:
            size = canon["split_size_or_sections"]
            if isinstance(size, int) and size > 0:
                sizes = [min(size, total - o) for o in range(0, total, size)]
            elif isinstance(size, (list, tuple)) and all(isinstance(v, int) for v in size):
                sizes = list(size)
            else:
                return None
        if sum(sizes) != total or i0 < 0 or i0 + n > len(sizes):
            return None
        run = sizes[i0 : i0 + n]
        k = run[0]
        if k <= 0 or any(v != k for v in run):
            return None
        for i, v in enumerate(values):
            if not (v.op == "call_function" and v.target is operator.getitem and v.args == (source, i0 + i)):
                return None
        return x, d, k, sum(sizes[:i0])

    def unstacked_source(self, values: Sequence[fx.Node], dim: int = 0) -> fx.Node | None:
        """If ``values`` are ``unbind(X, dim)[0..n-1]`` return X (cost-free stacking)."""
        if dim != 0 or not values:
            return None
        first = values[0]
        if not (first.op == "call_function" and first.target is operator.getitem):
            return None
        source = first.args[0]
        if not isinstance(source, fx.Node):
            return None
        canon = self.ctx.canon(source)
        if canon is None or canon.op != "unbind" or canon["dim"] != 0:
            return None
        count = source.meta.get("optimus_pieces")  # set by Builder.unbind: no meta needed
        if count is None:
            pieces = value_meta(source)  # tuple of metas, one per piece
            count = len(pieces) if isinstance(pieces, tuple) else None
        if count != len(values):
            return None
        for i, v in enumerate(values):
            if not (v.op == "call_function" and v.target is operator.getitem and v.args == (source, i)):
                return None
        whole = canon["input"]
        return whole if isinstance(whole, fx.Node) else None

    def unbound_runs(self, values: Sequence[fx.Node], dim: int = 0) -> list[fx.Node] | None:
        """[X1, X2, ...] if ``values`` are all pieces of ``unbind(X1, 0)`` in order, then all of
        ``unbind(X2, 0)``, ... (two or more sources). Why: two fused groups feeding one (sparse and
        dense towers into one LayerNorm) were re-stacked piece by piece; ``cat`` of the sources is
        the same tensor without the G getitems, which Inductor otherwise lowers one by one."""
        if dim != 0:
            return None
        runs: list[fx.Node] = []
        i = 0
        while i < len(values):
            first = values[i]
            if not (first.op == "call_function" and first.target is operator.getitem and first.args[1] == 0):
                return None
            source = first.args[0]
            count = source.meta.get("optimus_pieces") if isinstance(source, fx.Node) else None
            if not isinstance(count, int) or i + count > len(values):
                return None
            whole = self.unstacked_source(values[i : i + count], dim)
            if whole is None:
                return None
            runs.append(whole)
            i += count
        return runs if len(runs) >= 2 else None

    def unbind(self, node: fx.Node, n: int, dim: int = 0) -> list[fx.Node]:
        pieces = self.call(torch.unbind, node, dim)
        pieces.meta["optimus_pieces"] = n
        return [self.getitem(pieces, i) for i in range(n)]

    def stack_view_meta(self, values: Sequence[fx.Node], dim: int = 0) -> TensorMeta | None:
        """The layout of what ``stack(values, dim)`` returns when it is a view of an existing
        tensor (the unbound source, or a split's input unflattened); None when it is a real stack
        (a fresh contiguous tensor) or the layout is unknown."""
        whole = self.unstacked_source(values, dim)
        if whole is not None:
            return tensor_meta(whole)
        split = self.split_source(values, dim)
        if split is None:
            return None
        x, d, k, start = split
        meta = tensor_meta(x)
        if meta is None or meta.stride is None:
            return None
        t = torch.empty_strided(meta.shape, meta.stride, dtype=meta.dtype, device="meta")
        t = t.narrow(d, start, len(values) * k)
        found = _from_value(t.unflatten(d, (len(values), k)).movedim(d, 0))
        return found if isinstance(found, TensorMeta) else None

    def stacked_params(self, params: Sequence[fx.Node], transpose: bool = False) -> fx.Node:
        return self.ctx.layout.stacked(params, self, transpose)
