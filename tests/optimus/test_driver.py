"""The greedy driver: determinism, stop reasons, cost-model declines, rollback and verify."""

from __future__ import annotations

import logging
from collections.abc import Sequence

import pytest
import torch
from optimus_helpers import LAUNCH_BOUND, Fn, assert_parity, optimize_traced
from optimus_models import SlicedTowers
from torch import fx

import optimus
from optimus.rules import REGISTRY
from optimus.rules.base import Cost, HorizontalRule


def towers_traced(n: int = 8) -> tuple[torch.nn.Module, list[torch.Tensor]]:
    torch.manual_seed(0)
    return SlicedTowers(n, 8, 8), [torch.randn(4, n * 8)]


def test_deterministic() -> None:
    mod, xs = towers_traced()
    a = optimize_traced(mod, xs)
    b = optimize_traced(mod, xs)
    assert a.code == b.code
    assert a.optimus_report.rules_fired == b.optimus_report.rules_fired


def test_saturates_and_reports() -> None:
    mod, xs = towers_traced()
    gm = optimize_traced(mod, xs)
    rep = gm.optimus_report
    assert rep.stop_reason == "saturated"
    assert rep.rules_fired["batch_linear"] == 1 and rep.rules_fired["batch_layer_norm"] == 1
    assert rep.nodes_before == 67 and rep.nodes_after == len(gm.graph.nodes)
    assert rep.seconds > 0
    assert set(rep.as_dict()) >= {"rules_fired", "nodes_before", "nodes_after", "seconds", "stop_reason"}
    assert_parity(mod, gm, xs)


@pytest.mark.parametrize(
    ("config", "reason"),
    [
        ({"max_iterations": 1}, "iteration_limit"),
        ({"time_limit_s": 1e-9}, "time_limit"),
        ({"max_nodes": 5}, "node_limit"),
    ],
)
def test_limits_stop_the_driver(config: dict, reason: str) -> None:
    mod, xs = towers_traced()
    cfg = optimus.OptimusConfig(cost_model=LAUNCH_BOUND, **config)
    gm = optimus.optimize(fx.symbolic_trace(mod), xs, config=cfg)
    assert gm.optimus_report.stop_reason == reason
    assert_parity(mod, gm, xs)


class Pessimist:
    """Rates every rewrite slower than what it replaces."""

    min_group, max_group = 2, 64

    def seconds(self, cost: Cost, device: torch.device) -> float:
        return -cost.launches


def test_cost_model_declines_slower_rewrites() -> None:
    mod, xs = towers_traced()
    gm = optimize_traced(mod, xs, cost_model=Pessimist())
    rep = gm.optimus_report
    assert rep.rules_fired == {}
    assert rep.declined["batch_linear"] >= 1 and rep.declined["batch_layer_norm"] >= 1
    assert any(note.startswith("unchanged: the cost model") for note in rep.notes)
    assert_parity(mod, gm, xs)


def test_group_size_bounds_are_configurable() -> None:
    mod, xs = towers_traced(12)
    gm = optimize_traced(
        mod,
        xs,
        rules=["batch_linear"],
        cost_model=optimus.AnalyticCostModel(cpu=LAUNCH_BOUND.cpu, min_group=2, max_group=6),
    )
    assert gm.optimus_report.rules_fired == {"batch_linear": 2}  # 12 linears -> two groups of 6
    assert_parity(mod, gm, xs)
    gm = optimize_traced(
        mod,
        xs,
        rules=["batch_linear"],
        cost_model=optimus.AnalyticCostModel(cpu=LAUNCH_BOUND.cpu, min_group=13),
    )
    assert gm.optimus_report.rules_fired == {}
    with pytest.raises(ValueError, match="max_group"):
        optimus.AnalyticCostModel(min_group=4, max_group=3)


class Raises(HorizontalRule):
    name = "test_raises"

    def key(self, node, ctx):  # type: ignore[no-untyped-def]
        canon = ctx.canon(node)
        return "tanh" if canon is not None and canon.op == "tanh" else None

    def fuse(self, nodes: Sequence[fx.Node], b) -> Sequence[fx.Node]:  # type: ignore[no-untyped-def]
        b.call(torch.stack, [b.ctx.canon(n)["input"] for n in nodes])  # builds something, then fails
        raise RuntimeError("boom")

    def cost(self, nodes, ctx):  # type: ignore[no-untyped-def]
        return Cost(launches=len(nodes)), Cost(launches=1)


class Wrong(Raises):
    """Replaces tanh by sigmoid: a rewrite that changes results."""

    name = "test_wrong"

    def fuse(self, nodes: Sequence[fx.Node], b) -> Sequence[fx.Node]:  # type: ignore[no-untyped-def]
        x = b.stack([b.ctx.canon(n)["input"] for n in nodes])
        return b.unbind(b.call(torch.sigmoid, x), len(nodes))


@pytest.fixture
def extra_rules(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(REGISTRY, "test_raises", Raises)
    monkeypatch.setitem(REGISTRY, "test_wrong", Wrong)


def test_rule_that_raises_is_rolled_back_and_logged(
    extra_rules: None, caplog: pytest.LogCaptureFixture
) -> None:
    mod, xs = towers_traced()
    with caplog.at_level(logging.WARNING, logger="optimus"):
        gm = optimize_traced(mod, xs, rules=["test_raises", "batch_linear"])
    rep = gm.optimus_report
    assert rep.rolled_back == {"test_raises": 1}
    assert rep.rules_fired == {"batch_linear": 1}  # the rest still ran
    assert any("test_raises" in r.getMessage() and "boom" in r.getMessage() for r in caplog.records)
    assert not any(
        n.target is torch.stack and n.args[0][0].target is torch.tanh
        for n in gm.graph.nodes
        if n.op == "call_function" and isinstance(n.args[0], list)
    )
    assert_parity(mod, gm, xs)


def test_verify_rolls_back_a_rewrite_that_changes_results(
    extra_rules: None, caplog: pytest.LogCaptureFixture
) -> None:
    mod, xs = towers_traced()
    bad = optimize_traced(mod, xs, rules=["test_wrong"])
    assert bad.optimus_report.rules_fired == {"test_wrong": 1}
    assert not torch.allclose(bad(*xs), mod(*xs))  # without verify the wrong rule goes through
    with caplog.at_level(logging.WARNING, logger="optimus"):
        gm = optimize_traced(mod, xs, rules=["test_wrong", "batch_linear"], verify=True)
    rep = gm.optimus_report
    assert rep.rolled_back == {"test_wrong": 1}
    assert rep.rules_fired == {"batch_linear": 1}
    assert any("changed results" in r.getMessage() for r in caplog.records)
    assert_parity(mod, gm, xs)


def test_unknown_ops_come_back_unchanged() -> None:
    mod = Fn(lambda self, x: torch.logsumexp(torch.fft.fft(x).abs(), 1))
    xs = [torch.randn(4, 8)]
    gm = optimize_traced(mod, xs)
    assert gm.optimus_report.rules_fired == {}
    assert gm.optimus_report.stop_reason == "saturated"
    assert gm.optimus_report.notes == ["unchanged: no rule found a candidate in this graph"]
    torch.testing.assert_close(gm(*xs), mod(*xs))
