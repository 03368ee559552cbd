"""Leave the caller's world as ``optimize()`` found it: inputs, module state, RNG.

WHY: capturing and optimizing may run the model's code for real: the graph-break fallback
compiles by calling the model, ``verify=True`` runs the graph on the example inputs (and seeds
the RNG), and checking bad inputs runs ``forward`` eagerly. Each run could mutate the example
inputs in place, update BatchNorm statistics and ``num_batches_tracked``, advance the RNG, or
leave an attribute that ``forward`` assigns pointing at a tensor of the capture (a FakeTensor
under Dynamo). ``optimize`` is a compiler: none of that may be visible afterwards.

What is kept (see docs/optimus.md, "What optimize keeps of the caller's world"):

* the example inputs: the model only ever sees :func:`clone_inputs` copies (same sizes, strides,
  storage offset, dtype, device, ``requires_grad`` and aliasing between inputs);
* every buffer of the module: cloned before, copied back if its value changed (BatchNorm's
  running statistics change without a version-counter bump);
* parameters: cloned only when a real run is about to happen (``protect_parameters``), since
  the export path never runs the model and a clone of every weight would double its memory;
* every submodule's attributes (``__dict__`` and its parameter/buffer/module dicts), restored
  shallowly: an attribute assigned by ``forward`` is put back (or removed);
* the torch RNG state (CPU, and CUDA where it has been initialized).

Not restorable: in-place changes to Python containers (``self.log.append``) and output (``print``)
from a real run. ``optimize`` avoids running ``forward`` for real where it can (see api.py).
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import Any

import torch
from torch import nn
from torch.utils import _pytree as pytree

_DICT_NAMES = ("_parameters", "_buffers", "_modules")


def _clone_tensor(t: torch.Tensor, storages: dict[Any, torch.UntypedStorage]) -> torch.Tensor:
    """A copy with the same storage layout (strides, offset), sharing storage where ``t`` did."""
    if type(t) is not torch.Tensor and type(t) is not nn.Parameter:
        return t  # a tensor subclass: we cannot copy it faithfully; pass it as is
    if t.is_sparse or t.layout != torch.strided or t.device.type == "meta":
        return t
    with torch.inference_mode(False), torch.no_grad():
        storage = t.untyped_storage()
        key = (t.device, storage.data_ptr(), storage.nbytes())
        copy = storages.get(key)
        if copy is None:
            copy = storage.clone()
            storages[key] = copy
        out = torch.empty(0, dtype=t.dtype, device=t.device)
        out.set_(copy, t.storage_offset(), t.size(), t.stride())
    if t.requires_grad:
        out.requires_grad_(True)
    return out


def clone_inputs(inputs: Any) -> Any:
    """``inputs`` with every plain tensor replaced by a copy the model may mutate freely."""
    storages: dict[Any, torch.UntypedStorage] = {}
    return pytree.tree_map(lambda v: _clone_tensor(v, storages) if isinstance(v, torch.Tensor) else v, inputs)


def _same(a: torch.Tensor, b: torch.Tensor) -> bool:
    return a.shape == b.shape and a.dtype == b.dtype and bool(torch.equal(a, b))


class CallerState:
    """A snapshot of ``module``'s state and the RNG, restored by :meth:`restore`."""

    def __init__(self, module: nn.Module | None) -> None:
        self.cpu_rng = torch.get_rng_state()
        self.cuda_rng = (
            torch.cuda.get_rng_state_all()
            if torch.cuda.is_available() and torch.cuda.is_initialized()
            else None
        )
        self.modules = list(module.modules()) if module is not None else []
        self.dicts = [self._dicts_of(m) for m in self.modules]
        seen: set[int] = set()
        self.buffers: list[tuple[torch.Tensor, int, torch.Tensor]] = []
        for m in self.modules:
            for b in m._buffers.values():
                if b is not None and id(b) not in seen:
                    seen.add(id(b))
                    self.buffers.append((b, b._version, b.detach().clone()))
        self.params: list[tuple[torch.Tensor, int, torch.Tensor]] = []

    @staticmethod
    def _dicts_of(m: nn.Module) -> tuple[dict[str, Any], ...]:
        return (dict(m.__dict__), *(dict(m.__dict__[name]) for name in _DICT_NAMES))

    def protect_parameters(self) -> None:
        """Clone the parameters too (call before the model runs for real; idempotent)."""
        if self.params:
            return
        seen: set[int] = set()
        for m in self.modules:
            for p in m._parameters.values():
                if p is not None and id(p) not in seen:
                    seen.add(id(p))
                    self.params.append((p, p._version, p.detach().clone()))

    def restore(self) -> None:
        for m, saved in zip(self.modules, self.dicts, strict=True):
            self._restore_dicts(m, saved)
        with torch.no_grad():
            for t, version, value in self.buffers + self.params:
                # BatchNorm's running statistics are updated without bumping the version counter
                if t._version != version or not _same(t, value):
                    t.copy_(value)
        torch.set_rng_state(self.cpu_rng)
        if self.cuda_rng is not None:
            torch.cuda.set_rng_state_all(self.cuda_rng)

    @staticmethod
    def _restore_dicts(m: nn.Module, saved: tuple[dict[str, Any], ...]) -> None:
        attrs = saved[0]
        current = m.__dict__
        if current.keys() != attrs.keys() or any(current[k] is not v for k, v in attrs.items()):
            current.clear()
            current.update(attrs)
        for name, content in zip(_DICT_NAMES, saved[1:], strict=True):
            d = current[name]
            if d.keys() != content.keys() or any(d[k] is not v for k, v in content.items()):
                d.clear()
                d.update(content)


@contextlib.contextmanager
def preserved(module: nn.Module | None) -> Iterator[CallerState]:
    """Within the block, changes to ``module``'s state and the RNG are undone on exit."""
    state = CallerState(module)
    try:
        yield state
    finally:
        state.restore()
