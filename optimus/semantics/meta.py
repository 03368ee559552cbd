"""Shapes, dtypes and strides of graph values, read from whatever the capture left and kept right for new nodes.

WHY: rules group nodes by shape/dtype, and the cost model needs sizes. Dynamo leaves FakeTensors in
``node.meta["example_value"]``, export leaves ``"val"``, ShapeProp leaves ``"tensor_meta"``; nodes a
rewrite creates have none. ``tensor_meta`` reads all of them; ``propagate`` computes a new node's
meta by running its target on ``meta``-device tensors (no data, microseconds), and stores it under
``node.meta["optimus_meta"]``.

Strides are recorded too (``TensorMeta.stride``; None when symbolic or unknown): a rewrite must hand
back values with the layout eager produced (see docs/optimus.md, "Layouts and aliasing of
rewritten values"), and the rules read it to decide whether a fused result needs a copy. Meta
tensors compute strides exactly as the real kernels do for the ops fused forms build (views,
stack, bmm, pointwise), so a propagated stride is the stride that runs.
"""

from __future__ import annotations

import math
import operator
from dataclasses import dataclass
from typing import Any

import torch
from torch import fx

from optimus.semantics.regions import context_kind

_ENTER_AUTOCAST = torch.amp.autocast_mode._enter_autocast
_EXIT_AUTOCAST = torch.amp.autocast_mode._exit_autocast
KEY = "optimus_meta"


@dataclass(frozen=True)
class TensorMeta:
    shape: tuple[int, ...]
    dtype: torch.dtype
    device: torch.device
    stride: tuple[int, ...] | None = None  # None: not known (symbolic, or recorded without it)

    @property
    def is_contiguous(self) -> bool | None:
        """Row-major dense, as ``Tensor.is_contiguous()`` says (size-1 dims ignored); None if the
        stride is unknown."""
        if self.stride is None:
            return None
        if 0 in self.shape:
            return True
        return self.stride == contiguous_stride(self.shape, self.stride)

    @property
    def numel(self) -> int:
        return math.prod(self.shape)

    @property
    def nbytes(self) -> int:
        return self.numel * self.dtype.itemsize


def contiguous_stride(shape: tuple[int, ...], like: tuple[int, ...] | None = None) -> tuple[int, ...]:
    """Row-major strides of ``shape``; where a dim has size 1 (any stride is contiguous there),
    ``like``'s stride is kept so the result compares equal to a contiguous ``like``."""
    out: list[int] = []
    acc = 1
    for i in range(len(shape) - 1, -1, -1):
        out.append(like[i] if like is not None and shape[i] == 1 else acc)
        acc *= max(shape[i], 1)
    return tuple(reversed(out))


def _stride_of(value: torch.Tensor) -> tuple[int, ...] | None:
    try:
        stride = tuple(value.stride())
    except Exception:  # sparse or other layouts without strides
        return None
    return tuple(int(s) for s in stride) if all(isinstance(s, int) for s in stride) else None


def _from_value(value: Any) -> Any:
    if isinstance(value, torch.Tensor):
        shape = tuple(value.shape)
        if not all(isinstance(d, int) for d in shape):
            return None  # symbolic shape: rules decline rather than guess
        return TensorMeta(tuple(int(d) for d in shape), value.dtype, value.device, _stride_of(value))
    if isinstance(value, (list, tuple)):
        return tuple(_from_value(v) for v in value)
    if hasattr(value, "shape") and hasattr(value, "dtype"):  # fx TensorMetadata
        shape = tuple(value.shape)
        if not all(isinstance(d, int) for d in shape):
            return None
        stride = getattr(value, "stride", None)
        known = isinstance(stride, tuple) and all(isinstance(v, int) for v in stride)
        return TensorMeta(shape, value.dtype, torch.device("cpu"), stride if known else None)
    return None


def value_meta(node: fx.Node) -> Any:
    """TensorMeta, a tuple of them (multi-output ops), or None if unknown."""
    if KEY in node.meta:
        return node.meta[KEY]
    for key in ("example_value", "val", "tensor_meta"):
        if key in node.meta:
            found = _from_value(node.meta[key])
            node.meta[KEY] = found
            return found
    if node.op == "get_attr":
        found = _from_value(_fetch_attr(node))
        node.meta[KEY] = found
        return found
    if node.op in ("call_function", "call_method"):
        return propagate(node)  # a node a rewrite created: computed on first use
    return None


def tensor_meta(node: fx.Node) -> TensorMeta | None:
    found = value_meta(node)
    return found if isinstance(found, TensorMeta) else None


def _fetch_attr(node: fx.Node) -> Any:
    owner = node.graph.owning_module
    if owner is None:
        return None
    obj: Any = owner
    for part in str(node.target).split("."):
        obj = getattr(obj, part, None)
        if obj is None:
            return None
    return obj


def empty_of(meta: TensorMeta, device: torch.device | str | None = None) -> torch.Tensor:
    """An uninitialised tensor of ``meta``'s shape, dtype and stride (where known), on ``device``
    (``meta``'s own by default); under a fake mode, a fake one."""
    where = meta.device if device is None else device
    if meta.stride is not None:
        return torch.empty_strided(meta.shape, meta.stride, dtype=meta.dtype, device=where)
    return torch.empty(meta.shape, dtype=meta.dtype, device=where)


def _to_meta_tensor(meta: Any) -> Any:
    if isinstance(meta, TensorMeta):
        return empty_of(meta, "meta")
    if isinstance(meta, tuple):
        return tuple(_to_meta_tensor(m) for m in meta)
    raise ValueError("unknown input meta")


def _with_device(value: Any, device: torch.device) -> Any:
    if isinstance(value, torch.Tensor):
        return TensorMeta(tuple(int(d) for d in value.shape), value.dtype, device, _stride_of(value))
    if isinstance(value, (list, tuple)):
        return tuple(_with_device(v, device) for v in value)
    return None


def _fast_shape(node: fx.Node) -> Any:
    """Shapes of the structural ops fused forms use most, without running anything."""
    if node.op != "call_function":
        return None
    if node.target is torch.stack and node.args and isinstance(node.args[0], (list, tuple)):
        dim = node.args[1] if len(node.args) > 1 else node.kwargs.get("dim", 0)
        found = [value_meta(v) if isinstance(v, fx.Node) else None for v in node.args[0]]
        metas = [m for m in found if isinstance(m, TensorMeta)]
        if not metas or len(metas) != len(found) or dim != 0:
            return None
        first = metas[0]
        if any(m.shape != first.shape or m.dtype != first.dtype for m in metas):
            return None
        shape = (len(metas), *first.shape)
        return TensorMeta(shape, first.dtype, first.device, contiguous_stride(shape))  # a fresh tensor
    if node.target is torch.unbind and isinstance(node.args[0], fx.Node):
        dim = node.args[1] if len(node.args) > 1 else node.kwargs.get("dim", 0)
        whole = value_meta(node.args[0])
        if not isinstance(whole, TensorMeta) or dim != 0 or not whole.shape:
            return None
        stride = whole.stride[1:] if whole.stride is not None else None  # views of ``whole``
        piece = TensorMeta(whole.shape[1:], whole.dtype, whole.device, stride)
        return tuple(piece for _ in range(whole.shape[0]))
    return None


_AUTOCAST_FLAG = "_optimus_has_autocast"


def in_autocast(node: fx.Node) -> bool:
    """Whether ``node`` sits between an ``_enter_autocast`` and its ``_exit_autocast`` (an enabled
    one) in node order. Rules never add autocast nodes, so whether a graph has any is read once."""
    graph = node.graph
    has = graph.__dict__.get(_AUTOCAST_FLAG)
    if has is None:
        has = any(n.op == "call_function" and n.target is _ENTER_AUTOCAST for n in graph.nodes)
        graph.__dict__[_AUTOCAST_FLAG] = has
    if not has:
        return False
    cur = node.prev
    while cur.op != "root":
        if cur.op == "call_function":
            if cur.target is _EXIT_AUTOCAST:
                return False
            if cur.target is _ENTER_AUTOCAST:
                return len(cur.args) < 3 or cur.args[2] is not False
        cur = cur.prev
    return False


def propagate(node: fx.Node) -> Any:
    """Compute and store the meta of a node whose inputs all have meta. None if that fails."""
    devices: list[torch.device] = []
    if node.op == "call_function" and node.target is operator.getitem and isinstance(node.args[0], fx.Node):
        whole = value_meta(node.args[0])  # a piece of a multi-output op: no need to run anything
        index = node.args[1]
        if isinstance(whole, tuple) and isinstance(index, int) and -len(whole) <= index < len(whole):
            node.meta[KEY] = whole[index]
            return whole[index]

    if context_kind(node) is not None:
        # a grad-mode / autocast switch is never run to learn its result's meta: running it would
        # switch the caller's own mode (an `_enter_autocast` left autocast on after optimize())
        node.meta[KEY] = None
        return None

    if in_autocast(node):
        # meta tensors carry no autocast dispatch: the dtype computed here would be the one without
        # autocast (float32 for a baddbmm that autocast runs in bfloat16), so it stays unknown
        node.meta[KEY] = None
        return None

    fast = _fast_shape(node)
    if fast is not None:
        node.meta[KEY] = fast
        return fast

    def convert(arg: Any) -> Any:
        if isinstance(arg, fx.Node):
            meta = value_meta(arg)
            if meta is None:
                raise ValueError(f"no meta for {arg}")
            if isinstance(meta, TensorMeta):
                devices.append(meta.device)
            return _to_meta_tensor(meta)
        return arg

    try:
        args = fx.node.map_aggregate(node.args, convert)
        kwargs = fx.node.map_aggregate(node.kwargs, convert)
        if node.op == "call_function":
            out = node.target(*args, **kwargs)  # type: ignore[operator]
        elif node.op == "call_method":
            out = getattr(args[0], str(node.target))(*args[1:], **kwargs)
        else:
            return None
        found = _with_device(out, devices[0] if devices else torch.device("cpu"))
    except Exception:
        found = None
    node.meta[KEY] = found
    return found


def record(gm: fx.GraphModule, inputs: Any) -> None:
    """Fill missing meta by running ``gm`` once on ``inputs`` (a plain fx.symbolic_trace graph
    carries no shapes). Runs under no_grad; results are discarded."""

    class _Recorder(fx.Interpreter):
        def run_node(self, n: fx.Node) -> Any:
            result = super().run_node(n)
            if n.meta.get(KEY) is None:
                n.meta[KEY] = _from_value(result)
            return result

    with torch.no_grad():
        _Recorder(gm).run(*inputs)


def output_requires_grad(node: fx.Node) -> bool | None:
    """Whether the tensor this node produced at capture required grad (None: not recorded, or not
    a single tensor). Read from the capture's example value, which Dynamo computed under the grad
    mode the node runs in."""
    for key in ("example_value", "val"):
        value = node.meta.get(key)
        if isinstance(value, torch.Tensor):
            return bool(value.requires_grad)
    return None
