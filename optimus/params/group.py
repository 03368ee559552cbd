"""One re-laid-out group: a stacked storage, the original parameters as views into it, and the
backward hooks that turn the stacked gradient into each original parameter's ``.grad``.

WHY its own file: :mod:`optimus.params.relayout` decides *whether* parameters are re-laid out
(the ``ParamLayout``); :mod:`optimus.params.contract` keeps the views connected when the user
changes the parameters after ``optimize()``; this file is the storage and the gradient plumbing
both of them use.

Gradients (see also docs/optimus.md): the graph's backward produces the stacked gradient in one
tensor; a post-accumulate hook on the stacked parameter makes it visible as ``p.grad`` of each
member (views into one gradient tensor per group: the one autograd produced after
``zero_grad(set_to_none=True)``, accumulated in place across backward calls otherwise, exactly like
the unfused model, including ``zero_grad(set_to_none=False)``); a pre-hook is added only once a
member has tensor hooks of its own. The stacked parameter's own
``.grad`` is left ``None`` after every backward, so an optimizer that also sees it skips it.
For groups of small members (``reuse``) the gradient tensor is kept between steps and the new
gradient is copied into it, so its G views are made once, not every backward; it is reused only
when nothing else holds it (reference counts, checked each time).

PyTorch's per-parameter contract, kept in the hooks (read live at every backward, so it also holds
under ``torch.compile`` of the optimized module, where no per-call check runs):

* ``requires_grad``: a member whose ``requires_grad`` is False gets no gradient (its ``.grad`` is
  left exactly as it was), as in the unfused model;
* ``p.register_hook(fn)``: run on the member's slice of the incoming gradient (a contiguous copy,
  as the unfused model would pass), in registration order; a returned tensor replaces the slice;
* ``p.register_post_accumulate_grad_hook(fn)``: run with the member after its ``.grad`` is set.
"""

from __future__ import annotations

import operator
import sys
import warnings
import weakref
from collections import OrderedDict, deque
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from itertools import repeat
from typing import Any

import torch
from torch import nn

GROUP_ATTR = "_optimus_relayout"  # on a re-laid-out parameter: (group, index)
STACKED_GROUP_ATTR = "_optimus_group"  # on a stacked parameter: its _Group (keeps it alive)


@dataclass(frozen=True)
class _Kind:
    """How a group is laid out: stacked along a new dim 0, or concatenated along dim 0.

    Never transposed: each member is a contiguous block of the storage, so its strides are the
    ones a parameter of its shape has in eager (``eager_strides``). PyTorch's parameter contract
    includes the layout: ``parameters_to_vector``, ``p.view(-1)``, EMA and flat-buffer optimizers
    need each parameter contiguous. A fused op that wants the members transposed
    (``baddbmm``'s ``[G, K, N]`` weights) reads a transposed view of the storage instead, which
    the batched GEMM takes without a copy."""

    op: str  # "stack" | "cat"


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
    hooked: bool = False  # the gradient hand-off hook is installed on ``stacked``
    # the members are the autograd leaves (optimus.params.attach): no hand-off hook, and the
    # stacked parameter never requires grad
    attached: bool = False
    pre_hooked: bool = False  # the pre-hook for members' own tensor hooks is installed too
    user_hooks: bool = False  # a member has (or had) hooks of its own: the backward reads them
    checked: bool = False  # the per-call check found the members in place since the last backward
    # where the members live in each module that reads this group (relayout_contract._Binding):
    # the hand-off hook checks that no member was replaced since the forward (assign=True)
    owners: list[weakref.ref[Any]] = field(default_factory=list)
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
        """Keep ``buf`` and its views: strongly in a reuse group, weakly otherwise, and weakly
        also when ``buf`` carries a ``create_graph`` history (held strongly, it would keep that
        backward's graph alive after ``zero_grad``, which the unfused model frees)."""
        if self.reuse and not buf.requires_grad:
            self.grad_buf, self.grad_views = buf, views
            self.weak_buf, self.weak_views = None, []
        else:
            self.grad_buf, self.grad_views = None, []
            self.weak_buf, self.weak_views = weakref.ref(buf), [weakref.ref(v) for v in views]

    def forget_buffer(self) -> None:
        """Drop the kept gradient buffer (the storage was re-made: its views no longer match)."""
        self.grad_buf, self.grad_views, self.weak_buf, self.weak_views = None, [], None, []

    def place(self, value: torch.Tensor) -> None:
        """Make ``value`` the stacked storage and every member a view into it (no autograd, no
        version bump: ``.data``), and record where they point for the cheap checks."""
        self.stacked.data = value
        for i, (p, view) in enumerate(zip(self.members, self.views(value), strict=True)):
            p.data = view  # same Parameter object (optimizers, hooks keep working), new storage
            setattr(p, GROUP_ATTR, (self, i))
            _standalone_grad(p)
        self.base_ptr = self.stacked.data_ptr()
        self.member_ptrs = list(map(_DATA_PTR, self.members))
        self.forget_buffer()


def _standalone_grad(p: nn.Parameter) -> None:
    """A member's ``.grad`` that is a view of a gradient buffer but no longer lives in it becomes a
    plain tensor with the same values.

    Why: ``Module.to()`` converts each ``.grad`` with ``grad.data = converted``, which keeps the
    view's autograd metadata (a float32 buffer as its base) around float64 data. The unfused model
    never has such a tensor; Dynamo cannot fake it ("view Float as Double"), so a re-capture of the
    model for the converted inputs failed and fell back to per-call Dynamo subgraphs."""
    g = p.grad
    if g is None or not g._is_view():
        return
    base = g._base
    if base is not None and g.untyped_storage().data_ptr() == base.untyped_storage().data_ptr():
        return  # a real view of the buffer (dtype and device as the base's)
    p.grad = g.detach().clone()


def view_fn(kind: _Kind, sizes: Sequence[int]) -> Callable[[torch.Tensor], list[torch.Tensor]]:
    if kind.op == "cat":
        return lambda t: list(torch.split(t, list(sizes), 0))
    return lambda t: list(t.unbind(0))


def eager_strides(shape: Sequence[int]) -> tuple[int, ...]:
    """The strides a contiguous tensor of ``shape`` has (``torch.empty(shape).stride()``): those of
    an ordinary parameter, and of every member view of a group's storage (a block of a contiguous
    stack or concatenation along dim 0)."""
    out: list[int] = []
    acc = 1
    for size in reversed(shape):
        out.append(acc)
        acc *= max(int(size), 1)
    return tuple(reversed(out))


def keeps_strides(p: torch.Tensor) -> bool:
    """Whether ``p`` laid out in a group keeps its strides: it has a contiguous tensor's."""
    return p.stride() == eager_strides(p.shape)


def make_stacked(members: Sequence[torch.Tensor], kind: _Kind) -> torch.Tensor:
    """The members' current values laid out as ``kind``: a fresh, normal (never an inference)
    tensor, also when called under ``torch.inference_mode()``."""
    with torch.inference_mode(False), torch.no_grad():
        if kind.op == "cat":
            return torch.cat([p.detach() for p in members], 0).contiguous()
        return torch.stack([p.detach() for p in members]).contiguous()


def new_group(
    members: list[nn.Parameter],
    kind: _Kind,
    reuse_limit: int,
    stacked: nn.Parameter | None = None,
    attached: bool = False,
) -> _Group:
    """Lay ``members`` out as ``kind`` in one storage (``stacked``'s, when given: its values are
    replaced by the members'), re-point the members to views of it, install the gradient hooks
    (none when ``attached``: the graph reads the storage through ``attach_members``)."""
    value = make_stacked(members, kind)
    with torch.inference_mode(False):
        if stacked is None:
            stacked = nn.Parameter(torch.empty(0, dtype=value.dtype, device=value.device))
        sizes = [int(p.shape[0]) for p in members] if kind.op == "cat" else []
        group = _Group(stacked, list(members), kind, view_fn(kind, sizes), attached=attached)
        group.reuse = value.numel() * value.element_size() <= reuse_limit * len(members)
        group.place(value)
        _watch_hooks(group)
        sync_requires_grad(group)
    # keep the group alive as long as its stacked parameter is
    setattr(stacked, STACKED_GROUP_ATTR, group)
    return group


class _HookWatch(OrderedDict):  # type: ignore[type-arg]
    """A member's hook dict (``_backward_hooks`` / ``_post_accumulate_grad_hooks``, where
    ``register_hook`` puts its hooks) that tells the member's groups when a hook is registered,
    so the backward reads the G members' hook dicts only for groups that have hooks: reading
    them every backward cost about 0.6 us per member per dict on towers large."""

    def __init__(self, group: _Group) -> None:
        super().__init__()
        self.groups = [weakref.ref(group)]

    def __setitem__(self, key: Any, value: Any) -> None:
        for ref in self.groups:
            g = ref()
            if g is not None:
                g.user_hooks = True
                if g.hooked:
                    _install_pre_hook(g)
        super().__setitem__(key, value)


def _watch_hooks(group: _Group) -> None:
    """Give each member a watching hook dict; a member that already has a dict of its own (hooks
    registered before, even if removed since) makes the group read them at every backward."""
    for p in group.members:
        for attr in ("_backward_hooks", "_post_accumulate_grad_hooks"):
            found = getattr(p, attr)
            if found is None:
                setattr(p, attr, _HookWatch(group))
            elif isinstance(found, _HookWatch):
                found.groups.append(weakref.ref(group))
            else:
                group.user_hooks = True
            if isinstance(found, _HookWatch) and len(found):
                group.user_hooks = True


def sync_requires_grad(group: _Group) -> None:
    """The stacked parameter requires grad when any member does (so an all-frozen group's output
    does not require grad, as in the unfused model); hooks are installed the first time it does.
    An attached group's stacked parameter never requires grad: its members are the leaves."""
    if group.attached:
        if group.stacked.requires_grad:
            group.stacked.requires_grad_(False)
        return
    want = any(map(_REQUIRES_GRAD, group.members))
    if group.stacked.requires_grad != want:
        group.stacked.requires_grad_(want)
    if want and not group.hooked:
        install_grad_hooks(group)


def still_views(group: _Group) -> bool:
    """Every member still points where it was placed in the stacked storage (cheap: data_ptr)."""
    if group.stacked.data_ptr() != group.base_ptr:
        return False
    return list(map(_DATA_PTR, group.members)) == group.member_ptrs  # C-level loops: G is large


_WARNED_DISTRIBUTED = [False]
# torch.distributed, where this build has it (read once: the check runs in every backward, and an
# import statement there cost about 5 us per group per step)
_DIST = torch.distributed if torch.distributed.is_available() else None


def _warn_if_distributed() -> None:
    """Once per process, in a backward of a re-laid-out group with a process group of 2+ ranks:
    DistributedDataParallel reduces gradients from hooks on each parameter's gradient
    accumulator, and with the hooks a member is not in the autograd graph (the stacked parameter
    is), so its gradient stays rank-local. Only a group made before the process group existed, or
    with ``gradients="hooks"``, gets here: under a process group ``RelayoutParams`` attaches the
    members (:mod:`optimus.params.attach`)."""
    dist = _DIST
    if dist is not None and dist.is_initialized() and dist.get_world_size() > 1:
        _WARNED_DISTRIBUTED[0] = True
        warnings.warn(
            "optimus re-layout under torch.distributed (world size "
            f"{dist.get_world_size()}): DistributedDataParallel does not all-reduce re-laid-out "
            "parameters' gradients with this layout's gradient hooks; optimize after "
            "init_process_group, or pass RelayoutParams(gradients='autograd')",
            RuntimeWarning,
            stacklevel=2,
        )


_DATA_PTR = torch.Tensor.data_ptr
_GRAD = operator.attrgetter("grad")
_REQUIRES_GRAD = operator.attrgetter("requires_grad")
_TENSOR_HOOKS = operator.attrgetter("_backward_hooks")  # p.register_hook's dict (None if never used)
_POST_HOOKS = operator.attrgetter("_post_accumulate_grad_hooks")
_USE_COUNT = torch.Tensor._use_count  # type: ignore[attr-defined]
_STORAGE_USE_COUNT: Callable[[int], int] | None = getattr(torch._C, "_storage_Use_Count", None)
# Reference counts of a tensor that only a list holds, measured here rather than assumed
# (CPython's counting of borrowed references differs between versions).
_ALONE_RC = max(map(sys.getrefcount, [torch.empty(0)]))
_ALONE_USE = max(map(_USE_COUNT, [torch.empty(0)]))


def _buffer_is_free(g: _Group, new: torch.Tensor) -> bool:
    """Whether the kept gradient buffer may be overwritten with ``new``: the same kind of tensor,
    ``new`` without a ``create_graph`` history (a kept buffer never has one: :meth:`_Group.hold`),
    and nothing outside this group refers to it or to any of its views (the caller has found
    every member's ``.grad`` None)."""
    buf = g.grad_buf
    if buf is None or _STORAGE_USE_COUNT is None or new.requires_grad:
        return False
    if buf.shape != new.shape or buf.dtype != new.dtype or buf.device != new.device:
        return False
    # buf + one per view + the Storage object made for the question itself
    if _STORAGE_USE_COUNT(buf.untyped_storage()._cdata) != len(g.grad_views) + 2:
        return False
    return (
        max(map(sys.getrefcount, g.grad_views)) == _ALONE_RC
        and max(map(_USE_COUNT, g.grad_views)) == _ALONE_USE
    )


def _owners_hold_members(g: _Group) -> bool:
    """Every module that reads ``g`` still holds its members (not objects put there since)."""
    for ref in g.owners:
        b = ref()
        if b is not None and b.group is g and not all(map(operator.is_, b.current(), g.members)):
            return False
    return True


def _run_tensor_hooks(g: _Group, grad: torch.Tensor, live: list[bool], hooks: list[Any]) -> torch.Tensor:
    """``p.register_hook`` hooks of trainable members, on their slices of a copy of ``grad``."""
    grad = grad.clone(memory_format=torch.contiguous_format)
    parts = g.views(grad)
    with torch.no_grad():
        for part, trains, found in zip(parts, live, hooks, strict=True):
            if not trains or not found:
                continue
            value = part.clone(memory_format=torch.contiguous_format)  # what the unfused model passes
            for hook in list(found.values()):
                out = hook(value)
                if out is not None:
                    value = out
            part.copy_(value)  # also takes an in-place change the hook made
    return grad


def _bind(members: list[nn.Parameter], views: list[torch.Tensor], live: list[bool] | None) -> None:
    """Each (trainable, when ``live`` is given) member's ``.grad`` becomes its view."""
    if live is None:
        deque(map(setattr, members, repeat("grad"), views), maxlen=0)
        return
    for p, v, trains in zip(members, views, live, strict=True):
        if trains:
            p.grad = v


def _hand_off(g: _Group, new: torch.Tensor, mask: list[bool] | None) -> None:
    """Make the stacked gradient ``new`` each trainable member's ``.grad`` (views of one buffer).

    Common case (every trainable member's ``.grad`` is None: ``zero_grad(set_to_none=True)``):
    ``new`` becomes the buffer, or, for a group of small members whose kept buffer nothing else
    refers to, is copied into it and the kept views are bound again. Otherwise the members
    accumulate, as ``AccumulateGrad`` would: in place into the kept buffer when every member's
    ``.grad`` is its view of it, else into a new buffer holding ``current + new``. Under
    ``create_graph=True`` (grad mode on in the backward) each member's sum is out of place and
    keeps both histories, as ``AccumulateGrad``'s is."""
    members = g.members
    current = list(map(_GRAD, members))
    if mask is not None:
        current = [c if t else None for c, t in zip(current, mask, strict=True)]
    if all(map(operator.is_, current, repeat(None))):
        if g.reuse and _buffer_is_free(g, new):
            # neither requires grad (checked): no autograd record, and no ``torch.no_grad()``,
            # whose cold Python entry cost about 9 us per call here
            g.grad_buf.copy_(new)  # type: ignore[union-attr]
            views = g.grad_views
        else:
            views = g.views(new)
            g.hold(new, views)
        _bind(members, views, mask)
        return
    if torch.is_grad_enabled():  # create_graph=True: AccumulateGrad's out-of-place sum, per member
        views = g.views(new)
        g.hold(new, views)
        for p, c, v, trains in zip(members, current, views, mask or repeat(True), strict=False):
            if trains:
                p.grad = v if c is None else c + v  # both histories kept (second-order terms)
        return
    held = g.held()
    if held is not None and mask is None:
        buf, views = held
        same = buf.shape == new.shape and buf.dtype == new.dtype and buf.device == new.device
        if same and all(map(operator.is_, current, views)):
            buf.add_(new)  # every member views it: one in-place add, as AccumulateGrad's +=
            return
    out = torch.zeros_like(new, memory_format=torch.contiguous_format)
    for c, v in zip(current, g.views(out), strict=True):
        if c is not None:
            v.copy_(c)
    out.add_(new)
    views = g.views(out)
    g.hold(out, views)
    _bind(members, views, mask)


def _install_pre_hook(group: _Group) -> None:
    """A pre-hook on the stacked parameter that runs the members' own tensor hooks
    (``p.register_hook``) on their slices of the incoming gradient, before it is accumulated.
    Installed only once a member has such a hook (``_HookWatch``): every hook the autograd
    engine calls costs about 5-25 us per backward in a real model's step (its code is cold
    after the GEMMs between), and most groups never need this one."""
    if group.pre_hooked:
        return
    ref = weakref.ref(group)

    def pre(grad: torch.Tensor) -> torch.Tensor:
        g = ref()
        if g is None:
            return grad
        hooks = list(map(_TENSOR_HOOKS, g.members))
        if any(hooks):
            grad = _run_tensor_hooks(g, grad, list(map(_REQUIRES_GRAD, g.members)), hooks)
        return grad

    group.stacked.register_hook(pre)
    group.pre_hooked = True


def install_grad_hooks(group: _Group) -> None:
    """Make gradients of the stacked parameter appear as ``p.grad`` of each member (module doc).

    One post-accumulate hook on the stacked parameter does the hand-off (:func:`_hand_off`):
    the stacked ``.grad`` is always None when a backward starts, so autograd adopts the incoming
    gradient as is (no zeroing, no add, no second buffer); the hook checks that the members are
    still in place, binds each trainable member's ``.grad`` to its view (accumulating into the
    existing ones where there are), hides the stacked grad again, then runs the members'
    post-accumulate hooks. Frozen members (``requires_grad`` False) are never bound and their
    ``.grad`` is never touched. The members' tensor hooks need a pre-hook
    (:func:`_install_pre_hook`), installed once one exists.
    Why not always accumulate into one persistent buffer: that zeroed and re-added the whole group
    every step and held two group-sized gradients at once (26 MB each for MMoE large's merged
    expert weights). Why no pre-hook by default: on DeepCTR's MMOE training step (five groups,
    2.7-2.8 ms) the hooks took 216 us with two per group, 178 us with this one (docs/perf.md)."""
    ref = weakref.ref(group)

    def post(w: torch.Tensor) -> None:
        g = ref()
        if g is None:
            return
        if not _WARNED_DISTRIBUTED[0]:
            _warn_if_distributed()
        new, w.grad = w.grad, None
        checked, g.checked = g.checked, False
        # members replaced after the per-call check (eager: between the forward and this backward)
        # are what the unfused model would not differentiate either: checked only without it
        # (under torch.compile), where the forward read stale values
        if not still_views(g) or not (checked or _owners_hold_members(g)):
            raise RuntimeError(
                "optimus re-layout: a fused parameter stopped being a view of its stacked storage, "
                "or was replaced, between the forward and this backward (.to(), "
                "load_state_dict(assign=True)?); run the forward again after changing parameters "
                "(under torch.compile, call optimus.params.contract.sync(compiled) first)"
            )
        members = g.members
        live = list(map(_REQUIRES_GRAD, members))
        if new is not None:
            _hand_off(g, new, None if all(live) else live)
        if g.user_hooks:
            post_hooks = list(map(_POST_HOOKS, members))
            for p, trains, found in zip(members, live, post_hooks, strict=True):
                if trains and found:
                    for hook in list(found.values()):
                        hook(p)

    group.stacked.register_post_accumulate_grad_hook(post)
    group.hooked = True
    if group.user_hooks:
        _install_pre_hook(group)
