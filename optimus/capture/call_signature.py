"""What a captured graph was specialized to, and a per-call check that it still applies.

WHY: ``torch._dynamo.export`` bakes into the graph what it saw at capture: every tensor's
sizes and strides (static shapes), the value of every Python scalar argument, and the
``training`` flag of every module whose code reads it (Dropout, BatchNorm, user code with
``if self.training``). A later call with another batch size, another scalar, or after
``model.eval()`` would silently reuse the captured graph. torch.compile guards against this;
``optimize`` threw the guards away, so it keeps its own, cheap enough to run on every call:

* :class:`InputSignature`: per positional argument, a tensor's (size, stride, dtype, device) or
  a non-tensor's (type, value). Checking two tensor arguments costs about a microsecond.
* :func:`mode_sensitive_modules`: the modules whose ``training`` flag the graph may depend on,
  found once, at capture. Checking every module's flag instead would cost ~90 us per call on
  the towers model at scale large (1,505 modules); that model has no mode-sensitive module.
"""

from __future__ import annotations

import inspect
import types
from collections.abc import Hashable, Sequence
from typing import Any

import torch
from torch import nn
from torch.utils import _pytree as pytree

_SCALARS = (int, float, bool, complex, str, bytes, type(None), torch.dtype, torch.device)

# classes (by identity) already scanned: whether their code reads ``training``
_READS_TRAINING: dict[type, bool] = {}


def _code_reads_training(code: types.CodeType) -> bool:
    if "training" in code.co_names or "training" in code.co_consts:
        return True
    return any(isinstance(c, types.CodeType) and _code_reads_training(c) for c in code.co_consts)


def _class_reads_training(cls: type) -> bool:
    """Whether any method of ``cls`` (below ``nn.Module`` in its MRO) names ``training``."""
    known = _READS_TRAINING.get(cls)
    if known is not None:
        return known
    found = False
    for klass in cls.__mro__:
        if klass is nn.Module or klass is object:
            continue
        for value in vars(klass).values():
            func = value.__func__ if isinstance(value, (staticmethod, classmethod)) else value
            code = getattr(func, "__code__", None)
            if isinstance(code, types.CodeType) and _code_reads_training(code):
                found = True
                break
        if found:
            break
    _READS_TRAINING[cls] = found
    return found


def mode_sensitive_modules(module: nn.Module) -> tuple[nn.Module, ...]:
    """``module`` itself plus every submodule whose class's code reads ``self.training`` (or any
    ``.training``): Dropout*, BatchNorm*, InstanceNorm, RReLU, MultiheadAttention, user modules
    with ``if self.training``. ``model.train(mode)`` sets every flag, so the root's flag alone
    catches it; the others catch a mode set on one submodule."""
    seen = {id(module)}
    found = [module]
    for m in module.modules():
        if id(m) not in seen and _class_reads_training(type(m)):
            seen.add(id(m))
            found.append(m)
    return tuple(found)


def modes(modules: Sequence[nn.Module]) -> tuple[bool, ...]:
    return tuple([m.training for m in modules])


def _entry(value: Any) -> tuple[Any, ...]:
    if isinstance(value, torch.Tensor):
        return ("tensor", value.shape, value.stride(), value.dtype, value.device)
    if isinstance(value, _SCALARS):
        return ("value", type(value), value)
    if isinstance(value, Hashable):
        try:
            hash(value)
            return ("value", type(value), value)
        except TypeError:
            pass
    return ("object", type(value), id(value))


def _describe(entry: tuple[Any, ...]) -> str:
    if entry[0] == "tensor":
        _, shape, stride, dtype, device = entry
        return f"a {str(dtype).replace('torch.', '')} tensor of shape {tuple(shape)}, stride {stride} on {device}"
    if entry[0] == "value":
        return f"{entry[1].__name__} {entry[2]!r}"
    if entry[0] == "spec":
        return f"inputs nested as {entry[1]}"
    return f"a {entry[1].__name__} object (id {entry[2]})"


class InputSignature:
    """The inputs a graph was captured for. ``matches(args)`` is the per-call fast check; ``key``
    is hashable (one cache entry per signature)."""

    def __init__(self, args: Sequence[Any], names: Sequence[str] = ()) -> None:
        self.nested = any(isinstance(a, (list, tuple, dict)) for a in args)
        if self.nested:
            leaves, spec = pytree.tree_flatten(tuple(args))
            self.entries = (("spec", str(spec)), *(_entry(v) for v in leaves))
        else:
            self.entries = tuple(_entry(a) for a in args)
        self.n = len(args)
        self.names = tuple(names)
        self.key = self.entries
        # fast path: one (shape, stride, dtype, device) per tensor argument
        self._tensors = tuple(
            (i, e[1], e[2], e[3], e[4]) for i, e in enumerate(self.entries) if e[0] == "tensor"
        )
        self._values = tuple((i, e) for i, e in enumerate(self.entries) if e[0] != "tensor")

    def matches(self, args: Sequence[Any]) -> bool:
        if self.nested:
            return len(args) == self.n and InputSignature(args).key == self.key
        if len(args) != self.n:
            return False
        for i, shape, stride, dtype, device in self._tensors:
            a = args[i]
            if (
                not isinstance(a, torch.Tensor)
                or a.dtype is not dtype
                or a.shape != shape
                or a.stride() != stride
                or a.device != device
            ):
                return False
        return all(_entry(args[i]) == e for i, e in self._values)

    def difference(self, other: InputSignature) -> str:
        """One line: the first argument that differs (for logs and errors)."""
        if self.n != other.n:
            return f"was optimized for {self.n} argument(s); got {other.n}"
        for i, (mine, theirs) in enumerate(zip(self.entries, other.entries, strict=False)):
            if mine != theirs:
                name = self.names[i] if i < len(self.names) and not self.nested else f"input {i}"
                return f"was optimized for {name} = {_describe(mine)}; got {_describe(theirs)}"
        return "inputs differ"


def forward_names(module: nn.Module) -> tuple[str, ...]:
    """Positional parameter names of ``module.forward`` (for messages), or ()."""
    try:
        params = inspect.signature(module.forward).parameters.values()
    except (TypeError, ValueError):
        return ()
    return tuple(
        p.name for p in params if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD, p.VAR_POSITIONAL)
    )
