"""NumPy arrays a module holds as attributes and ``forward`` only copies into tensors: captured
as constants of the exported graph, with a per-call check that they still hold those values.

WHY: RecBole (and code written like it) keeps its field offsets as a NumPy array attribute and
turns it into a tensor in ``forward`` (``x.new_tensor(self.offsets)``,
``torch.tensor(self.offsets, device=...)``). Dynamo traces the array natively (``torch._numpy``,
as ``torch.compile`` does), but as a *graph input*: the array converted to a tensor, passed at
every call. ``torch._dynamo.export`` then fails matching the graph's inputs with the caller's
("Unexpectedly found a Tensor in the inputs"), and the model lost its whole graph for an input
that is a constant of the model. Presenting the array to Dynamo as something else (a tuple, a
tensor) would change what ``forward`` computes (``torch.tensor`` of an int32 array is int32, of
a tuple int64; an ``isinstance(x, np.ndarray)`` branch goes the other way), so the array is
traced as it is, and only the graph's input is turned into a constant afterwards.

When it is a constant (every condition checked, else the export declines and the report says
why): the graph input is an array held in a module's ``__dict__`` under the captured root (it
shares the array's memory, shape, strides and dtype; a graph input that is neither one of
``forward``'s arguments nor such an array declines), and every use of it in the graph is
``torch.tensor(...)``, which copies: the graph never writes the array, and reads only its
values. The constant is a plain tensor attribute of the graph module (not a buffer:
``gm.double()`` must not change what ``torch.tensor`` of an array makes, as ``module.double()``
does not).

Between calls the array may be written in place or replaced: the returned module checks, per
call, that each such attribute is still the same array with the same values
(:class:`ArrayWatch`, in :class:`optimus.capture.specialized.CallGuard`), and re-captures when
not. The cost is one comparison of bytes per array per call (microseconds for an offsets
vector); a module without such arrays pays nothing.

Under ``torch.compile`` of the optimized module Dynamo traces that check, and it cannot read an
array's values (nor its dtype). So the constant is not a copy: it shares the array's memory, and
the compiled graph reads the values as they are at each call; the traced check is the array's
identity, dtype and shape, which Dynamo keeps as guards. A deep copy re-points the copy's
constants at the copy's arrays; an unpickled module, whose constants were written apart from its
arrays, re-optimizes outside the compiled graph at every call.

Dynamo also sets a read-only array writeable while it traces it and does not set it back: the
flags of every array attribute under the root are restored after the capture.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import torch
from torch import fx, nn

CONSTANT_PREFIX = "_optimus_ndarray_"  # plain tensor attributes holding the arrays' values
CONSTANTS = "_optimus_numpy_constants"  # on the exported GraphModule: the arrays it holds


class NotConstant(RuntimeError):
    """A NumPy array the graph takes as an input cannot be held as a constant (the message says
    why): the whole-graph export is not used."""


@dataclass(frozen=True)
class HeldArray:
    """An array attribute (``owner.__dict__[name]``) whose values a graph holds as a constant."""

    owner: nn.Module
    name: str
    path: str  # for messages: "token_embedding_table.offsets"


def array_attributes(root: nn.Module) -> list[tuple[nn.Module, str, str, np.ndarray]]:
    """Every NumPy array held directly in the ``__dict__`` of ``root`` or a module under it, as
    (owner, attribute name, dotted path, array)."""
    found = []
    for prefix, module in root.named_modules(remove_duplicate=False):
        for name, value in vars(module).items():
            if isinstance(value, np.ndarray):
                found.append((module, name, f"{prefix}.{name}" if prefix else name, value))
    return found


def _shares_memory(t: torch.Tensor, array: np.ndarray) -> bool:
    """``t`` is ``torch.as_tensor(array)``: the same memory, shape, strides and dtype."""
    if t.dtype.is_complex or array.dtype.kind not in "biuf" or array.itemsize != t.element_size():
        return False
    return (
        t.data_ptr() == array.ctypes.data
        and tuple(t.shape) == array.shape
        and tuple(s * t.element_size() for s in t.stride()) == array.strides
    )


_COPYING = (torch.tensor,)  # uses of the array's graph input that copy it (never write it)


def _constant_for(
    node: fx.Node, value: Any, candidates: list[tuple[nn.Module, str, str, np.ndarray]]
) -> list[HeldArray]:
    """The module attributes ``node`` (a graph input taking ``value``) reads, if it is such an
    array and may be a constant; [] if it is not an array of the module's; NotConstant if it is
    one but may not be a constant."""
    if not isinstance(value, torch.Tensor) or isinstance(value, torch._subclasses.FakeTensor):
        return []
    held = [HeldArray(o, n, p) for o, n, p, a in candidates if _shares_memory(value, a)]
    if not held:
        return []
    paths = ", ".join(h.path for h in held)
    for user in node.users:
        if user.op != "call_function" or user.target not in _COPYING:
            raise NotConstant(
                f"forward uses the NumPy array {paths} other than copying it into a new tensor "
                f"({user.op} {getattr(user.target, '__name__', user.target)}): not held as a constant"
            )
    return held


@contextlib.contextmanager
def held_as_constants(root: nn.Module) -> Iterator[list[HeldArray]]:
    """Within the block, a ``torch._dynamo.export`` of ``root`` holds the NumPy array attributes
    its ``forward`` only copies into tensors as constants (plain tensor attributes of the graph
    module) instead of failing; the list yielded is filled with the attributes held. Raises
    :class:`NotConstant` (from the export) where such an array may not be a constant. The flags
    of every array attribute under ``root`` are as they were afterwards."""
    from torch._dynamo import eval_frame

    candidates = array_attributes(root)
    if not candidates:
        yield []
        return
    flags = [(a, a.flags.writeable) for _, _, _, a in candidates]
    held: list[HeldArray] = []
    original: Callable[..., fx.GraphModule] = eval_frame.rewrite_signature

    def rewrite_signature(
        f_sig: Any, graph: fx.GraphModule, fake_mode: Any, flat_args: Any, in_spec: Any,
        example_fake_inputs: Any, graph_captured_input: Iterable[Any], *rest: Any,
    ) -> fx.GraphModule:  # fmt: skip
        kept = []
        placeholders = list(graph.graph.find_nodes(op="placeholder"))
        captured = list(graph_captured_input)
        arguments = {id(a) for a in flat_args}
        for node, value in zip(placeholders, captured, strict=True):
            arrays = _constant_for(node, value, candidates)
            if not arrays:
                if isinstance(value, torch.Tensor) and id(value) not in arguments:
                    raise NotConstant(
                        f"the graph input {node.name} is not one of forward's arguments (a NumPy "
                        "array Dynamo copied: a read-only one, or one the module does not hold): "
                        "not held as a constant"
                    )
                kept.append(value)
                continue
            held.extend(arrays)
            name = f"{CONSTANT_PREFIX}{len(held) - 1}"
            setattr(graph, name, value.detach())  # the array's own memory: its values as they are
            with graph.graph.inserting_before(node):
                constant = graph.graph.get_attr(name)
            constant.meta.update(node.meta)
            node.replace_all_uses_with(constant)
            graph.graph.erase_node(node)
        if len(kept) != len(captured):
            graph.recompile()
        return original(f_sig, graph, fake_mode, flat_args, in_spec, example_fake_inputs, tuple(kept), *rest)

    eval_frame.rewrite_signature = rewrite_signature  # type: ignore[assignment]
    try:
        yield held
    finally:
        eval_frame.rewrite_signature = original
        for array, writeable in flags:
            if array.flags.writeable != writeable:
                array.flags.writeable = writeable


def as_plain_attributes(gm: fx.GraphModule, held: list[HeldArray]) -> None:
    """Make the constants plain tensor attributes of ``gm`` (export's signature rewrite copies
    them in as buffers) and record the arrays on it (:data:`CONSTANTS`)."""
    for name in [b for b in gm._buffers if b.startswith(CONSTANT_PREFIX)]:
        value = gm._buffers.pop(name)
        gm._non_persistent_buffers_set.discard(name)
        object.__setattr__(gm, name, value)
    object.__setattr__(gm, CONSTANTS, tuple(held))


def _equal(now: Any, values: np.ndarray) -> bool:
    """Same dtype, shape and bytes (bitwise: a NaN equals itself, -0.0 is not 0.0)."""
    return (
        isinstance(now, np.ndarray)
        and now.dtype == values.dtype
        and now.shape == values.shape
        and now.tobytes() == values.tobytes()
    )


@dataclass
class ArrayWatch:
    """The array attributes the graphs of one :class:`~optimus.capture.specialized.CallGuard`
    hold as constants, with the object and values each held when last snapshotted."""

    held: list[HeldArray] = field(default_factory=list)
    seen: list[tuple[Any, np.ndarray | None]] = field(default_factory=list)
    # the graphs' constants share the arrays' memory (see :meth:`same`); False once they may
    # not: after unpickling, or a deep copy whose constants could not be re-pointed
    live: bool = True

    def __setstate__(self, state: dict[str, Any]) -> None:
        # unpickled, or deep-copied (copy uses this too): the constants were copied apart from
        # the arrays; :meth:`realias` makes a deep copy's live again
        state["live"] = False
        self.__dict__.update(state)

    def add(self, arrays: Iterable[HeldArray]) -> None:
        """Watch ``arrays`` too (those already watched are left as they are)."""
        known = {(id(h.owner), h.name) for h in self.held}
        for h in arrays:
            if (id(h.owner), h.name) not in known:
                known.add((id(h.owner), h.name))
                self.held.append(h)
                self.seen.append(self._now(h))

    @staticmethod
    def _now(h: HeldArray) -> tuple[Any, np.ndarray | None]:
        value = vars(h.owner).get(h.name)
        return value, value.copy() if isinstance(value, np.ndarray) else None

    def same(self) -> bool:
        """Each attribute is the array it was, with the values it had (dtype and shape too)."""
        if torch.compiler.is_compiling():
            return self._same_object()
        for h, (obj, values) in zip(self.held, self.seen, strict=True):
            now = vars(h.owner).get(h.name)
            if now is not obj or values is None or not _equal(now, values):
                return False
        return True

    def _same_object(self) -> bool:
        """The check as Dynamo traces it (``torch.compile`` of the optimized module): each
        attribute is the array it was, with the same dtype and shape. Dynamo turns these into
        guards. It cannot guard on an array's values, and needs not: the graph's constant shares
        the array's memory, so the compiled graph reads the values as they are. Where that may
        not hold (``live`` is False) the check fails, and the call re-optimizes outside the
        compiled graph."""
        if not self.live:
            return False
        for h, (obj, values) in zip(self.held, self.seen, strict=True):
            now = h.owner.__dict__.get(h.name)
            if now is not obj or values is None:
                return False
            t = torch.as_tensor(now)
            if t.dtype != torch.from_numpy(values).dtype or tuple(t.shape) != values.shape:
                return False
        return True

    def changed(self) -> str:
        """Which attributes changed since the snapshot (for the log and the report)."""
        paths = [
            h.path
            for h, (obj, values) in zip(self.held, self.seen, strict=True)
            if vars(h.owner).get(h.name) is not obj
            or values is None
            or not _equal(vars(h.owner).get(h.name), values)
        ]
        return ", ".join(paths)

    def realias(self, graphs: Iterable[Any], memo: dict[int, Any]) -> None:
        """After ``copy.deepcopy(..., memo)`` of ``graphs`` and of this watch: each copied constant
        shares its copied array's memory, as the originals did (a deep copy makes the tensor and
        the array two separate copies). The copy is ``live`` if this watch is and every
        constant was paired so."""
        copied = memo.get(id(self))
        if not isinstance(copied, ArrayWatch):
            return
        copied.live = self.live
        arrays = [obj for obj, _ in self.seen if isinstance(obj, np.ndarray)]
        for graph in graphs:
            for name, t in vars(graph).items():
                if not (name.startswith(CONSTANT_PREFIX) and isinstance(t, torch.Tensor)):
                    continue
                array = next((a for a in arrays if _shares_memory(t, a)), None)
                t_copy = memo.get(id(t))
                a_copy = memo.get(id(array)) if array is not None else None
                if not (isinstance(t_copy, torch.Tensor) and isinstance(a_copy, np.ndarray)):
                    copied.live = False
                    continue
                shared = torch.as_tensor(a_copy)
                with torch.no_grad():
                    t_copy.set_(
                        shared.untyped_storage(), shared.storage_offset(), shared.shape, shared.stride()
                    )

    def refresh(self) -> None:
        """Snapshot every attribute as it is now (the graphs made from here on hold these)."""
        self.seen = [self._now(h) for h in self.held]


__all__ = [
    "CONSTANTS",
    "CONSTANT_PREFIX",
    "ArrayWatch",
    "HeldArray",
    "NotConstant",
    "array_attributes",
    "as_plain_attributes",
    "held_as_constants",
]
