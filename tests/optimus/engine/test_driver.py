"""The greedy driver: determinism, stop reasons, cost-model declines, rollback and verify."""

from __future__ import annotations

import logging
from collections.abc import Sequence

import pytest
import torch
from optimus_helpers import LAUNCH_BOUND, Fn, assert_parity, optimize_traced
from torch import fx

import optimus
from models.synthetic_towers import Towers
from optimus.engine.rule import Cost, HorizontalRule
from optimus.report import StopKind, StopReason
from optimus.rules import REGISTRY


def towers_traced(n: int = 8) -> tuple[torch.nn.Module, list[torch.Tensor]]:
    torch.manual_seed(0)
    return Towers(n, 8, 8, slices="narrow"), [torch.randn(4, n * 8)]


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
    assert rep.stop_reason == StopReason.saturated()
    assert rep.rules_fired["batch_linear"] == 1 and rep.rules_fired["batch_layer_norm"] == 1
    assert rep.nodes_before == 67 and rep.nodes_after == len(gm.graph.nodes)
    assert rep.seconds > 0
    assert set(rep.as_dict()) >= {"rules_fired", "nodes_before", "nodes_after", "seconds", "stop_reason"}
    assert_parity(mod, gm, xs)


@pytest.mark.parametrize(
    ("config", "reason", "printed"),
    [
        ({"max_iterations": 1}, StopReason(StopKind.ITERATION_LIMIT, 1), "iteration_limit(limit=1)"),
        ({"time_limit_s": 1e-9}, StopReason(StopKind.TIME_LIMIT, 1e-9), "time_limit(limit_s=1e-09)"),
        ({"max_nodes": 5}, StopReason(StopKind.NODE_LIMIT, 5), "node_limit(limit=5)"),
    ],
)
def test_limits_stop_the_driver(config: dict, reason: StopReason, printed: str) -> None:
    """The stop reason names the limit hit and carries its value; as_dict() prints it."""
    mod, xs = towers_traced()
    cfg = optimus.OptimusConfig(cost_model=LAUNCH_BOUND, **config)
    gm = optimus.optimize(fx.symbolic_trace(mod), xs, config=cfg)
    assert gm.optimus_report.stop_reason == reason
    assert gm.optimus_report.as_dict()["stop_reason"] == printed
    assert_parity(mod, gm, xs)


def test_stop_reason_refuses_a_missing_or_stray_limit() -> None:
    with pytest.raises(ValueError, match="limit"):
        StopReason(StopKind.TIME_LIMIT)
    with pytest.raises(ValueError, match="limit"):
        StopReason(StopKind.SATURATED, 3)


def test_rounds_record_applied_rules_and_times() -> None:
    """One record per round: what each rule applied (summing to rules_fired), and match / apply
    times that are measured, not left at zero; the last round applied nothing (saturated)."""
    mod, xs = towers_traced()
    gm = optimize_traced(mod, xs)
    rep = gm.optimus_report
    assert len(rep.rounds) == rep.iterations >= 2
    assert [r.round for r in rep.rounds] == list(range(rep.iterations))
    total: dict[str, int] = {}
    for r in rep.rounds:
        for rule, n in r.applied.items():
            total[rule] = total.get(rule, 0) + n
    assert total == rep.rules_fired
    assert rep.rounds[0].applied and not rep.rounds[-1].applied
    assert all(r.match_s > 0 and r.apply_s > 0 for r in rep.rounds)
    assert sum(r.match_s + r.apply_s for r in rep.rounds) <= rep.seconds
    rounds = rep.as_dict()["rounds"]
    assert rounds[0] == {
        "round": 0,
        "applied": rep.rounds[0].applied,
        "match_s": rep.rounds[0].match_s,
        "apply_s": rep.rounds[0].apply_s,
    }


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
    assert gm.optimus_report.stop_reason == StopReason.saturated()
    assert gm.optimus_report.notes == ["unchanged: no rule found a candidate in this graph"]
    torch.testing.assert_close(gm(*xs), mod(*xs))
