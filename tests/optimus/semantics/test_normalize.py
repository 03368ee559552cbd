"""Schema normalization: every call form of an op gives the same canonical kwargs."""

from __future__ import annotations

import operator

import pytest
import torch
import torch.nn.functional as F
from torch import fx, nn

from optimus.semantics.normalize import OPS, canonicalize, lower_modules


def _canon_of(fn, modules=None):  # type: ignore[no-untyped-def]
    """Trace ``fn(x, y)`` and return the canonical form of its one call node."""
    g = fx.Graph()
    x, y = g.placeholder("x"), g.placeholder("y")
    node = fn(g, x, y)
    g.output(node)
    return canonicalize(node, modules), x, y


def _kw(canon, x, y):  # type: ignore[no-untyped-def]
    """kwargs with the placeholder nodes named (also inside a list), for comparison across graphs."""

    def name(v):  # type: ignore[no-untyped-def]
        if isinstance(v, (list, tuple)):
            return [name(e) for e in v]
        return "x" if v is x else "y" if v is y else v

    return {k: name(v) for k, v in canon.kwargs.items()}


EQUIVALENT = {
    "dropout": [
        lambda g, x, y: g.call_function(F.dropout, (x, 0.2, False)),
        lambda g, x, y: g.call_function(F.dropout, (x,), {"p": 0.2, "training": False}),
        lambda g, x, y: g.call_function(torch.dropout, (x, 0.2, False)),
        lambda g, x, y: g.call_function(torch.dropout, (x,), {"p": 0.2, "train": False}),
    ],
    "clamp": [
        lambda g, x, y: g.call_function(torch.clamp, (x, -1.0, 2.0)),
        lambda g, x, y: g.call_function(torch.clamp, (x,), {"min": -1.0, "max": 2.0}),
        lambda g, x, y: g.call_method("clamp", (x, -1.0), {"max": 2.0}),
        lambda g, x, y: g.call_function(torch.clip, (x, -1.0, 2.0)),
    ],
    "nan_to_num": [
        lambda g, x, y: g.call_function(torch.nan_to_num, (x, 1.0, 2.0, 3.0)),
        lambda g, x, y: g.call_method("nan_to_num", (x,), {"nan": 1.0, "posinf": 2.0, "neginf": 3.0}),
    ],
    "add": [
        lambda g, x, y: g.call_function(torch.add, (x, y), {"alpha": 1}),
        lambda g, x, y: g.call_function(torch.add, (x, y)),
        lambda g, x, y: g.call_function(operator.add, (x, y)),
        lambda g, x, y: g.call_method("add", (x, y)),
    ],
    "add_alpha": [
        lambda g, x, y: g.call_function(torch.add, (x, y), {"alpha": 3}),
        lambda g, x, y: g.call_method("add", (x, y), {"alpha": 3}),
    ],
    "relu": [
        lambda g, x, y: g.call_function(torch.relu, (x,)),
        lambda g, x, y: g.call_function(F.relu, (x,)),
        lambda g, x, y: g.call_function(F.relu, (x, False)),
        lambda g, x, y: g.call_method("relu", (x,)),
    ],
    "leaky_relu": [
        lambda g, x, y: g.call_function(F.leaky_relu, (x, 0.3)),
        lambda g, x, y: g.call_function(F.leaky_relu, (x,), {"negative_slope": 0.3, "inplace": False}),
    ],
    "layer_norm": [
        lambda g, x, y: g.call_function(F.layer_norm, (x, (4,), y, None, 1e-3)),
        lambda g, x, y: g.call_function(F.layer_norm, (x, (4,)), {"weight": y, "eps": 1e-3}),
        lambda g, x, y: g.call_function(torch.layer_norm, (x, (4,), y, None, 1e-3)),
    ],
    "split": [
        lambda g, x, y: g.call_function(torch.split, (x, 2, 1)),
        lambda g, x, y: g.call_function(torch.split, (x, 2), {"dim": 1}),
        lambda g, x, y: g.call_method("split", (x, 2, 1)),
        lambda g, x, y: g.call_method("split", (x,), {"split_size": 2, "dim": 1}),
        lambda g, x, y: g.call_function(torch.ops.aten.split.Tensor, (x, 2, 1)),
        lambda g, x, y: g.call_function(torch.ops.aten.split.Tensor, (x,), {"split_size": 2, "dim": 1}),
        lambda g, x, y: g.call_function(torch.ops.aten.split, (x, 2), {"dim": 1}),
    ],
    "split_sizes": [
        lambda g, x, y: g.call_function(torch.split, (x, [1, 3], 1)),
        lambda g, x, y: g.call_function(torch.ops.aten.split.sizes, (x, [1, 3], 1)),
        lambda g, x, y: g.call_function(torch.ops.aten.split_with_sizes.default, (x, [1, 3], 1)),
        lambda g, x, y: g.call_function(
            torch.ops.aten.split_with_sizes.default, (x,), {"split_sizes": [1, 3], "dim": 1}
        ),
    ],
    "chunk": [
        lambda g, x, y: g.call_function(torch.chunk, (x, 2, 1)),
        lambda g, x, y: g.call_function(torch.chunk, (x, 2), {"axis": 1}),
        lambda g, x, y: g.call_method("chunk", (x, 2), {"axis": 1}),
        lambda g, x, y: g.call_function(torch.ops.aten.chunk.default, (x, 2, 1)),
    ],
    "unbind": [
        lambda g, x, y: g.call_function(torch.unbind, (x, 1)),
        lambda g, x, y: g.call_function(torch.unbind, (x,), {"axis": 1}),
        lambda g, x, y: g.call_method("unbind", (x,), {"axis": 1}),
        lambda g, x, y: g.call_function(torch.ops.aten.unbind.int, (x, 1)),
        lambda g, x, y: g.call_function(torch.ops.aten.unbind.int, (x,), {"dim": 1}),
    ],
    "unbind_default_dim": [
        lambda g, x, y: g.call_function(torch.unbind, (x,)),
        lambda g, x, y: g.call_function(torch.ops.aten.unbind.int, (x,)),
        lambda g, x, y: g.call_function(torch.ops.aten.unbind, (x, 0)),
    ],
    "cat": [
        lambda g, x, y: g.call_function(torch.cat, ([x, y], 1)),
        lambda g, x, y: g.call_function(torch.cat, ([x, y],), {"axis": 1}),
        lambda g, x, y: g.call_function(torch.concat, ([x, y],), {"axis": 1}),
        lambda g, x, y: g.call_function(torch.ops.aten.cat.default, ([x, y], 1)),
        lambda g, x, y: g.call_function(torch.ops.aten.concat.default, ([x, y],), {"dim": 1}),
    ],
    "cat_default_dim": [
        lambda g, x, y: g.call_function(torch.cat, ([x, y],)),
        lambda g, x, y: g.call_function(torch.ops.aten.cat.default, ([x, y],)),
        lambda g, x, y: g.call_function(torch.ops.aten.concatenate.default, ([x, y], 0)),
    ],
    "stack": [
        lambda g, x, y: g.call_function(torch.stack, ([x, y], 1)),
        lambda g, x, y: g.call_function(torch.stack, ([x, y],), {"axis": 1}),
        lambda g, x, y: g.call_function(torch.ops.aten.stack.default, ([x, y], 1)),
        lambda g, x, y: g.call_function(torch.ops.aten.stack, ([x, y],), {"dim": 1}),
    ],
    "view": [
        lambda g, x, y: g.call_method("view", (x, 2, 3)),
        lambda g, x, y: g.call_method("view", (x, (2, 3))),
    ],
    "floordiv": [
        lambda g, x, y: g.call_function(operator.floordiv, (x, y)),
        lambda g, x, y: g.call_function(torch.div, (x, y), {"rounding_mode": "floor"}),
    ],
}


@pytest.mark.parametrize("name", sorted(EQUIVALENT))
def test_all_call_forms_normalize_identically(name: str) -> None:
    forms = [_canon_of(fn) for fn in EQUIVALENT[name]]
    assert all(c is not None for c, _, _ in forms)
    first = _kw(*forms[0])
    for canon, x, y in forms[1:]:
        assert canon.op == forms[0][0].op
        assert _kw(canon, x, y) == first


def test_positional_settings_are_never_lost() -> None:
    canon, _, _ = _canon_of(lambda g, x, y: g.call_function(F.dropout, (x, 0.7, False, False)))
    assert (canon["p"], canon["training"], canon["inplace"]) == (0.7, False, False)
    canon, _, _ = _canon_of(lambda g, x, y: g.call_function(torch.clamp, (x, -0.5)))
    assert (canon["min"], canon["max"]) == (-0.5, None)
    canon, _, _ = _canon_of(lambda g, x, y: g.call_function(F.hardtanh, (x, -2.0, 3.0)))
    assert (canon["min_val"], canon["max_val"]) == (-2.0, 3.0)


def test_every_op_default_is_filled() -> None:
    canon, _, _ = _canon_of(lambda g, x, y: g.call_function(F.gelu, (x,)))
    assert canon.kwargs == {"input": canon["input"], "approximate": "none"}
    assert set(canon.kwargs) == {name for name, _ in OPS["gelu"]}


def test_inplace_forms_are_marked() -> None:
    for fn in (
        lambda g, x, y: g.call_method("add_", (x, y)),
        lambda g, x, y: g.call_function(operator.iadd, (x, y)),
        lambda g, x, y: g.call_function(F.relu, (x,), {"inplace": True}),
        lambda g, x, y: g.call_function(torch.relu_, (x,)),
    ):
        canon, _, _ = _canon_of(fn)
        assert canon is not None and canon.inplace


def test_unknown_calls_normalize_to_none() -> None:
    assert _canon_of(lambda g, x, y: g.call_function(torch.logsumexp, (x, 1)))[0] is None
    assert _canon_of(lambda g, x, y: g.call_method("frobnicate", (x,)))[0] is None
    # an unknown keyword: not a call we understand (never guess)
    assert _canon_of(lambda g, x, y: g.call_function(torch.tanh, (x,), {"bogus": 1}))[0] is None
    # the dispatcher takes no axis= for ATen overloads, and out= writes: neither is bound
    assert (
        _canon_of(lambda g, x, y: g.call_function(torch.ops.aten.cat.default, ([x, y],), {"axis": 1}))[0]
        is None
    )
    assert _canon_of(lambda g, x, y: g.call_function(torch.ops.aten.unbind.int, (x,), {"axis": 1}))[0] is None
    assert _canon_of(lambda g, x, y: g.call_function(torch.cat, ([x, y],), {"out": y}))[0] is None
    assert (
        _canon_of(lambda g, x, y: g.call_function(torch.ops.aten.cat.out, ([x, y], 0), {"out": y}))[0] is None
    )
    # both names at once is an error in eager too
    assert (
        _canon_of(lambda g, x, y: g.call_function(torch.stack, ([x, y],), {"axis": 1, "dim": 1}))[0] is None
    )


def test_modules_normalize_and_lower() -> None:
    class M(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.act = nn.LeakyReLU(0.1)
            self.drop = nn.Dropout(0.3)
            self.lin = nn.Linear(4, 4)
            self.norm = nn.LayerNorm(4, eps=1e-3)

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return self.drop(self.act(self.norm(self.lin(x))))

    gm = fx.symbolic_trace(M().eval())
    modules = dict(gm.named_modules())
    acts = [canonicalize(n, modules) for n in gm.graph.nodes if n.op == "call_module"]
    by_op = {c.op: c for c in acts if c is not None}
    assert by_op["leaky_relu"]["negative_slope"] == 0.1
    assert by_op["dropout"]["p"] == 0.3 and by_op["dropout"]["training"] is False
    assert lower_modules(gm) == 2
    gm.recompile()
    ops = [canonicalize(n).op for n in gm.graph.nodes if n.op == "call_function"]
    assert ops == ["linear", "layer_norm"]
    lowered = [canonicalize(n) for n in gm.graph.nodes if n.op == "call_function"]
    assert lowered[1]["eps"] == 1e-3
