"""The LocalRule interface (what the split/cat rules build on), exercised with two toy rules:
one replaces a node by an existing value, one by new nodes made with the builder."""

from __future__ import annotations

import operator
from typing import Any

import pytest
import torch
from optimus_helpers import Fn, assert_parity, optimize_traced
from torch import fx

from optimus.rules import REGISTRY
from optimus.rules.base import Cost, LocalRule


class MulByOne(LocalRule):
    """x * 1.0 -> x, when the product is not in place."""

    name = "test_mul_by_one"

    def match_node(self, node: fx.Node, ctx: Any) -> Any:
        canon = ctx.canon(node)
        if canon is None or canon.op != "mul" or canon.inplace or canon["other"] != 1.0:
            return None
        x = canon["input"]
        meta, out = ctx.meta(x), ctx.meta(node)
        return x if meta is not None and out is not None and meta == out else None

    def rewrite(self, node: fx.Node, payload: Any, b: Any) -> fx.Node:
        return payload


class CatOfSplit(LocalRule):
    """cat(split(x, s, d), d) -> x * 1.0 (a new node built with the builder), consuming the split."""

    name = "test_cat_of_split"

    def match_node(self, node: fx.Node, ctx: Any) -> Any:
        canon = ctx.canon(node)
        if canon is None or canon.op != "cat":
            return None
        whole = canon["tensors"]
        if isinstance(whole, fx.Node):  # cat(split(x)) as symbolic_trace records it
            sc = ctx.canon(whole)
            ok = sc is not None and sc.op == "split" and sc["dim"] == canon["dim"] and len(whole.users) == 1
            return whole if ok else None
        if not isinstance(whole, (list, tuple)):
            return None
        parts = list(whole)
        first = parts[0]
        if not (isinstance(first, fx.Node) and first.target is operator.getitem):
            return None
        split = first.args[0]
        sc = ctx.canon(split)
        if sc is None or sc.op != "split" or sc["dim"] != canon["dim"]:
            return None
        if [p.args for p in parts] != [(split, i) for i in range(len(parts))] or len(split.users) != len(
            parts
        ):
            return None
        return split

    def consumed(self, node: fx.Node, payload: Any) -> tuple[fx.Node, ...]:
        return (payload,)

    def rewrite(self, node: fx.Node, payload: Any, b: Any) -> fx.Node:
        return b.call(operator.mul, b.ctx.canon(payload)["input"], 1.0)

    def cost(self, node: fx.Node, payload: Any, ctx: Any) -> tuple[Cost, Cost]:
        return Cost(launches=2), Cost(launches=1)


@pytest.fixture
def local_rules(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(REGISTRY, MulByOne.name, MulByOne)
    monkeypatch.setitem(REGISTRY, CatOfSplit.name, CatOfSplit)


def test_local_rule_replacing_with_an_existing_value(local_rules: None) -> None:
    mod = Fn(lambda self, x: torch.tanh(x * 1.0) + (x * 2.0) * 1.0)
    xs = [torch.randn(4, 8)]
    gm = optimize_traced(mod, xs, rules=[MulByOne.name])
    assert gm.optimus_report.rules_fired == {MulByOne.name: 2}
    assert sum(1 for n in gm.graph.nodes if n.target is operator.mul) == 1  # only x * 2.0 is left
    assert_parity(mod, gm, xs)


def test_local_rule_with_new_nodes_then_a_second_round(local_rules: None) -> None:
    """Round 1 turns cat(split(x)) into x * 1.0 (and erases the split); round 2 removes * 1.0."""
    mod = Fn(lambda self, x: torch.relu(torch.cat(torch.split(x, 4, 1), 1)))
    gm = optimize_traced(mod, [torch.randn(3, 12)], rules=[CatOfSplit.name, MulByOne.name])
    assert gm.optimus_report.rules_fired == {CatOfSplit.name: 1, MulByOne.name: 1}
    assert gm.optimus_report.iterations >= 2
    targets = [n.target for n in gm.graph.nodes if n.op == "call_function"]
    assert targets == [torch.relu]
    assert_parity(mod, gm, [torch.randn(3, 12)])


def test_local_rule_leaves_mutated_values_alone(local_rules: None) -> None:
    def f(self, x):  # type: ignore[no-untyped-def]
        y = x * 2.0
        z = y * 1.0
        y.add_(1.0)
        return z

    mod = Fn(f)
    xs = [torch.randn(4, 8)]
    gm = optimize_traced(mod, xs, rules=[MulByOne.name])
    assert gm.optimus_report.rules_fired == {}
    assert_parity(mod, gm, xs)


def test_local_rule_on_the_dynamo_form_consumes_the_split(local_rules: None) -> None:
    """cat([split(x)[0], split(x)[1], split(x)[2]]) as Dynamo records it; the getitems and the
    split die with the cat."""
    import optimus

    g = fx.Graph()
    x = g.placeholder("x")
    split = g.call_function(torch.split, (x, 4), {"dim": 1})
    parts = [g.call_function(operator.getitem, (split, i)) for i in range(3)]
    g.output(g.call_function(torch.relu, (g.call_function(torch.cat, (parts, 1)),)))
    gm0 = fx.GraphModule(torch.nn.Module(), g)
    xs = (torch.randn(3, 12),)
    gm = optimus.optimize(gm0, xs, rules=[CatOfSplit.name])
    assert gm.optimus_report.rules_fired == {CatOfSplit.name: 1}
    assert [n.target for n in gm.graph.nodes if n.op == "call_function"] == [operator.mul, torch.relu]
    torch.testing.assert_close(gm(*xs), gm0(*xs))
