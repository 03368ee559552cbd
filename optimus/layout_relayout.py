"""RelayoutParams: a one-time parameter re-layout, the zero-runtime-cost ParamLayout (opt-in).

WHY: :class:`~optimus.layout.RuntimeStack` copies every fused weight into a stacked tensor on each
forward (and scatters the gradient back on each backward). Here the copy is made once, when
``optimize()`` fuses: the G parameters are stored in ONE contiguous ``nn.Parameter`` laid out the way
the batched op wants it (``[G, K, N]`` for ``baddbmm``), and the graph reads it with a ``get_attr``.
The user's original ``nn.Parameter`` objects are kept (same Python objects) but their ``.data`` is
re-pointed to views into that storage, so:

* ``module.state_dict()`` / ``load_state_dict`` / checkpoints keep their keys and shapes (loading
  writes through the views into the stacked storage); the output GraphModule's ``state_dict`` hides
  the internal stacked tensors, so it has exactly the keys of the unfused model;
* optimizers hold the original parameters: one built BEFORE ``optimize()`` keeps working (its state
  is keyed by the same objects), and so does one built after, from ``module.parameters()`` or from
  the GraphModule's ``parameters()``;
* gradients: the graph's backward produces the stacked gradient in one tensor; hooks on the stacked
  parameter make it visible as ``p.grad`` of each original parameter (views into one gradient
  tensor per group: the one autograd produced after ``zero_grad(set_to_none=True)``, accumulated
  in place across backward calls otherwise, exactly like the unfused model, including
  ``zero_grad(set_to_none=False)``). The stacked parameter's own ``.grad`` is left
  ``None`` after every backward, so an optimizer that also sees it skips it (no double update).
  For groups of small members (``REUSE_MAX_MEMBER_BYTES`` per member on average: tower weights, biases,
  LayerNorm affines) the gradient tensor is kept between steps and the new gradient is copied
  into it, so its G views are made once, not every backward (making them was about 0.45 us
  per member, over half of what the headroom benchmark's batched op lost to the ideal kernel
  in forward+backward). It is reused only when nothing else holds it: no member's ``.grad``,
  no Python reference to a view, no other tensor on its storage (reference counts, checked
  each time); otherwise a fresh gradient is adopted as before, so a gradient the user kept
  after ``zero_grad(set_to_none=True)`` never changes under them. The kept buffer is memory
  the unfused model frees at ``zero_grad``: ``retained_gradient_buffers`` lists it, so a
  memory benchmark can count it.

When it declines (falls back to ``RuntimeStack``): the parameters are not ``get_attr`` of a
GraphModule that ``optimize()`` owns (the torch.compile backend and Inductor's pre-grad pass see
parameters as graph inputs or as another module's attributes: re-pointing them there is not safe);
``verify=True``; a parameter repeats, is not a leaf ``nn.Parameter``, or already lives in another
re-laid-out group in a different order; the parameters differ in dtype, device, shape or
``requires_grad``.

Why opt-in, not the default: ``torch.autograd.grad(loss, model.parameters())`` (and torch.func
transforms) differentiate w.r.t. the original parameter objects, which are no longer in the
autograd graph (the stacked parameter is): they get ``None``. Only ``.backward()``-style training
sees the gradients (through the hooks). The core's parity helper uses ``autograd.grad`` and fails
with this layout as the default, so a default switch would silently change that API's results.

Caveats (documented, checked where cheap): convert the model (``.to(device)``, ``.half()``) BEFORE
``optimize()``: ``Module._apply`` replaces ``param.data`` and would cut the views loose; the backward
hook raises a ``RuntimeError`` saying so if it finds a parameter no longer a view of its storage.
"""

from __future__ import annotations

import operator
import sys
import weakref
from collections import deque
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from itertools import repeat
from typing import TYPE_CHECKING, Any

import torch
from torch import fx, nn

from .layout import RuntimeStack

if TYPE_CHECKING:
    from .builder import Builder
    from .context import RewriteContext

OWNED_FLAG = "_optimus_relayout_ok"  # set on GraphModules that optimize() owns (see api.py)
PREFIX = "_optimus_stacked_"
GROUP_ATTR = "_optimus_relayout"  # on a re-laid-out parameter: (group, index)
STACKED_GROUP_ATTR = "_optimus_group"  # on a stacked parameter: its _Group (keeps it alive)


@dataclass(frozen=True)
class _Kind:
    """How a group is laid out: stacked along a new dim 0 (optionally each transposed), or cat."""

    op: str  # "stack" | "cat"
    transpose: bool = False


@dataclass(eq=False)
class _Group:
    """One stacked storage and the original parameters that are now views into it.

    The gradient buffer the members' ``.grad`` are views of, and those views, are held strongly
    only by a group that reuses them (``reuse``: small members). Any other group holds weak
    references: the buffer lives exactly as long as a member's ``.grad`` (or the user) refers
    to it, so ``zero_grad(set_to_none=True)`` frees it as it frees the unfused model's
    gradients (holding it strongly kept mmoe large's 25 MiB of expert gradients alive through
    the next step's forward)."""

    stacked: nn.Parameter
    members: list[nn.Parameter]
    kind: _Kind
    views: Callable[[torch.Tensor], list[torch.Tensor]]
    base_ptr: int = 0
    member_ptrs: list[int] = field(default_factory=list)
    reuse: bool = False
    grad_buf: torch.Tensor | None = None  # strong: reuse groups only
    grad_views: list[torch.Tensor] = field(default_factory=list)  # strong: reuse groups only
    weak_buf: weakref.ref[torch.Tensor] | None = None
    weak_views: list[weakref.ref[torch.Tensor]] = field(default_factory=list)

    def buffer(self) -> torch.Tensor | None:
        """The gradient buffer, if it still exists."""
        if self.grad_buf is not None:
            return self.grad_buf
        return self.weak_buf() if self.weak_buf is not None else None

    def held(self) -> tuple[torch.Tensor, list[torch.Tensor]] | None:
        """The buffer and all its views, if they all still exist."""
        buf = self.buffer()
        if buf is None:
            return None
        if self.grad_buf is not None:
            return buf, self.grad_views
        views = [r() for r in self.weak_views]
        return None if any(v is None for v in views) else (buf, views)  # type: ignore[return-value]

    def hold(self, buf: torch.Tensor, views: list[torch.Tensor]) -> None:
        if self.reuse:
            self.grad_buf, self.grad_views = buf, views
        else:
            self.weak_buf, self.weak_views = weakref.ref(buf), [weakref.ref(v) for v in views]


def _view_fn(kind: _Kind, sizes: Sequence[int]) -> Callable[[torch.Tensor], list[torch.Tensor]]:
    if kind.op == "cat":
        return lambda t: list(torch.split(t, list(sizes), 0))
    if kind.transpose:
        return lambda t: list(t.transpose(1, 2).unbind(0))  # one transpose, not G (the backward's hot path)
    return lambda t: list(t.unbind(0))


def _make_stacked(members: Sequence[nn.Parameter], kind: _Kind) -> torch.Tensor:
    with torch.no_grad():
        if kind.op == "cat":
            return torch.cat([p.detach() for p in members], 0).contiguous()
        if kind.transpose:
            return torch.stack([p.detach().t() for p in members]).contiguous()
        return torch.stack([p.detach() for p in members]).contiguous()


def _still_views(group: _Group) -> bool:
    """Every member still points where it was placed in the stacked storage (cheap: data_ptr)."""
    if group.stacked.data_ptr() != group.base_ptr:
        return False
    return list(map(_DATA_PTR, group.members)) == group.member_ptrs  # C-level loops: G is large


_DATA_PTR = torch.Tensor.data_ptr
_GRAD = operator.attrgetter("grad")
_USE_COUNT = torch.Tensor._use_count  # type: ignore[attr-defined]
_STORAGE_USE_COUNT: Callable[[int], int] | None = getattr(torch._C, "_storage_Use_Count", None)
# Reference counts of a tensor that only a list holds, measured here rather than assumed
# (CPython's counting of borrowed references differs between versions).
_ALONE_RC = max(map(sys.getrefcount, [torch.empty(0)]))
_ALONE_USE = max(map(_USE_COUNT, [torch.empty(0)]))
# Copying a member's gradient into the kept buffer costs about 0.03 ns/byte on this CPU; making
# its view costs about 450 ns. Below this size per member the copy is the cheaper of the two.
REUSE_MAX_MEMBER_BYTES = 8192


def _buffer_is_free(g: _Group, new: torch.Tensor) -> bool:
    """Whether the kept gradient buffer may be overwritten with ``new``: the same kind of tensor,
    and nothing outside this group refers to it or to any of its views."""
    buf = g.grad_buf
    if buf is None or _STORAGE_USE_COUNT is None or new.requires_grad:
        return False
    if buf.shape != new.shape or buf.dtype != new.dtype or buf.device != new.device:
        return False
    if not all(map(operator.is_, map(_GRAD, g.members), repeat(None))):
        return False
    # buf + one per view + the Storage object made for the question itself
    if _STORAGE_USE_COUNT(buf.untyped_storage()._cdata) != len(g.grad_views) + 2:
        return False
    return (
        max(map(sys.getrefcount, g.grad_views)) == _ALONE_RC
        and max(map(_USE_COUNT, g.grad_views)) == _ALONE_USE
    )


def _install_grad_hooks(group: _Group) -> None:
    """Make gradients of the stacked parameter appear as ``p.grad`` of each member (see module doc).

    Before accumulation (tensor pre-hook on the leaf): when every member's ``.grad`` is None (the
    usual ``zero_grad(set_to_none=True)``), leave the stacked ``.grad`` None so autograd adopts the
    incoming gradient as is. Otherwise bring the members' grads into the buffer they view (zero
    where cleared, copy in a gradient the user set), bind each ``p.grad`` to its view and point
    the stacked ``.grad`` at the buffer, so autograd accumulates the group in place with one add.
    After accumulation: a new gradient tensor becomes the buffer, each member's ``.grad`` a view
    of it, or, for a group of small members whose kept buffer nothing else refers to, it is
    copied into that buffer and the kept views are bound again; the stacked grad is hidden.
    Why not always accumulate into one persistent buffer: that
    zeroed and re-added the whole group every step and held two group-sized gradients at once
    (26 MB each for MMoE large's merged expert weights)."""
    ref = weakref.ref(group)

    def pre(grad: torch.Tensor) -> torch.Tensor:
        g = ref()
        if g is None:
            return grad
        w = g.stacked
        if not _still_views(g):
            raise RuntimeError(
                "optimus re-layout: a fused parameter is no longer a view of its stacked storage "
                "(was the model converted with .to()/.half() after optimize()?); convert first, then "
                "call optimus.optimize again"
            )
        current = list(map(_GRAD, g.members))
        if all(map(operator.is_, current, repeat(None))):
            # The common case, zero_grad(set_to_none=True): autograd takes the incoming gradient
            # as the stacked .grad (no zeroing, no add, no second buffer); post() exposes views.
            w.grad = None
            return grad
        held = g.held()
        bound = held is not None and held[0].dtype == w.dtype and held[0].device == w.device
        if bound:
            buf, views = held  # type: ignore[misc]
        else:
            buf = torch.zeros_like(w, memory_format=torch.contiguous_format)
            views = g.views(buf)
            g.hold(buf, views)
        if not (bound and all(map(operator.is_, current, views))):
            with torch.no_grad():
                for c, v in zip(current, views, strict=True):
                    if c is None:
                        v.zero_()
                    elif c is not v:
                        v.copy_(c)
            deque(map(setattr, g.members, repeat("grad"), views), maxlen=0)
        w.grad = buf
        return grad

    def post(w: torch.Tensor) -> None:
        g = ref()
        if g is None:
            return
        new = w.grad
        if new is not None and new is not g.buffer():
            # a new gradient tensor (autograd took the incoming one, or create_graph=True
            # accumulated out of place): copied into the kept buffer when that is free (small
            # members), else it becomes the buffer the members' grads are views of
            if g.reuse and _buffer_is_free(g, new):
                with torch.no_grad():
                    g.grad_buf.copy_(new)  # type: ignore[union-attr]
                views = g.grad_views
            else:
                views = g.views(new)
                g.hold(new, views)
            deque(map(setattr, g.members, repeat("grad"), views), maxlen=0)
        w.grad = None

    group.stacked.register_hook(pre)
    group.stacked.register_post_accumulate_grad_hook(post)


def _hide_from_state_dict(gm: fx.GraphModule) -> None:
    """The GraphModule's state_dict has exactly the unfused model's keys (stacked storage hidden)."""
    if getattr(gm, "_optimus_state_hooks", False):
        return

    def drop(module: nn.Module, state: dict[str, Any], prefix: str, local_metadata: Any) -> None:
        for key in [k for k in state if k.startswith(prefix + PREFIX)]:
            del state[key]

    def ignore_missing(module: nn.Module, incompatible: Any) -> None:
        incompatible.missing_keys[:] = [
            k for k in incompatible.missing_keys if not k.split(".")[-1].startswith(PREFIX)
        ]

    gm._register_state_dict_hook(drop)
    gm.register_load_state_dict_post_hook(ignore_missing)
    object.__setattr__(gm, "_optimus_state_hooks", True)


class RelayoutParams:
    """ParamLayout that re-lays fused parameters out once (see module docstring). Opt-in:
    ``optimus.optimize(m, x, config=OptimusConfig(layout=RelayoutParams()))``."""

    def __init__(self) -> None:
        self.fallback = RuntimeStack()

    @staticmethod
    def _group_of(p: nn.Parameter) -> tuple[_Group, int] | None:
        """(group, index) of a parameter already re-laid out (by any RelayoutParams), else None."""
        entry = getattr(p, GROUP_ATTR, None)
        return entry if isinstance(entry, tuple) else None

    # -- can we? ---------------------------------------------------------------------------------
    def _members(self, params: Sequence[fx.Node], kind: _Kind) -> list[nn.Parameter] | None:
        """The parameters behind ``params`` if they can be (or already are) laid out as ``kind``."""
        if len(params) < 2 or any(p.op != "get_attr" for p in params):
            return None
        gm = params[0].graph.owning_module
        if gm is None or not getattr(gm, OWNED_FLAG, False):
            return None
        found: list[nn.Parameter] = []
        for node in params:
            try:
                value = gm.get_parameter(str(node.target))
            except AttributeError:
                return None
            if not isinstance(value, nn.Parameter) or not value.is_leaf:
                return None
            found.append(value)
        first = found[0]
        if len({id(p) for p in found}) != len(found):
            return None  # a repeated parameter: RuntimeStack's broadcast view is already free
        for p in found:
            if p.dtype != first.dtype or p.device != first.device or p.requires_grad != first.requires_grad:
                return None
            if kind.op == "stack" and p.shape != first.shape:
                return None
            if kind.op == "cat" and (p.dim() < 1 or p.shape[1:] != first.shape[1:]):
                return None
            if kind.op == "stack" and kind.transpose and p.dim() != 2:
                return None
        placed = [self._group_of(p) for p in found]
        if any(entry is not None for entry in placed) and not self._same_group(found, placed, kind):
            return None
        return found

    @staticmethod
    def _same_group(found: list[nn.Parameter], placed: list[Any], kind: _Kind) -> bool:
        group = placed[0][0] if placed[0] is not None else None
        if group is None or group.kind != kind or len(group.members) != len(found):
            return False
        return all(e is not None and e[0] is group and e[1] == i for i, e in enumerate(placed)) and (
            _still_views(group)
        )

    # -- ParamLayout ---------------------------------------------------------------------------
    def _get(self, params: Sequence[fx.Node], b: Builder, kind: _Kind) -> fx.Node | None:
        members = self._members(params, kind)
        if members is None:
            return None
        gm = b.ctx.gm
        entry = self._group_of(members[0])
        group = entry[0] if entry is not None else self._relayout(members, kind)
        name = next((n for n, p in gm.named_parameters(remove_duplicate=False) if p is group.stacked), None)
        if name is None:
            index = 0
            while hasattr(gm, f"{PREFIX}{index}"):
                index += 1
            name = f"{PREFIX}{index}"
            gm.register_parameter(name, group.stacked)
            _hide_from_state_dict(gm)
        with b.graph.inserting_before(b.anchor):
            return b._add(b.graph.get_attr(name))

    def _relayout(self, members: list[nn.Parameter], kind: _Kind) -> _Group:
        stacked = nn.Parameter(_make_stacked(members, kind), requires_grad=members[0].requires_grad)
        sizes = [int(p.shape[0]) for p in members] if kind.op == "cat" else []
        group = _Group(stacked, list(members), kind, _view_fn(kind, sizes))
        group.reuse = stacked.numel() * stacked.element_size() <= REUSE_MAX_MEMBER_BYTES * len(members)
        for i, (p, view) in enumerate(zip(members, group.views(stacked.data), strict=True)):
            p.data = view  # same Parameter object (optimizers, hooks keep working), new storage
            setattr(p, GROUP_ATTR, (group, i))
        group.base_ptr = stacked.data_ptr()
        group.member_ptrs = [p.data_ptr() for p in members]
        if stacked.requires_grad:
            _install_grad_hooks(group)
        # keep the group alive as long as its stacked parameter is
        setattr(stacked, STACKED_GROUP_ATTR, group)
        return group

    def stacked(self, params: Sequence[fx.Node], b: Builder, transpose: bool = False) -> fx.Node:
        node = self._get(params, b, _Kind("stack", transpose))
        return node if node is not None else self.fallback.stacked(params, b, transpose)

    def concatenated(self, params: Sequence[fx.Node], b: Builder) -> fx.Node:
        node = self._get(params, b, _Kind("cat"))
        return node if node is not None else self.fallback.concatenated(params, b)

    def concatenation_is_free(self, weights: Sequence[fx.Node]) -> bool:
        """Whether ``concatenated`` of these weights (and so of their biases, which follow them
        into a group the same way) is a ``get_attr`` (asked by merge_shared_linear's cost)."""
        return self._members(weights, _Kind("cat")) is not None

    def launches(self, params: Sequence[fx.Node], transpose: bool = False) -> float:
        if self._members(params, _Kind("stack", transpose)) is not None:
            return 0.0  # a get_attr: nothing runs
        return self.fallback.launches(params, transpose)

    def bytes_moved(self, params: Sequence[fx.Node], ctx: RewriteContext) -> float:
        # the transposed and plain layouts accept the same parameters (2-D weights checked in
        # launches, which batch_linear always asks with transpose=True)
        if self._members(params, _Kind("stack")) is not None:
            return 0.0
        return self.fallback.bytes_moved(params, ctx)


def retained_gradient_buffers(module: nn.Module) -> list[torch.Tensor]:
    """Gradient buffers re-laid-out groups keep between steps (see the module docstring): memory
    the unfused model would have freed at ``zero_grad(set_to_none=True)``. For memory
    accounting; one tensor per group that currently keeps one."""
    found: list[torch.Tensor] = []
    for p in module.parameters():
        group = getattr(p, STACKED_GROUP_ATTR, None)
        if isinstance(group, _Group) and group.grad_buf is not None:
            found.append(group.grad_buf)
    return found
