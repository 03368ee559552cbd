"""What an FX call does besides computing its result, read from the ATen op schema.

WHY: a hand list of "random" or "mutating" functions is always incomplete (``torch.rrelu``,
``torch.native_dropout``, ``torch.feature_dropout``, ``F.batch_norm`` in train mode were all
missed). PyTorch already records these facts on every ATen overload:

* ``Tag.nondeterministic_seeded``: the op draws from the RNG (CSE must not merge two draws, DCE
  must not drop one, nothing may reorder them: the RNG stream would shift);
* the schema's alias annotations (``Tensor(a!)``): which arguments an op writes, and whether a
  return may share storage with an input (``Tensor(a)``);
* ``torch._C._SchemaInfo``: the same, refined by argument values (``batch_norm`` writes
  ``running_mean``/``running_var`` only when ``training`` is true).

A torch-level call (``torch.rrelu``, ``x.bernoulli_()``, ``torch._C._nn.linear``, ``F.batch_norm``)
is resolved to the ATen overloads of the same name; its arguments are bound to each overload's
schema, and the facts of every overload that fits are united (conservative when several fit).

Hand-written cases, each because the schema cannot say it:

* ``NOOP_WHEN_OFF``: the dropout family returns its *input itself* (an alias, no RNG draw) when
  ``train`` is false or ``p == 0``; the schema declares a fresh, random result;
* ``MAY_RETURN_INPUT``: composite ops that return their input unchanged in some cases but whose
  schema has no alias annotation (``type_as``, ``atleast_1d``, ``sum_to_size``, ``einsum`` ...);
* ``CONVERSIONS``: ``x.long()``, ``x.float()``, ``x.to(dtype)`` ... copy when the dtype (or device)
  changes and may return ``x`` itself when it does not; read from the captured dtypes;
* ``PYTHON_WRAPPERS`` / ``PYTHON_RANDOM``: ``torch.nn.functional`` functions with no ATen op of
  the same name (``dropout1d/2d/3d``, ``gumbel_softmax``); a python wrapper called with
  ``inplace=True`` writes its first tensor argument; ``F.embedding`` with ``max_norm`` writes
  ``weight`` (it renormalizes rows in place).
"""

from __future__ import annotations

import contextlib
import functools
import inspect
import types
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch
import torch.nn.functional as F
from torch import fx

NOOP_WHEN_OFF = frozenset({"dropout", "feature_dropout", "alpha_dropout", "feature_alpha_dropout"})
MAY_RETURN_INPUT = frozenset(
    {
        *NOOP_WHEN_OFF,
        "type_as",
        "atleast_1d",
        "atleast_2d",
        "atleast_3d",
        "sum_to_size",
        "einsum",
        "lift_fresh",
        "_autocast_to_reduced_precision",
        "_autocast_to_full_precision",
        "align_as",
        "align_to",
        "refine_names",
        "rename",
        "resolve_conj",
        "resolve_neg",
    }
)
# python-level functions with no ATen op of their name -> the ATen op whose facts they share
PYTHON_WRAPPERS: dict[Callable[..., Any], str] = {
    F.dropout1d: "feature_dropout",
    F.dropout2d: "feature_dropout",
    F.dropout3d: "feature_dropout",
}
# python-level functions that always draw from the RNG and have no ATen op to read it from
PYTHON_RANDOM: frozenset[Callable[..., Any]] = frozenset({F.gumbel_softmax})
_RENAMES = {"input": "self", "self": "input", "training": "train", "train": "training"}
_TORCH_MODULES = (
    "torch",
    "torch.functional",
    "torch.nn.functional",
    "torch._C._nn",
    "torch._C._VariableFunctions",
)


@dataclass(frozen=True)
class OpFacts:
    """Facts about one call: ``random`` (draws from the RNG), ``writes`` (argument nodes it mutates),
    ``may_alias`` (its output may share storage with an input)."""

    random: bool
    writes: tuple[fx.Node, ...]
    may_alias: bool


def _aten_packet(name: str) -> Any:
    try:
        return getattr(torch.ops.aten, name)
    except (AttributeError, RuntimeError):
        return None


@functools.lru_cache(maxsize=4096)
def _overloads_by_name(name: str) -> tuple[Any, ...]:
    packet = _aten_packet(name)
    if packet is None:
        return ()
    return tuple(getattr(packet, o) for o in packet.overloads())


def _resolve(node: fx.Node) -> tuple[str, tuple[Any, ...], bool] | None:
    """(aten name, candidate overloads, is python wrapper) for a call we can map to ATen."""
    target = node.target
    if node.op == "call_method" and isinstance(target, str):
        return target, _overloads_by_name(target), False
    if node.op != "call_function":
        return None
    if isinstance(target, torch._ops.OpOverload):
        return target._schema.name.split("::")[-1], (target,), False
    if isinstance(target, torch._ops.OpOverloadPacket):
        return (
            target._qualified_op_name.split("::")[-1],
            tuple(getattr(target, o) for o in target.overloads()),
            False,
        )
    try:
        wrapped = PYTHON_WRAPPERS.get(target)  # type: ignore[arg-type]
        if target in PYTHON_RANDOM:
            return "<random>", (), True
    except TypeError:
        wrapped = None
    if wrapped is not None:
        return wrapped, _overloads_by_name(wrapped), True
    name = getattr(target, "__name__", None)
    module = getattr(target, "__module__", None) or ""
    if not isinstance(name, str):
        return None
    if isinstance(target, types.BuiltinFunctionType) and (module.startswith("torch") or module == ""):
        return name, _overloads_by_name(name), False
    if isinstance(target, types.FunctionType) and module in _TORCH_MODULES:
        return name, _overloads_by_name(name), True
    return None


def aten_name(node: fx.Node) -> str | None:
    """The ATen op name a call maps to (``"batch_norm"`` for ``F.batch_norm``), or None."""
    resolved = _resolve(node)
    return None if resolved is None or resolved[0] == "<random>" else resolved[0]


@functools.cache
def _signature(fn: Callable[..., Any]) -> inspect.Signature:
    return inspect.signature(fn)


def call_arguments(node: fx.Node, fn: Callable[..., Any]) -> dict[str, Any] | None:
    """``fn``'s arguments in the call ``node`` by parameter name (defaults filled), or None when
    ``node`` calls something else or its arguments do not bind. Why by name: a rule reads
    ``eps`` or ``padding_idx`` the same way whether the user passed it by position or keyword."""
    if node.op != "call_function" or node.target is not fn:
        return None
    try:
        bound = _signature(fn).bind(*node.args, **node.kwargs)
    except TypeError:
        return None
    bound.apply_defaults()
    return dict(bound.arguments)


def _bind_python(node: fx.Node) -> dict[str, Any] | None:
    """Arguments of a python-level torch function by parameter name (defaults filled)."""
    try:
        sig = inspect.signature(node.target)  # type: ignore[arg-type]
        bound = sig.bind(*node.args, **node.kwargs)
    except (TypeError, ValueError):
        return None
    bound.apply_defaults()
    return dict(bound.arguments)


def _bind_schema(schema: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> dict[str, Any] | None:
    """Bind a call to one overload's schema (None if it does not fit)."""
    if any(a.name == "out" for a in schema.arguments) and "out" not in kwargs:
        return None
    positional = [a for a in schema.arguments if not a.kwarg_only]
    if len(args) > len(positional):
        return None
    out: dict[str, Any] = {a.name: v for a, v in zip(positional, args, strict=False)}
    names = {a.name for a in schema.arguments}
    for key, value in kwargs.items():
        if key not in names or key in out:
            return None
        out[key] = value
    for a in schema.arguments:
        if a.name not in out:
            if not a.has_default_value():
                return None
            out[a.name] = a.default_value
    return out


def _bind_by_name(schema: Any, named: dict[str, Any]) -> dict[str, Any] | None:
    """Bind a python wrapper's arguments (by parameter name) to an overload's schema. Out
    overloads never fit; an argument the wrapper does not pass stays unknown (not bound)."""
    if any(a.name == "out" for a in schema.arguments):
        return None
    out: dict[str, Any] = {}
    for a in schema.arguments:
        if a.name in named:
            out[a.name] = named[a.name]
        elif _RENAMES.get(a.name) in named:
            out[a.name] = named[_RENAMES[a.name]]
    return out


def _nodes_in(value: Any) -> list[fx.Node]:
    if isinstance(value, fx.Node):
        return [value]
    if isinstance(value, (list, tuple)):
        return [n for v in value for n in _nodes_in(v)]
    return []


def _switched_off(name: str, bound: dict[str, Any]) -> bool:
    """The dropout family with ``train`` false or ``p == 0``: returns the input, draws nothing."""
    if name not in NOOP_WHEN_OFF:
        return False
    train = bound.get("train", bound.get("training", True))
    p = bound.get("p", 0.5)
    return train is False or (isinstance(p, (int, float)) and not isinstance(p, bool) and p == 0)


_MUTABLE: dict[Any, bool] = {}


def _maybe_mutable(op: Any) -> bool:
    """Can this overload write an argument for some argument values (cached per overload)?"""
    found = _MUTABLE.get(op)
    if found is None:
        found = _MUTABLE[op] = bool(torch._C._SchemaInfo(op._schema).is_mutable())
    return found


def _facts_of_overload(op: Any, name: str, bound: dict[str, Any]) -> OpFacts:
    schema = op._schema
    if _switched_off(name, bound):
        return OpFacts(False, (), True)
    random = torch.Tag.nondeterministic_seeded in op.tags
    if random:
        for flag in ("train", "training"):
            if bound.get(flag) is False:
                random = False
    writes: list[fx.Node] = []
    if _maybe_mutable(op):
        info = torch._C._SchemaInfo(schema)
        for arg in schema.arguments:  # constants refine SchemaInfo (batch_norm's ``training``)
            value = bound.get(arg.name)
            if arg.name in bound and isinstance(value, (bool, int, float, type(None))):
                # a value SchemaInfo cannot take stays unknown (conservative)
                with contextlib.suppress(RuntimeError, TypeError):
                    info.add_argument_value(arg.name, value)
        for arg in schema.arguments:
            nodes = _nodes_in(bound.get(arg.name))
            if nodes and info.is_mutable(arg.name):
                writes.extend(nodes)
    may_alias = name in MAY_RETURN_INPUT or any(r.alias_info is not None for r in schema.returns)
    return OpFacts(random, tuple(writes), may_alias)


_CACHE: dict[Any, tuple[bool, tuple[int, ...], bool] | None] = {}
_CONSTANTS = (bool, int, float, str, type(None), torch.dtype, torch.device, torch.memory_format, torch.layout)


def _shape(value: Any, nodes: list[fx.Node]) -> Any:
    """A hashable picture of an argument with each node replaced by its index in ``nodes``."""
    if isinstance(value, fx.Node):
        nodes.append(value)
        return ("node", len(nodes) - 1)
    if isinstance(value, (list, tuple)):
        return (type(value).__name__, tuple(_shape(v, nodes) for v in value))
    if isinstance(value, dict):
        return ("dict", tuple((k, _shape(v, nodes)) for k, v in value.items()))
    if isinstance(value, slice):
        return ("slice", _shape(value.start, nodes), _shape(value.stop, nodes), _shape(value.step, nodes))
    if isinstance(value, _CONSTANTS):
        return (type(value).__name__, value)
    raise TypeError("not a plain constant")


# dtype conversions as methods: ``x.long()`` has no ATen op of its name; ``x.to(dtype)`` may return x
CONVERSIONS = frozenset(
    {"to", "type", "long", "int", "short", "char", "byte", "bool", "float", "double", "half", "bfloat16"}
)


def _conversion_facts(node: fx.Node) -> OpFacts | None:
    """A dtype conversion whose captured result has another dtype than its input is a new tensor
    (it cannot alias: the bytes differ); one that keeps the dtype may return its input itself."""
    if node.op != "call_method" or node.target not in CONVERSIONS or not node.args:
        return None
    from optimus.semantics.meta import (
        tensor_meta,  # meta imports nothing of ours; kept local to stay a leaf module
    )

    src = node.args[0]
    before = tensor_meta(src) if isinstance(src, fx.Node) else None
    after = tensor_meta(node)
    if before is None or after is None:
        return None
    return OpFacts(False, (), before.dtype == after.dtype and before.device == after.device)


def op_facts(node: fx.Node) -> OpFacts | None:
    """The schema's facts about ``node``'s call, or None when it maps to no ATen op. Cached per
    call pattern (target, constants, where the nodes are): the driver asks for every node each
    round. Dtype conversions are decided from the captured dtypes, so they are not cached."""
    converted = _conversion_facts(node)
    if converted is not None:
        return converted
    nodes: list[fx.Node] = []
    try:
        key = (node.op, node.target, _shape(node.args, nodes), _shape(node.kwargs, nodes))
        hash(key)
    except TypeError:
        return _op_facts(node)
    if key in _CACHE:
        found = _CACHE[key]
        if found is None:
            return None
        return OpFacts(found[0], tuple(nodes[i] for i in found[1]), found[2])
    facts = _op_facts(node)
    if len(_CACHE) > 65536:
        _CACHE.clear()
    if facts is None:
        _CACHE[key] = None
    else:
        index = {n: i for i, n in reversed(list(enumerate(nodes)))}
        if all(w in index for w in facts.writes):
            _CACHE[key] = (facts.random, tuple(index[w] for w in facts.writes), facts.may_alias)
    return facts


def _op_facts(node: fx.Node) -> OpFacts | None:
    resolved = _resolve(node)
    if resolved is None:
        return None
    name, overloads, python = resolved
    if name == "<random>":
        return OpFacts(True, (), False)
    if not overloads:
        return None
    named = _bind_python(node) if python else None
    if python and named is None:
        return None
    found: list[OpFacts] = []
    for op in overloads:
        if named is not None:
            bound = _bind_by_name(op._schema, named)
        else:
            args = tuple(node.args)
            kwargs = dict(node.kwargs)
            bound = _bind_schema(op._schema, args, kwargs)
            if bound is None and node.op == "call_method" and len(args) > 1:
                # x.new_zeros(4, 8) / x.view(2, 3): the method packs trailing ints into one list
                bound = _bind_schema(op._schema, (args[0], args[1:]), kwargs)
        if bound is not None:
            found.append(_facts_of_overload(op, name, bound))
    if not found:  # nothing fits exactly: every overload, unbound, writing any input (conservative)
        for op in overloads:
            if "out" not in node.kwargs and any(a.name == "out" for a in op._schema.arguments):
                continue  # a call without ``out=`` is never an out overload
            facts = _facts_of_overload(op, name, {})
            writes_any = tuple(node.all_input_nodes) if _maybe_mutable(op) else ()
            found.append(OpFacts(facts.random, writes_any, facts.may_alias))
    if python and named is not None and named.get("inplace") is True:
        first = next(iter(_nodes_in(list(named.values()))), None)
        if first is not None:
            found.append(OpFacts(False, (first,), True))
    if node.target is F.embedding and named is not None and named.get("max_norm") is not None:
        weight = named.get("weight")  # renormalizes the rows it reads in place
        if isinstance(weight, fx.Node):
            found.append(OpFacts(False, (weight,), False))
    writes = tuple(dict.fromkeys(n for f in found for n in f.writes))
    return OpFacts(any(f.random for f in found), writes, any(f.may_alias for f in found))
