"""Shared pieces of the split/cat rule tests: run one rule on a traced function, count ops by
their canonical name (whatever call form they take), check forward+backward parity."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch
from optimus_helpers import LAUNCH_BOUND, Fn, assert_parity
from torch import fx, nn

import optimus
from optimus.semantics.normalize import canonicalize

FAMILY = [
    "normalize_split_cat",
    "split_cat",
    "cat_split",
    "merge_splits",
    "flatten_cats",
    "noop_split_cat",
    "stack_unbind",
    "unbind_cat",
    "stack_pieces",
]


class _Fn3(nn.Module):
    def __init__(self, fn: Any) -> None:
        super().__init__()
        self.fn = fn

    def forward(self, x: Any, y: Any, z: Any) -> Any:
        return self.fn(self, x, y, z)


def module_of(fn: Any) -> nn.Module:
    return _Fn3(fn) if fn.__code__.co_argcount == 4 else Fn(fn)


def run(fn: Any, inputs: Sequence[torch.Tensor], rules: Sequence[str], **kw: Any) -> fx.GraphModule:
    """symbolic_trace ``fn(self, *inputs)`` (or a module), optimize with ``rules`` (launch-bound cost model unless
    given), check forward and backward parity against the function itself, return the graph."""
    mod = fn if isinstance(fn, nn.Module) else module_of(fn)
    kw.setdefault("cost_model", LAUNCH_BOUND)
    gm = optimus.optimize(fx.symbolic_trace(mod), tuple(inputs), rules=list(rules), **kw)
    assert_parity(mod, gm, inputs)
    assert gm.optimus_report.rolled_back == {}, gm.optimus_report.rolled_back
    return gm


def op_name(node: fx.Node) -> str | None:
    """Canonical op of a call (split forms the engine table lacks are named by their target)."""
    if node.op not in ("call_function", "call_method"):
        return None
    canon = canonicalize(node)
    if canon is not None:
        return canon.op
    name = node.target if isinstance(node.target, str) else getattr(node.target, "__name__", "")
    return {"tensor_split": "split", "split_with_sizes": "split"}.get(name, name)


def ops(gm: fx.GraphModule, name: str) -> int:
    """How many calls of canonical op ``name`` (e.g. "split", "cat", "narrow") the graph holds."""
    return sum(1 for n in gm.graph.nodes if op_name(n) == name)


def fired(gm: fx.GraphModule, rule: str) -> int:
    return gm.optimus_report.rules_fired.get(rule, 0)
