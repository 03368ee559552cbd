"""dce and cse: what they remove, and what they must keep."""

from __future__ import annotations

import operator

import torch
import torch.nn.functional as F
from optimus_helpers import Fn, assert_parity, count_calls, optimize_traced
from torch import fx


def test_dce_removes_unused_pure_nodes() -> None:
    def f(self, x):  # type: ignore[no-untyped-def]
        _unused = torch.tanh(x) * 3.0
        return torch.relu(x)

    mod = Fn(f)
    xs = [torch.randn(4, 8)]
    gm = optimize_traced(mod, xs, rules=["dce"])
    assert gm.optimus_report.rules_fired == {"dce": 2}
    assert count_calls(gm, torch.tanh) == 0
    assert_parity(mod, gm, xs)


def test_dce_keeps_in_place_ops() -> None:
    def f(self, x):  # type: ignore[no-untyped-def]
        y = x * 1.0
        y.add_(1.0)  # no user, but it changes y
        return y

    mod = Fn(f)
    xs = [torch.randn(4, 8)]
    gm = optimize_traced(mod, xs, rules=["dce"])
    assert gm.optimus_report.rules_fired == {}
    assert_parity(mod, gm, xs)


def test_cse_merges_all_call_forms() -> None:
    def f(self, x):  # type: ignore[no-untyped-def]
        return torch.relu(x) + F.relu(x, False) + x.relu() + F.relu(x, inplace=False)

    mod = Fn(f)
    xs = [torch.randn(4, 8)]
    gm = optimize_traced(mod, xs, rules=["cse"])
    assert gm.optimus_report.rules_fired == {"cse": 3}
    relus = [
        n for n in gm.graph.nodes if n.op in ("call_function", "call_method") and "relu" in str(n.target)
    ]
    assert len(relus) == 1
    assert_parity(mod, gm, xs)


def test_cse_keeps_different_settings_and_random_ops() -> None:
    def f(self, x):  # type: ignore[no-untyped-def]
        a = torch.clamp(x, -1.0, 1.0) + torch.clamp(x, -1.0, 2.0)  # different max: both stay
        b = F.dropout(x, 0.5, True) + F.dropout(x, 0.5, True)  # random: both stay
        return a, b

    mod = Fn(f)
    xs = [torch.randn(4, 8)]
    gm = optimize_traced(mod, xs, rules=["cse"])
    assert gm.optimus_report.rules_fired == {}
    assert count_calls(gm, torch.clamp) == 2
    assert count_calls(gm, F.dropout) == 2
    torch.manual_seed(0)
    expected = mod(*xs)
    torch.manual_seed(0)
    got = gm(*xs)
    torch.testing.assert_close(got, expected)


def test_cse_does_not_merge_reads_around_a_mutation() -> None:
    def f(self, x):  # type: ignore[no-untyped-def]
        y = x * 1.0
        a = y + 1.0
        y.mul_(2.0)
        b = y + 1.0  # same expression, different value
        return a, b

    mod = Fn(f)
    xs = [torch.randn(4, 8)]
    gm = optimize_traced(mod, xs, rules=["cse"])
    assert gm.optimus_report.rules_fired == {}
    assert count_calls(gm, operator.add) == 2
    assert_parity(mod, gm, xs)


def test_cleanup_on_a_graph_with_unknown_ops() -> None:
    g = fx.Graph()
    x = g.placeholder("x")
    a = g.call_function(torch.logsumexp, (x, 1))
    b = g.call_function(torch.logsumexp, (x, 1))
    g.output(g.call_function(operator.add, (a, b)))
    gm = fx.GraphModule(torch.nn.Module(), g)
    out = optimize_traced.__globals__["optimus"].optimize(gm, (torch.randn(3, 4),), rules=["cse", "dce"])
    assert out.optimus_report.rules_fired == {"cse": 1}
    torch.testing.assert_close(out(torch.ones(3, 4)), gm(torch.ones(3, 4)))
