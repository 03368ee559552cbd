"""NumPy arrays a module holds as attributes and ``forward`` only copies into tensors: captured
as constants of the exported graph, and read by the optimized graph at each call.

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

Once the passes have run, each constant and its copies become calls of an :class:`ArrayReader`,
which copies the array the attributes hold *at that call*: a write in place, or another array
put in its place, is read as eager reads it, with no check of its values. Before each call the
returned module checks only what the graph depends on (:class:`ArrayWatch`, in
:class:`optimus.capture.specialized.CallGuard`): the attributes still hold one array, of the
captured dtype and shape; else it re-captures. Why read rather than keep a snapshot and compare
its bytes: under ``torch.compile`` of the optimized module Dynamo traces that check, and it can
read neither an array's values nor its dtype (RecBole failed so under the harness's
compile+optimus). Read so, Dynamo takes the array as an input of the compiled graph, as it does
for the original module, and turns the check into guards; a deep copy or an unpickled copy reads
its own arrays. A module without such arrays pays nothing.

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
GROUPS = (
    "_optimus_numpy_groups"  # on the exported GraphModule: per constant, the attributes that held its array
)


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


class Held(list[HeldArray]):
    """The attributes a graph holds as constants; ``groups``: per constant, the attributes that
    held its array (one array may be held by two attributes, as RecBole's offsets are)."""

    def __init__(self) -> None:
        super().__init__()
        self.groups: dict[str, tuple[HeldArray, ...]] = {}


@contextlib.contextmanager
def held_as_constants(root: nn.Module) -> Iterator[Held]:
    """Within the block, a ``torch._dynamo.export`` of ``root`` holds the NumPy array attributes
    its ``forward`` only copies into tensors as constants (plain tensor attributes of the graph
    module) instead of failing; the list yielded is filled with the attributes held. Raises
    :class:`NotConstant` (from the export) where such an array may not be a constant. The flags
    of every array attribute under ``root`` are as they were afterwards."""
    from torch._dynamo import eval_frame

    candidates = array_attributes(root)
    if not candidates:
        yield Held()
        return
    flags = [(a, a.flags.writeable) for _, _, _, a in candidates]
    held = Held()
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
            held.groups[name] = tuple(arrays)
            setattr(graph, name, value.detach())  # the array's own memory, for the passes
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


def as_plain_attributes(gm: fx.GraphModule, held: Held) -> None:
    """Make the constants plain tensor attributes of ``gm`` (export's signature rewrite copies
    them in as buffers) and record the arrays on it (:data:`GROUPS`)."""
    for name in [b for b in gm._buffers if b.startswith(CONSTANT_PREFIX)]:
        value = gm._buffers.pop(name)
        gm._non_persistent_buffers_set.discard(name)
        object.__setattr__(gm, name, value)
    object.__setattr__(gm, GROUPS, dict(held.groups))


class ArrayReader(nn.Module):
    """A graph's read of one held array at each call: the copy ``torch.tensor`` makes of the
    array its attributes hold now (the only use the capture allows).

    WHY read at each call, not keep a tensor: a write in place, or another array of the same
    dtype and shape put in its place, must be read as eager reads it, and a kept tensor would
    have to be checked against the array's bytes at every call, which ``torch.compile`` cannot
    trace. Read so, Dynamo takes the array as an input of the compiled graph, as it does for the
    original module. What a graph does depend on, the dtype and shape it was captured with and
    that its attributes hold one array, is checked by :meth:`valid` before each call."""

    holders: tuple[HeldArray, ...]
    copy: bool
    array_dtype: np.dtype[Any]
    dtype: torch.dtype
    shape: tuple[int, ...]

    def __init__(self, holders: tuple[HeldArray, ...], array: np.ndarray, copy: bool = True) -> None:
        super().__init__()
        # in __dict__, not as submodules: the owners are the user's modules, not this graph's
        self.__dict__["holders"] = holders
        self.__dict__["copy"] = copy
        self.__dict__["array_dtype"] = array.dtype
        self.__dict__["dtype"] = torch.from_numpy(array[:0].copy()).dtype
        self.__dict__["shape"] = tuple(array.shape)

    def forward(self, *args: Any, **kwargs: Any) -> torch.Tensor:
        """``torch.tensor(array, *args, **kwargs)``: the graph's copy of the array, made at the
        call (one node, not two: retracing the graph to unpickle it cannot pass a traced value
        to ``torch.tensor``)."""
        h = self.holders[0]
        if not self.copy:  # the array itself, where a pass left a use other than a copy
            return torch.as_tensor(h.owner.__dict__[h.name])
        return torch.tensor(h.owner.__dict__[h.name], *args, **kwargs)

    def valid(self) -> bool:
        """The attributes hold one NumPy array, of the captured dtype and shape."""
        now = self.holders[0].owner.__dict__.get(self.holders[0].name)
        if not isinstance(now, np.ndarray):
            return False
        first: np.ndarray = now
        for h in self.holders[1:]:
            if h.owner.__dict__.get(h.name) is not first:
                return False
        if torch.compiler.is_compiling():  # Dynamo reads no ndarray dtype; a tensor's it guards
            t = torch.as_tensor(first)
            return t.dtype == self.dtype and tuple(t.shape) == self.shape
        return (
            first.shape == self.shape
            and first.dtype == self.array_dtype
            and all(st >= 0 for st in first.strides)  # torch.as_tensor takes no negative strides
        )

    def path(self) -> str:
        return ", ".join(h.path for h in self.holders)


def read_at_each_call(gm: fx.GraphModule) -> None:
    """Replace each of ``gm``'s constants and its copies (``torch.tensor(constant, ...)``, the
    only use the capture allows) with calls of an :class:`ArrayReader`, once the passes have run
    (they see the constants as tensors). A constant a pass left another use of is read as the
    array itself (``torch.as_tensor``, its memory)."""
    groups: dict[str, tuple[HeldArray, ...]] = getattr(gm, GROUPS, {})
    changed = False
    for node in list(gm.graph.find_nodes(op="get_attr")):
        name = str(node.target)
        holders = groups.get(name)
        if not holders:
            continue
        array = holders[0].owner.__dict__.get(holders[0].name)
        if not isinstance(array, np.ndarray):
            continue
        delattr(gm, name)
        changed = True
        if not all(
            u.op == "call_function" and u.target in _COPYING and u.args[:1] == (node,) for u in node.users
        ):
            gm.add_submodule(name, ArrayReader(holders, array, copy=False))
            node.op = "call_module"
            continue
        gm.add_submodule(name, ArrayReader(holders, array))
        for use in list(node.users):
            with gm.graph.inserting_before(use):
                read = gm.graph.call_module(name, tuple(use.args[1:]), dict(use.kwargs))
            read.meta.update(use.meta)
            use.replace_all_uses_with(read)
            gm.graph.erase_node(use)
        gm.graph.erase_node(node)
    if changed:
        gm.recompile()


def readers(gm: Any) -> list[ArrayReader]:
    """The array readers of a graph module (none for anything else)."""
    if not isinstance(gm, nn.Module):
        return []
    return [m for m in gm.children() if isinstance(m, ArrayReader)]


@dataclass
class ArrayWatch:
    """The array reads of the graphs one :class:`~optimus.capture.specialized.CallGuard` holds:
    a graph is used only while every one of them is :meth:`ArrayReader.valid`."""

    readers: list[ArrayReader] = field(default_factory=list)

    def add(self, graph: Any) -> None:
        """Watch ``graph``'s reads too."""
        self.readers.extend(readers(graph))

    def same(self) -> bool:
        """Every read is valid: each array's attributes hold one array, of the captured dtype
        and shape. Its values and its identity are not checked: the graphs read them."""
        return all(r.valid() for r in self.readers)

    def changed(self) -> str:
        """The attributes whose reads are no longer valid (for the log and the report)."""
        return ", ".join(r.path() for r in self.readers if not r.valid())

    def refresh(self) -> None:
        """Forget every read: the graphs that made them are dropped (the graphs made from here
        on are added)."""
        self.readers = []


__all__ = [
    "CONSTANT_PREFIX",
    "ArrayReader",
    "ArrayWatch",
    "Held",
    "HeldArray",
    "NotConstant",
    "array_attributes",
    "as_plain_attributes",
    "held_as_constants",
    "read_at_each_call",
    "readers",
]
