"""Schema normalization: every call form of an op -> one canonical ``Canon(op, kwargs)``.

WHY: the same op reaches a graph as ``torch.relu(x)``, ``F.relu(x, False)``, ``x.relu()``,
``nn.ReLU()`` or ``operator.add``; its arguments come positionally or by keyword. Rules must see
one form, and must never lose an argument: a fusion that reads only ``kwargs`` silently drops a
positional ``p``, ``training``, clamp bound, ``nan_to_num`` value or ``alpha``. Here every call is
bound against the op's full signature with every default filled in, so two calls are "the same op
with the same settings" exactly when their ``Canon.kwargs`` (minus tensor inputs) are equal.

A call we do not know normalizes to ``None``; rules then leave the node alone (never raise).

Tables: ``OPS`` holds the canonical signature of each op (names and defaults). ``_FUNCTIONS``,
``_METHODS`` and ``_MODULES`` map call targets to a canonical op plus that target's own
positional order (which may differ: ``torch.dropout(input, p, train)``).
"""

from __future__ import annotations

import operator
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import torch
import torch.nn.functional as F
from torch import fx, nn

_REQ = object()  # marker: required parameter (no default)


def _spec(text: str) -> tuple[tuple[str, Any], ...]:
    """Parse ``"input, other, alpha=1"`` into ((name, default-or-_REQ), ...)."""
    out: list[tuple[str, Any]] = []
    for part in text.split(","):
        part = part.strip()
        if not part:
            continue
        if "=" in part:
            name, default = part.split("=", 1)
            out.append((name.strip(), eval(default.strip(), {"inf": float("inf")})))  # literals only
        else:
            out.append((part, _REQ))
    return tuple(out)


# Unary ops with no settings: the same name on torch and on Tensor (methods and emitters share it).
_PLAIN_UNARY = (
    "tanh",
    "sigmoid",
    "exp",
    "expm1",
    "log",
    "log1p",
    "log2",
    "sqrt",
    "rsqrt",
    "abs",
    "neg",
    "sin",
    "cos",
    "erf",
    "reciprocal",
    "square",
    "sign",
    "floor",
    "ceil",
    "round",
    "trunc",
)

# Canonical signature of every op we understand: the names rules read, with defaults.
OPS: dict[str, tuple[tuple[str, Any], ...]] = {
    "linear": _spec("input, weight, bias=None"),
    "layer_norm": _spec("input, normalized_shape, weight=None, bias=None, eps=1e-05"),
    # unary pointwise
    **{
        name: _spec("input")
        for name in [
            *_PLAIN_UNARY,
            "logsigmoid",
            "tanhshrink",
            "softsign",
        ]
    },
    **{
        name: _spec("input, inplace=False")
        for name in ["relu", "relu6", "silu", "mish", "hardswish", "hardsigmoid", "selu"]
    },
    "gelu": _spec("input, approximate='none'"),
    "elu": _spec("input, alpha=1.0, inplace=False"),
    "celu": _spec("input, alpha=1.0, inplace=False"),
    "leaky_relu": _spec("input, negative_slope=0.01, inplace=False"),
    "hardtanh": _spec("input, min_val=-1.0, max_val=1.0, inplace=False"),
    "softplus": _spec("input, beta=1.0, threshold=20.0"),
    "clamp": _spec("input, min=None, max=None"),
    "nan_to_num": _spec("input, nan=0.0, posinf=None, neginf=None"),
    "dropout": _spec("input, p=0.5, training=True, inplace=False"),
    # binary pointwise
    "add": _spec("input, other, alpha=1"),
    "sub": _spec("input, other, alpha=1"),
    "mul": _spec("input, other"),
    "div": _spec("input, other, rounding_mode=None"),
    "maximum": _spec("input, other"),
    "minimum": _spec("input, other"),
    "pow": _spec("input, exponent"),
    # structure (the split/cat family reads these)
    "split": _spec("input, split_size_or_sections, dim=0"),
    "chunk": _spec("input, chunks, dim=0"),
    "unbind": _spec("input, dim=0"),
    "cat": _spec("tensors, dim=0"),
    "stack": _spec("tensors, dim=0"),
    "getitem": _spec("input, index"),
    "reshape": _spec("input, shape"),
    "view": _spec("input, shape"),
    "permute": _spec("input, dims"),
    "transpose": _spec("input, dim0, dim1"),
    "flatten": _spec("input, start_dim=0, end_dim=-1"),
    "unsqueeze": _spec("input, dim"),
    "squeeze": _spec("input, dim=None"),
    "contiguous": _spec("input"),
}

# Structure ops: they move or view data and compute nothing per element.
VIEW_OPS = frozenset(
    {
        "split",
        "chunk",
        "unbind",
        "getitem",
        "reshape",
        "view",
        "permute",
        "transpose",
        "flatten",
        "unsqueeze",
        "squeeze",
        "contiguous",
    }
)
# Every op of one tensor input whose other arguments all have defaults, except linear, layer
# norm, the structure ops and dropout.
UNARY_POINTWISE = frozenset(
    name
    for name, spec in OPS.items()
    if spec[0][0] == "input"
    and all(d is not _REQ for _, d in spec[1:])
    and name not in VIEW_OPS | {"linear", "layer_norm", "dropout"}
)
BINARY_POINTWISE = frozenset({"add", "sub", "mul", "div", "maximum", "minimum", "pow"})


@dataclass(frozen=True)
class _Target:
    """How one call target maps to a canonical op: its positional order, renames, fixed values."""

    op: str
    positional: tuple[str, ...]  # canonical names in this target's positional order
    aliases: dict[str, str] = field(default_factory=dict)  # target kw name -> canonical name
    fixed: dict[str, Any] = field(default_factory=dict)  # values implied by the target itself
    varargs: str | None = None  # x.view(2, 3) style: remaining positionals form one tuple
    inplace: bool = False


def _t(op: str, positional: str | None = None, **kw: Any) -> _Target:
    names = tuple(n for n, _ in OPS[op]) if positional is None else tuple(positional.split())
    return _Target(op, names, **kw)


_AXIS = {"axis": "dim"}


def _aten_split_cat() -> dict[Any, _Target]:
    """The ATen split/cat/stack/unbind ops as a model may call them directly
    (``torch.ops.aten.split.Tensor(x, 2, 1)``; Dynamo keeps the overload, or the packet when
    written without one). Each binds by its schema's own names (``self``, ``split_size``,
    ``split_sizes``, ``tensors``, ``dim``; no ``axis=``: the dispatcher rejects it) to the same
    canonical op as the torch function: ``split.Tensor`` takes an int size, ``split.sizes`` and
    ``split_with_sizes`` a list, like ``torch.split``'s int-or-list; ``unbind.int``, ``cat``,
    ``concat``, ``concatenate`` and ``stack`` take an int ``dim`` defaulting to 0, like theirs.
    The Dimname overloads (a str ``dim``) bind too but no rule reads a non-int dim; ``out=``
    overloads are not listed (they write)."""
    aten = torch.ops.aten
    split = {"self": "input", "split_size": "split_size_or_sections"}
    out: dict[Any, _Target] = {
        aten.split.Tensor: _t("split", aliases=split),
        aten.split.sizes: _t("split", aliases=split),
        aten.split: _t("split", aliases=split),
        aten.split_with_sizes.default: _t(
            "split", aliases={"self": "input", "split_sizes": "split_size_or_sections"}
        ),
        aten.split_with_sizes: _t(
            "split", aliases={"self": "input", "split_sizes": "split_size_or_sections"}
        ),
        aten.chunk.default: _t("chunk", aliases={"self": "input"}),
        aten.chunk: _t("chunk", aliases={"self": "input"}),
        aten.unbind.int: _t("unbind", aliases={"self": "input"}),
        aten.unbind: _t("unbind", aliases={"self": "input"}),
    }
    for name in ("cat", "concat", "concatenate"):
        packet = getattr(aten, name)
        out[packet.default] = out[packet] = _t("cat")
    out[aten.stack.default] = out[aten.stack] = _t("stack")
    return out


_ATEN_SPLIT_CAT = _aten_split_cat()

_FUNCTIONS: dict[Any, _Target] = {
    F.linear: _t("linear"),
    F.layer_norm: _t("layer_norm"),
    torch.layer_norm: _t("layer_norm"),
    torch.tanh: _t("tanh"),
    F.tanh: _t("tanh"),
    torch.sigmoid: _t("sigmoid"),
    F.sigmoid: _t("sigmoid"),
    torch.relu: _t("relu", "input"),
    F.relu: _t("relu"),
    torch.relu_: _t("relu", "input", inplace=True),
    F.relu_: _t("relu", "input", inplace=True),
    F.relu6: _t("relu6"),
    F.silu: _t("silu"),
    F.mish: _t("mish"),
    F.hardswish: _t("hardswish"),
    F.hardsigmoid: _t("hardsigmoid"),
    F.selu: _t("selu"),
    torch.selu: _t("selu", "input"),
    F.gelu: _t("gelu"),
    F.elu: _t("elu"),
    F.celu: _t("celu"),
    F.leaky_relu: _t("leaky_relu"),
    F.hardtanh: _t("hardtanh"),
    F.softplus: _t("softplus"),
    F.logsigmoid: _t("logsigmoid"),
    F.tanhshrink: _t("tanhshrink"),
    F.softsign: _t("softsign"),
    torch.clamp: _t("clamp"),
    torch.clip: _t("clamp"),
    torch.nan_to_num: _t("nan_to_num"),
    F.dropout: _t("dropout"),
    torch.dropout: _t("dropout", "input p training", aliases={"train": "training"}),
    torch.add: _t("add"),
    torch.sub: _t("sub"),
    torch.subtract: _t("sub"),
    torch.mul: _t("mul"),
    torch.multiply: _t("mul"),
    torch.div: _t("div"),
    torch.divide: _t("div"),
    torch.true_divide: _t("div", "input other"),
    torch.maximum: _t("maximum"),
    torch.minimum: _t("minimum"),
    torch.pow: _t("pow"),
    operator.add: _t("add", "input other"),
    operator.sub: _t("sub", "input other"),
    operator.mul: _t("mul", "input other"),
    operator.truediv: _t("div", "input other"),
    operator.floordiv: _t("div", "input other", fixed={"rounding_mode": "floor"}),
    operator.pow: _t("pow", "input exponent"),
    operator.neg: _t("neg"),
    operator.iadd: _t("add", "input other", inplace=True),
    operator.isub: _t("sub", "input other", inplace=True),
    operator.imul: _t("mul", "input other", inplace=True),
    operator.itruediv: _t("div", "input other", inplace=True),
    operator.getitem: _t("getitem"),
    # ``torch.split`` is a Python function (no ``axis=``); the builtins below go through PyTorch's
    # argument parser, which takes NumPy's ``axis=`` for ``dim`` (both at once is an error, and
    # ``_bind`` rejects a duplicate too)
    torch.split: _t("split", aliases={"tensor": "input", "split_size": "split_size_or_sections"}),
    torch.chunk: _t("chunk", aliases=_AXIS),
    torch.unbind: _t("unbind", aliases=_AXIS),
    torch.cat: _t("cat", aliases=_AXIS),
    torch.concat: _t("cat", aliases=_AXIS),
    torch.concatenate: _t("cat", aliases=_AXIS),
    torch.stack: _t("stack", aliases=_AXIS),
    **_ATEN_SPLIT_CAT,
    torch.reshape: _t("reshape"),
    torch.permute: _t("permute"),
    torch.transpose: _t("transpose"),
    torch.flatten: _t("flatten"),
    torch.unsqueeze: _t("unsqueeze"),
    torch.squeeze: _t("squeeze"),
}
for _name in _PLAIN_UNARY:  # torch.tanh / torch.sigmoid are already listed, with the same target
    _FUNCTIONS[getattr(torch, _name)] = _t(_name)
    if hasattr(torch, _name + "_"):
        _FUNCTIONS[getattr(torch, _name + "_")] = _t(_name, inplace=True)
for _name in ("tanh", "sigmoid"):
    _FUNCTIONS[getattr(torch, _name + "_")] = _t(_name, inplace=True)

# Tensor methods: self is the first positional.
_METHODS: dict[str, _Target] = {
    "relu": _t("relu", "input"),
    "add": _t("add"),
    "sub": _t("sub"),
    "subtract": _t("sub"),
    "mul": _t("mul"),
    "multiply": _t("mul"),
    "div": _t("div"),
    "divide": _t("div"),
    "true_divide": _t("div", "input other"),
    "maximum": _t("maximum"),
    "minimum": _t("minimum"),
    "pow": _t("pow"),
    "clamp": _t("clamp"),
    "clip": _t("clamp"),
    "nan_to_num": _t("nan_to_num"),
    "split": _t("split", aliases={"split_size": "split_size_or_sections"}),  # Python: no axis=
    "chunk": _t("chunk", aliases=_AXIS),
    "unbind": _t("unbind", aliases=_AXIS),
    "reshape": _t("reshape", "input", varargs="shape"),
    "view": _t("view", "input", varargs="shape"),
    "permute": _t("permute", "input", varargs="dims"),
    "transpose": _t("transpose"),
    "flatten": _t("flatten"),
    "unsqueeze": _t("unsqueeze"),
    "squeeze": _t("squeeze"),
    "contiguous": _t("contiguous"),
    "__getitem__": _t("getitem"),
}
for _name in _PLAIN_UNARY:
    _METHODS[_name] = _t(_name)
for _name, _target in list(_METHODS.items()):
    if _target.op in UNARY_POINTWISE | BINARY_POINTWISE and not _name.startswith("_"):
        _METHODS[_name + "_"] = _Target(
            _target.op, _target.positional, _target.aliases, _target.fixed, _target.varargs, inplace=True
        )


def _module_canon(mod: nn.Module) -> tuple[str, dict[str, Any]] | None:
    """Stateless leaf modules -> (op, settings). Stateful ones (Linear, LayerNorm) are lowered
    to get_attr + call_function by :func:`lower_modules` first."""
    simple = {
        nn.Tanh: "tanh",
        nn.Sigmoid: "sigmoid",
        nn.Mish: "mish",
        nn.LogSigmoid: "logsigmoid",
        nn.Tanhshrink: "tanhshrink",
        nn.Softsign: "softsign",
    }
    for cls, op in simple.items():
        if type(mod) is cls:
            return op, {}
    if type(mod) in (nn.ReLU, nn.ReLU6, nn.SiLU, nn.Hardswish, nn.Hardsigmoid, nn.SELU):
        op = {
            nn.ReLU: "relu",
            nn.ReLU6: "relu6",
            nn.SiLU: "silu",
            nn.Hardswish: "hardswish",
            nn.Hardsigmoid: "hardsigmoid",
            nn.SELU: "selu",
        }[type(mod)]
        return op, {"inplace": bool(getattr(mod, "inplace", False))}
    if type(mod) is nn.GELU:
        return "gelu", {"approximate": mod.approximate}
    if type(mod) is nn.ELU:
        return "elu", {"alpha": mod.alpha, "inplace": mod.inplace}
    if type(mod) is nn.CELU:
        return "celu", {"alpha": mod.alpha, "inplace": mod.inplace}
    if type(mod) is nn.LeakyReLU:
        return "leaky_relu", {"negative_slope": mod.negative_slope, "inplace": mod.inplace}
    if type(mod) is nn.Hardtanh:
        return "hardtanh", {"min_val": mod.min_val, "max_val": mod.max_val, "inplace": mod.inplace}
    if type(mod) is nn.Softplus:
        return "softplus", {"beta": mod.beta, "threshold": mod.threshold}
    if type(mod) is nn.Dropout:
        return "dropout", {"p": mod.p, "training": mod.training, "inplace": mod.inplace}
    return None


@dataclass(frozen=True, eq=False)
class Canon:
    """A call in canonical form. ``kwargs`` holds every parameter of ``OPS[op]`` in order, with
    defaults filled in; tensor inputs are ``fx.Node``s. ``inplace`` is True when the call writes
    its first tensor input (``x.add_(y)``, ``F.relu(x, inplace=True)``, ``operator.iadd``)."""

    op: str
    kwargs: dict[str, Any]
    inplace: bool = False

    def settings(self, *exclude: str) -> tuple[tuple[str, Any], ...]:
        """Hashable non-node settings (e.g. for a horizontal group key)."""
        return tuple(
            (k, _hashable(v)) for k, v in self.kwargs.items() if k not in exclude and not _has_node(v)
        )

    def __getitem__(self, name: str) -> Any:
        return self.kwargs[name]


def _has_node(value: Any) -> bool:
    if isinstance(value, fx.Node):
        return True
    if isinstance(value, (list, tuple)):
        return any(_has_node(v) for v in value)
    if isinstance(value, dict):
        return any(_has_node(v) for v in value.values())
    return False


def _hashable(value: Any) -> Any:
    if isinstance(value, (list, tuple)):
        return tuple(_hashable(v) for v in value)
    if isinstance(value, float) and value != value:
        return "nan"  # nan != nan would make equal settings look different
    if isinstance(value, (torch.dtype, torch.device, str, int, float, bool, type(None))):
        return (type(value).__name__, value)
    if isinstance(value, (torch.SymInt, torch.SymFloat)):
        return ("sym", id(value))
    return ("obj", id(value))


def _bind(target: _Target, args: tuple[Any, ...], kwargs: dict[str, Any]) -> dict[str, Any] | None:
    spec = OPS[target.op]
    out: dict[str, Any] = {}
    positional = list(args)
    if target.varargs is not None:
        head = positional[: len(target.positional)]
        rest = positional[len(target.positional) :]
        if len(rest) == 1 and isinstance(rest[0], (list, tuple)):
            rest_value: Any = tuple(rest[0])
        else:
            rest_value = tuple(rest)
        positional = head
        if rest or target.varargs not in kwargs:
            out[target.varargs] = rest_value
    if len(positional) > len(target.positional):
        return None
    for name, value in zip(target.positional, positional, strict=False):
        out[name] = value
    for key, value in kwargs.items():
        name = target.aliases.get(key, key)
        if name in out or name not in dict(spec):
            return None  # duplicate or unknown keyword: not a call we understand
        out[name] = value
    for key, value in target.fixed.items():
        out[key] = value
    full: dict[str, Any] = {}
    for name, default in spec:
        if name in out:
            full[name] = out[name]
        elif default is _REQ:
            return None
        else:
            full[name] = default
    return full


def canonicalize(node: fx.Node, modules: dict[str, nn.Module] | None = None) -> Canon | None:
    """The canonical form of ``node``'s call, or None for anything we do not understand."""
    target: _Target | None
    if node.op == "call_function":
        try:
            target = _FUNCTIONS.get(node.target)
        except TypeError:  # unhashable target
            return None
    elif node.op == "call_method":
        target = _METHODS.get(str(node.target))
    elif node.op == "call_module" and modules is not None:
        mod = modules.get(str(node.target))
        found = _module_canon(mod) if mod is not None else None
        if found is None or len(node.args) != 1 or node.kwargs:
            return None
        op, settings = found
        full = {name: default for name, default in OPS[op]}
        full.update(settings)
        full["input"] = node.args[0]
        return Canon(op, full, inplace=bool(full.get("inplace", False)))
    else:
        return None
    if target is None:
        return None
    full_kwargs = _bind(target, tuple(node.args), dict(node.kwargs))
    if full_kwargs is None:
        return None
    inplace = target.inplace or bool(full_kwargs.get("inplace", False))
    return Canon(target.op, full_kwargs, inplace=inplace)


# Canonical op -> a callable taking the canonical kwargs (for rules that emit the fused form).
EMIT: dict[str, Callable[..., Any]] = {
    "linear": F.linear,
    "layer_norm": F.layer_norm,
    "gelu": F.gelu,
    "elu": F.elu,
    "celu": F.celu,
    "leaky_relu": F.leaky_relu,
    "hardtanh": F.hardtanh,
    "softplus": F.softplus,
    "relu": F.relu,
    "relu6": F.relu6,
    "silu": F.silu,
    "mish": F.mish,
    "hardswish": F.hardswish,
    "hardsigmoid": F.hardsigmoid,
    "selu": F.selu,
    "logsigmoid": F.logsigmoid,
    "tanhshrink": F.tanhshrink,
    "softsign": F.softsign,
    "clamp": torch.clamp,
    "nan_to_num": torch.nan_to_num,
    "dropout": F.dropout,
    "add": torch.add,
    "sub": torch.sub,
    "mul": torch.mul,
    "div": torch.div,
    "maximum": torch.maximum,
    "minimum": torch.minimum,
    "pow": torch.pow,
}
for _name in _PLAIN_UNARY:
    EMIT[_name] = getattr(torch, _name)


def emit_kwargs(canon_op: str, kwargs: dict[str, Any]) -> tuple[tuple[Any, ...], dict[str, Any]]:
    """(args, kwargs) to call ``EMIT[canon_op]`` with canonical ``kwargs`` (all passed by keyword,
    except the few ops whose python binding takes the first tensor positionally only)."""
    kw = dict(kwargs)
    first = OPS[canon_op][0][0]
    value = kw.pop(first)
    if canon_op in {"mul", "maximum", "minimum", "pow", "add", "sub", "div"}:
        second = OPS[canon_op][1][0]
        return (value, kw.pop(second)), kw
    return (value,), kw


def lower_modules(gm: fx.GraphModule) -> int:
    """Rewrite ``call_module`` of nn.Linear / nn.LayerNorm into get_attr + call_function so the
    rules see one form (a symbolic_trace graph keeps them as modules; Dynamo inlines them).
    The get_attr nodes read the module's own parameters, so gradients land on them."""
    modules = dict(gm.named_modules())
    changed = 0
    for node in list(gm.graph.nodes):
        if node.op != "call_module" or len(node.args) != 1 or node.kwargs:
            continue
        mod = modules.get(str(node.target))
        with gm.graph.inserting_before(node):
            if type(mod) is nn.Linear:
                weight = gm.graph.get_attr(f"{node.target}.weight")
                bias = gm.graph.get_attr(f"{node.target}.bias") if mod.bias is not None else None
                new = gm.graph.call_function(F.linear, (node.args[0], weight, bias))
            elif type(mod) is nn.LayerNorm:
                weight = gm.graph.get_attr(f"{node.target}.weight") if mod.weight is not None else None
                bias = gm.graph.get_attr(f"{node.target}.bias") if mod.bias is not None else None
                new = gm.graph.call_function(
                    F.layer_norm, (node.args[0], tuple(mod.normalized_shape), weight, bias, mod.eps)
                )
            else:
                continue
        new.meta.update(node.meta)
        node.replace_all_uses_with(new)
        gm.graph.erase_node(node)
        changed += 1
    return changed
