"""Undo what a driver run did to a GraphModule's parameters and attributes outside its graph.

WHY: the measured guard (``optimus.guard``) judges the driver's result by running it, and may
then return the plain capture or re-run the driver without one rule. Restoring the graph alone
is not enough when the layout is :class:`~optimus.params.relayout.RelayoutParams`: fusing
re-points the module's parameters (``p.data``) into a stacked storage, tags them
(``GROUP_ATTR``), gives them watching hook dicts, registers the stacked parameter and
``Builder`` constants on the GraphModule, binds them in ``gm.meta`` and installs hooks on it
(:mod:`optimus.params.contract`). A reverted graph must leave each parameter exactly as the
caller had it: the same storage (so the same aliasing and strides), no tag, its own hook dicts,
the same ``.grad``; and the GraphModule without the stacked parameters and per-call hooks (a
forward pre-hook left behind would cost every call).

What it restores (taken before the driver runs, :meth:`LayoutSnapshot.restore` after):

* each parameter the graph module holds: ``.data`` (only where it was re-pointed: the saved
  tensor shares the original storage), ``.grad``, the ``GROUP_ATTR`` tag and the
  ``_backward_hooks``/``_post_accumulate_grad_hooks`` dicts;
* every submodule's attributes and parameter/buffer/module dicts (shallowly, as
  :class:`optimus.capture.caller_state.CallerState` does), its hook dicts' contents and
  ``gm.meta``'s keys.

Values are not copied: a driver run changes no parameter's value (re-laying out copies values
into the new storage), so the snapshot costs references only, and the original storage stays
alive until the snapshot is dropped (for a re-laid-out group, its bytes twice meanwhile).
"""

from __future__ import annotations

from typing import Any

import torch
from torch import fx, nn

from optimus.params.group import GROUP_ATTR

_MISSING = object()
_DICT_NAMES = ("_parameters", "_buffers", "_modules")
_HOOK_DICTS = (
    "_forward_pre_hooks",
    "_forward_pre_hooks_with_kwargs",
    "_forward_hooks",
    "_forward_hooks_with_kwargs",
    "_forward_hooks_always_called",
    "_backward_pre_hooks",
    "_backward_hooks",
    "_state_dict_hooks",
    "_state_dict_pre_hooks",
    "_load_state_dict_pre_hooks",
    "_load_state_dict_post_hooks",
)
_TENSOR_HOOK_ATTRS = ("_backward_hooks", "_post_accumulate_grad_hooks")


class LayoutSnapshot:
    """The parameters and attributes of ``gm`` as they are now (see the module docstring)."""

    def __init__(self, gm: fx.GraphModule) -> None:
        self.params: list[tuple[nn.Parameter, torch.Tensor, Any, Any, tuple[Any, ...]]] = []
        seen: set[int] = set()
        for m in gm.modules():
            for p in m._parameters.values():
                if p is None or id(p) in seen:
                    continue
                seen.add(id(p))
                hooks = tuple(getattr(p, a) for a in _TENSOR_HOOK_ATTRS)
                self.params.append((p, p.detach(), p.grad, getattr(p, GROUP_ATTR, _MISSING), hooks))
        self.modules = list(gm.modules())
        # per submodule: its attributes, its parameter/buffer/module dicts, its hook dicts' contents
        self.dicts: list[tuple[dict[str, Any], list[dict[str, Any]], dict[str, dict[Any, Any]]]] = [
            (dict(m.__dict__), [dict(m.__dict__[n]) for n in _DICT_NAMES], self._hooks_of(m))
            for m in self.modules
        ]
        self.meta = dict(gm.meta)
        self.gm = gm

    @staticmethod
    def _hooks_of(m: nn.Module) -> dict[str, dict[Any, Any]]:
        return {n: dict(d) for n in _HOOK_DICTS if isinstance(d := m.__dict__.get(n), dict)}

    def restore_grads(self) -> None:
        """Put back each parameter's ``.grad`` (after a measured backward)."""
        for p, _, grad, _, _ in self.params:
            if p.grad is not grad:
                p.grad = grad

    def restore(self) -> None:
        """Everything the snapshot holds; the caller restores the graph itself."""
        with torch.no_grad():
            for p, data, grad, tag, tensor_hooks in self.params:
                if p.data_ptr() != data.data_ptr() or p.stride() != data.stride() or p.shape != data.shape:
                    p.data = data
                if tag is _MISSING:
                    if hasattr(p, GROUP_ATTR):
                        delattr(p, GROUP_ATTR)
                else:
                    setattr(p, GROUP_ATTR, tag)
                for attr, value in zip(_TENSOR_HOOK_ATTRS, tensor_hooks, strict=True):
                    if getattr(p, attr) is not value:
                        setattr(p, attr, value)
                if p.grad is not grad:
                    p.grad = grad
        for m, (attrs, dicts, hooks) in zip(self.modules, self.dicts, strict=True):
            current = m.__dict__
            for key in [k for k in current if k not in attrs]:
                del current[key]
            current.update(attrs)
            for name, content in zip(_DICT_NAMES, dicts, strict=True):
                d = current[name]
                d.clear()
                d.update(content)
            for name, content in hooks.items():
                d = current[name]
                d.clear()
                d.update(content)
        meta = self.gm.meta
        meta.clear()
        meta.update(self.meta)
