"""Memory is a cost: the live-bytes estimate, each horizontal rule's pricing of what its rewrite
keeps alive at once, the driver's margin and budget declines, config validation, and forward and
backward parity of the groups that still fuse."""

from __future__ import annotations

import math

import pytest
import torch
from optimus_helpers import assert_parity, optimize_traced, traced_context
from torch import fx, nn

import optimus
from optimus.cost.price import Cost
from optimus.engine.candidate import Candidate
from optimus.memory.live import estimate, horizontal_live
from optimus.rules import REGISTRY

B, N, G = 8, 16, 6
NBYTES = B * N * 4  # one float32 [B, N] tensor


class Chain(nn.Module):
    """x -> relu -> *2 -> +1: each intermediate dies at its one reader."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return (torch.relu(x) * 2) + 1


class Towers(nn.Module):
    """G towers relu(x[i]) -> sum(0), computed one after another (eager's order): one member
    output alive at a time; summed results are [N], small."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.stack([torch.relu(x[i]).sum(0) for i in range(G)])


class WideEnd(nn.Module):
    """Towers whose results meet in a big matmul at the end: the graph's peak is there, so a
    batched group that fits under it raises nothing."""

    def __init__(self) -> None:
        super().__init__()
        self.lin = nn.ModuleList(nn.Linear(N, N) for _ in range(G))
        self.big = nn.Linear(G * N, 64 * G * N)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        outs = [torch.relu(lin(x[i])) for i, lin in enumerate(self.lin)]
        return self.big(torch.cat(outs, 1)).sum(1)


def _towers_inputs() -> tuple[torch.Tensor, ...]:
    """One [G, B, N] input; member i reads the view x[i], so a stack of them is a copy."""
    return (torch.randn(G, B, N, generator=torch.Generator().manual_seed(0)),)


def test_estimate_of_a_chain_is_known_by_construction() -> None:
    ctx = traced_context(Chain(), (torch.randn(B, N),))
    est = ctx.live
    by_name = {n.name: n for n in ctx.index.nodes}
    # while relu runs: x and relu's output; while mul runs: x, relu (its reader) and mul; ...
    assert est.at(by_name["relu"]) == 2 * NBYTES
    assert est.at(by_name["mul"]) == 3 * NBYTES
    assert est.at(by_name["add"]) == 3 * NBYTES  # relu died at mul
    assert est.peak == 3 * NBYTES


def test_views_keep_their_base_alive() -> None:
    class Viewed(nn.Module):
        def forward(self, x: torch.Tensor) -> torch.Tensor:
            y = torch.relu(x)
            v = y.view(-1)
            z = torch.sigmoid(x)
            return z.sum() + v.sum()

    ctx = traced_context(Viewed(), (torch.randn(B, N),))
    by_name = {n.name: n for n in ctx.index.nodes}
    # y is read through its view after sigmoid: x, y and z are alive together
    assert ctx.live.at(by_name["sigmoid"]) == 3 * NBYTES


def test_horizontal_pricing_known_by_construction() -> None:
    """G relus over separate inputs: one output alive at a time before; after, the stacked copy
    of the G inputs and the G outputs together."""
    ctx = traced_context(Towers(), _towers_inputs())
    (cand,) = [c for c in REGISTRY["batch_unary"]().match(ctx) if len(c.nodes) == G]
    assert cand.before.live_bytes == NBYTES
    assert cand.after.live_bytes == 2 * G * NBYTES  # stacked inputs + stacked outputs
    assert cand.live_delta == (2 * G - 1) * NBYTES
    held, holds = horizontal_live(cand.nodes, ctx.live)  # the default hook: outputs only
    assert (held, holds) == (NBYTES, G * NBYTES)


def test_members_alive_together_add_nothing_for_their_outputs() -> None:
    """When every member output is alive at once already (all read by one cat), batching them
    adds only the stacked copy of the inputs."""

    class AllAlive(nn.Module):
        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return torch.cat([torch.relu(x[i]) for i in range(G)], 1)

    ctx = traced_context(AllAlive(), _towers_inputs())
    (cand,) = [c for c in REGISTRY["batch_unary"]().match(ctx) if len(c.nodes) == G]
    assert cand.before.live_bytes == G * NBYTES
    assert cand.live_delta == G * NBYTES


def test_cost_and_candidate_arithmetic() -> None:
    a, b = Cost(1, 2, 3, live_bytes=4), Cost(10, 20, 30, live_bytes=40)
    assert (a + b).live_bytes == 44
    cand = Candidate("r", (), before=a, after=b)
    assert cand.live_delta == 36


def _fired(gm: fx.GraphModule, rule: str) -> int:
    return gm.optimus_report.rules_fired.get(rule, 0)


def test_margin_declines_a_rewrite_that_raises_the_peak() -> None:
    inputs = _towers_inputs()
    ctx = traced_context(Towers(), inputs)
    (cand,) = [c for c in REGISTRY["batch_unary"]().match(ctx) if len(c.nodes) == G]
    assert cand.live_delta > 0
    keep = optimize_traced(Towers(), inputs, config=optimus.OptimusConfig(memory_margin=0.0))
    assert _fired(keep, "batch_unary") == 1
    strict = optimize_traced(Towers(), inputs, config=optimus.OptimusConfig(memory_margin=1.0))
    report = strict.optimus_report
    assert _fired(strict, "batch_unary") == 0
    assert report.declined_reasons["batch_unary: raises peak memory, gain within memory_margin"] >= 1
    assert report.live_peak_after <= report.live_peak_before
    assert_parity(Towers(), strict, inputs)


def test_budget_declines_even_a_rewrite_that_pays() -> None:
    inputs = _towers_inputs()
    base = optimize_traced(Towers(), inputs, config=optimus.OptimusConfig(memory_margin=0.0))
    peak = base.optimus_report.live_peak_before
    assert base.optimus_report.live_peak_after > peak  # the fused form holds more at once
    budget = int(peak)  # the graph as captured fits; the fused form does not
    gm = optimize_traced(
        Towers(), inputs, config=optimus.OptimusConfig(memory_margin=0.0, memory_budget_bytes=budget)
    )
    report = gm.optimus_report
    assert _fired(gm, "batch_unary") == 0
    assert report.declined_reasons["batch_unary: over memory_budget_bytes"] >= 1
    assert report.live_peak_after <= budget
    roomy = optimize_traced(
        Towers(),
        inputs,
        config=optimus.OptimusConfig(memory_margin=0.0, memory_budget_bytes=int(10 * peak)),
    )
    assert _fired(roomy, "batch_unary") == 1
    assert_parity(Towers(), gm, inputs)
    assert_parity(Towers(), roomy, inputs)


def test_group_under_the_peak_still_fuses_with_parity() -> None:
    """With the strictest margin, the towers of WideEnd still batch (their stacked buffers fit
    under the big matmul's peak), forward and backward match eager."""
    torch.manual_seed(0)
    module = WideEnd()
    inputs = _towers_inputs()
    gm = optimize_traced(module, inputs, config=optimus.OptimusConfig(memory_margin=1.0))
    report = gm.optimus_report
    assert _fired(gm, "batch_linear") == 1
    assert report.live_peak_after <= report.live_peak_before
    assert not any("memory" in r for r in report.declined_reasons)
    assert_parity(module, gm, inputs)


@pytest.mark.parametrize(
    ("field", "value"),
    [
        ("memory_margin", -0.1),
        ("memory_margin", math.nan),
        ("memory_margin", math.inf),
        ("memory_margin", True),
        ("memory_margin", "0.5"),
        ("memory_budget_bytes", 0),
        ("memory_budget_bytes", 1.5),
        ("memory_budget_bytes", True),
    ],
)
def test_config_rejects_bad_memory_values(field: str, value: object) -> None:
    with pytest.raises(ValueError, match=field):
        optimus.OptimusConfig(**{field: value})


def test_config_memory_fields_reach_the_fingerprint() -> None:
    base = optimus.OptimusConfig()
    assert base.fingerprint() != base.with_(memory_margin=base.memory_margin + 1).fingerprint()
    assert base.fingerprint() != base.with_(memory_budget_bytes=1 << 20).fingerprint()


def test_estimate_is_linear_in_graph_size() -> None:
    """The estimate walks each node and edge once: its curve has one entry per node."""
    ctx = traced_context(Towers(), _towers_inputs())
    est = estimate(ctx.index.nodes, ctx.index.canons)
    assert len(est.live) == len(ctx.index.nodes)
    assert est.peak == ctx.live.peak


class _RuleTowers(nn.Module):
    """G towers ``op_i(x[i]).sum(0)`` run one after another: each rule's group of G members
    lifts the graph's estimated peak (G outputs and a stacked copy where one output was)."""

    def __init__(self, rule: str) -> None:
        super().__init__()
        self.rule = rule
        self.lin = nn.ModuleList(nn.Linear(N, N) for _ in range(G))
        self.w = nn.ParameterList(nn.Parameter(torch.rand(N) + 0.5) for _ in range(G))
        self.b = nn.ParameterList(nn.Parameter(torch.randn(N)) for _ in range(G))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        outs = []
        for i in range(G):
            if self.rule == "batch_linear":
                y = self.lin[i](x[i])
            elif self.rule == "batch_layer_norm":
                y = nn.functional.layer_norm(x[i], (N,), self.w[i], self.b[i])
            elif self.rule == "batch_binary":
                y = x[i] * x[(i + 1) % G]
            else:
                y = torch.relu(x[i])
            outs.append(y.sum(0))
        return torch.stack(outs)


@pytest.mark.parametrize("rule", ["batch_linear", "batch_layer_norm", "batch_unary", "batch_binary"])
def test_each_priced_rule_fuses_or_is_declined_by_margin_and_budget(rule: str) -> None:
    """Per rule: taken when the gate is off, declined by the margin, declined by a budget; the
    result matches eager forward and backward every time."""
    torch.manual_seed(0)
    module = _RuleTowers(rule)
    inputs = _towers_inputs()

    def run(**memory: object) -> fx.GraphModule:
        return optimize_traced(module, inputs, config=optimus.OptimusConfig(rules=(rule,), **memory))

    fused = run(memory_margin=0.0)
    assert _fired(fused, rule) == 1
    assert fused.optimus_report.live_peak_after > fused.optimus_report.live_peak_before
    margin = run(memory_margin=1.0)
    assert _fired(margin, rule) == 0
    assert (
        margin.optimus_report.declined_reasons[f"{rule}: raises peak memory, gain within memory_margin"] >= 1
    )
    budget = run(memory_margin=0.0, memory_budget_bytes=int(fused.optimus_report.live_peak_before))
    assert _fired(budget, rule) == 0
    assert budget.optimus_report.declined_reasons[f"{rule}: over memory_budget_bytes"] >= 1
    for gm in (fused, margin, budget):
        assert_parity(module, gm, inputs)
