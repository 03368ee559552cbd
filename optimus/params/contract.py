"""Keep the re-layout's parameters connected to the forward when the user changes them after
``optimize()``: the part of PyTorch's parameter contract that cannot be kept in the backward hooks.

WHY: a re-laid-out group's forward reads ONE stacked parameter; the user's parameters are views
into it. Several ordinary operations cut that link: ``module.to(dtype/device)`` (``Module._apply``
replaces each ``param.data``; the stacked parameter is converted separately, or not at all when
the original model is converted), ``load_state_dict(..., assign=True)`` (new Parameter objects),
``copy.deepcopy`` (each parameter is cloned on its own). Before this file the forward then kept
reading the stale stacked values and loads were silently ignored.

How: each GraphModule that reads a stacked parameter keeps, per group, a :class:`_Binding`: where
its members live (the owning modules' ``_parameters`` dicts and keys) and the group. A forward
pre-hook checks every binding at each call: the members are the same objects, still views at the
recorded addresses (O(G) C-level comparisons per group: about 0.2 us per member on the shared
test machine), and the stacked parameter requires grad exactly when some member does. When not, it restores the group from the members' current values:

* same members, storage moved (``.to()``, a ``.data`` swap): stack their values again and re-point
  them (the stacked parameter keeps its identity);
* other member objects (``assign=True``): a new stacked parameter for these members (the old group
  keeps working for whoever still holds the old parameters);
* after ``deepcopy``: the copy's binding has no group; the copy's stacked parameter is re-filled
  from the copy's parameters, which become views into it: an independent, working copy;
* ``requires_grad`` changed: the stacked parameter requires grad when any member does (the hooks
  leave frozen members' ``.grad`` alone);
* members that can no longer share one storage (different dtypes, devices or shapes, a parameter
  deleted) or not keep their strides in it (a non-contiguous tensor loaded or set): a
  ``RuntimeError`` that says which, at that call.

Under ``torch.compile`` of the optimized module the pre-hook is traced away (Dynamo cannot run
it per call). What still keeps the contract there: ``load_state_dict`` of the optimized module
(in place or ``assign=True``) re-lays out at the end of the load (a load post-hook), and
``.to()`` of the optimized module (or of a module holding it) re-lays out at the end of the
conversion (``gm._apply``). Any other change after compiling (a ``.data`` swap, a new Parameter
set on a submodule, ``.to()`` of the original model, a load of a submodule alone): call
:func:`sync` yourself. The backward hook raises if it finds the views cut or members replaced.
"""

from __future__ import annotations

import copy
import operator
import types
import weakref
from dataclasses import dataclass
from typing import Any

import torch
from torch import fx, nn

from optimus.params.group import (
    _REQUIRES_GRAD,
    STACKED_GROUP_ATTR,
    _Group,
    _Kind,
    keeps_strides,
    make_stacked,
    new_group,
    still_views,
    sync_requires_grad,
)

BINDINGS_KEY = "optimus_relayout_bindings"  # in GraphModule.meta (deep-copied with the module)
_HOOKED_ATTR = "_optimus_relayout_hooked"
_GETITEM = operator.getitem


@dataclass(eq=False)
class _Binding:
    """One stacked parameter of one GraphModule: where its members live, and the group."""

    name: str  # the stacked parameter's attribute on the GraphModule
    targets: list[str]  # members' qualified names (for messages)
    shapes: list[torch.Size]  # members' shapes when laid out (the views' shapes)
    dicts: list[dict[str, Any]]  # members' owning modules' ``_parameters``
    keys: list[str]
    kind: _Kind
    reuse_limit: int
    group: _Group | None

    def __deepcopy__(self, memo: dict[int, Any]) -> _Binding:
        # the copy's dicts are the copied modules' (memo); its group is made at its first call
        return _Binding(
            self.name,
            list(self.targets),
            list(self.shapes),
            copy.deepcopy(self.dicts, memo),
            list(self.keys),
            self.kind,
            self.reuse_limit,
            None,
        )

    def current(self) -> list[Any]:
        """The objects the owning modules hold now (None for a removed one)."""
        return list(map(dict.get, self.dicts, self.keys))

    def intact(self, stacked: Any) -> bool:
        """The cheap per-call check: same objects, same addresses, same requires_grad."""
        g = self.group
        if g is None or stacked is not g.stacked:
            return False
        members = g.members
        try:
            current = list(map(_GETITEM, self.dicts, self.keys))
        except KeyError:
            return False
        if not all(map(operator.is_, current, members)):
            return False
        # requires_grad: the stacked parameter's is any of the members' (short-circuits: O(1)
        # unless the group is frozen); the hooks read each member's at every backward
        if g.attached:  # the members are the autograd leaves; the storage never requires grad
            return still_views(g) and not stacked.requires_grad
        wants = any(map(_REQUIRES_GRAD, members))
        return still_views(g) and stacked.requires_grad == wants and (g.hooked or not wants)


def bind(gm: fx.GraphModule, name: str, group: _Group, targets: list[str], reuse_limit: int) -> None:
    """Record that ``gm``'s attribute ``name`` is ``group``'s stacked parameter, whose members are
    ``gm``'s parameters ``targets``; install the per-call check on ``gm`` (once)."""
    dicts, keys = [], []
    for target in targets:
        prefix, _, key = target.rpartition(".")
        owner = gm.get_submodule(prefix) if prefix else gm
        dicts.append(owner._parameters)
        keys.append(key)
    bindings = gm.meta.setdefault(BINDINGS_KEY, [])
    bindings[:] = [b for b in bindings if b.name != name]
    shapes = [p.shape for p in group.members]
    binding = _Binding(name, list(targets), shapes, dicts, keys, group.kind, reuse_limit, group)
    bindings.append(binding)
    group.owners.append(weakref.ref(binding))
    _install(gm)


def _install(gm: fx.GraphModule) -> None:
    if gm.__dict__.get(_HOOKED_ATTR):
        return
    gm.register_forward_pre_hook(_check_hook)
    if _sync_after_load not in gm._load_state_dict_post_hooks.values():
        gm.register_load_state_dict_post_hook(_sync_after_load)
    # ``.to()``/``.double()``/``.cuda()`` of ``gm`` or of a module holding it reach ``gm._apply``
    gm.__dict__["_apply"] = types.MethodType(_apply_then_sync, gm)
    register = getattr(gm, "_register_deepcopy_hook", None)
    if register is not None and _install not in getattr(gm, "_deepcopy_hooks", ()):
        register(_install)  # GraphModule.__deepcopy__ drops forward hooks: the copy re-installs
    gm.__dict__[_HOOKED_ATTR] = True


def _check_hook(module: nn.Module, args: Any) -> None:
    if torch.compiler.is_compiling():
        return  # traced away: Dynamo cannot run the check per call (see the module docstring)
    _sync(module)


def _apply_then_sync(self: nn.Module, fn: Any, recurse: bool = True) -> nn.Module:
    """``Module._apply`` (behind ``.to()``), then re-lay out. Why: the conversion replaces each
    member's ``.data`` on its own, which cuts its view of the stacked storage; under
    ``torch.compile`` no per-call check would re-connect them before the next step."""
    type(self)._apply(self, fn, recurse)
    _sync(self)
    return self


def _sync_after_load(module: nn.Module, incompatible_keys: Any) -> None:
    """After ``load_state_dict`` of the optimized module (in place or ``assign=True``): re-lay out
    now, not at the next call. Why: under ``torch.compile`` the per-call check is traced away, and
    a compiled inference call would otherwise keep reading the values from before the load."""
    _sync(module)


def sync(module: nn.Module) -> None:
    """Check every re-laid-out group ``module`` reads and restore the broken ones (module doc).
    Runs before each call of the optimized module; call it yourself under ``torch.compile``
    (on the compiled wrapper or the module itself)."""
    _sync(getattr(module, "_orig_mod", module))  # torch.compile's OptimizedModule wraps it


def _sync(module: nn.Module) -> None:
    meta = getattr(module, "meta", None)
    bindings = meta.get(BINDINGS_KEY) if isinstance(meta, dict) else None
    if not bindings:
        return
    params = module._parameters
    for b in bindings:
        stacked = params.get(b.name)
        if not b.intact(stacked):
            _restore(module, b, stacked)
        b.group.checked = True  # type: ignore[union-attr]


def _restore(module: nn.Module, b: _Binding, stacked: Any) -> None:
    try:
        members = list(map(_GETITEM, b.dicts, b.keys))
    except KeyError as exc:
        raise RuntimeError(
            f"optimus re-layout: fused parameter {exc.args[0]!r} was removed from the module; "
            "call optimus.optimize again"
        ) from None
    _check_compatible(b, members)
    g = b.group
    with torch.inference_mode(False), torch.no_grad():
        if g is not None and stacked is g.stacked and all(map(operator.is_, members, g.members)):
            if not still_views(g):  # same objects, storage moved: lay their values out again
                g.place(make_stacked(members, g.kind))
            sync_requires_grad(g)
            return
        # other objects (assign=True), or a deep copy: a group of its own for these members
        reuse = (
            stacked
            if isinstance(stacked, nn.Parameter) and not hasattr(stacked, STACKED_GROUP_ATTR)
            else None
        )
        attached = g.attached if g is not None else False
        b.group = new_group(members, b.kind, b.reuse_limit, reuse, attached)
        b.group.owners.append(weakref.ref(b))
        if reuse is None:
            module.register_parameter(b.name, b.group.stacked)


def _check_compatible(b: _Binding, members: list[Any]) -> None:
    """The members can still share one storage laid out as ``b.kind``, else a clear error."""
    first = members[0]
    for target, shape, p in zip(b.targets, b.shapes, members, strict=True):
        problem = None
        if not isinstance(p, nn.Parameter):
            problem = (
                f"is now a {type(p).__name__}, not an nn.Parameter (torch.func.functional_call and "
                "other reparametrizations cannot be followed: use the default layout)"
            )
        elif p.shape != shape:
            problem = f"has shape {tuple(p.shape)}, was {tuple(shape)}"
        elif p.dtype != first.dtype or p.device != first.device:
            problem = f"is {p.dtype} on {p.device}, {b.targets[0]} is {first.dtype} on {first.device}"
        elif not keeps_strides(p):
            problem = (
                f"has strides {tuple(p.stride())}, not a contiguous tensor's (a view of the stacked "
                "storage would change them)"
            )
        if problem is not None:
            raise RuntimeError(
                f"optimus re-layout: fused parameter {target} {problem}, so the group can no longer "
                "share one storage; convert the whole model (or call optimus.optimize again)"
            )
