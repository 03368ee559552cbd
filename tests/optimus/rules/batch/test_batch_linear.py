"""batch_linear: before/after at several shapes, must-not-fire cases, forward+backward parity."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from optimus_helpers import assert_parity, count_calls, optimize_traced, rule_keys
from torch import nn

import optimus
from optimus.cost.analytic import AnalyticCostModel

RULES = ["batch_linear"]


class Parallel(nn.Module):
    def __init__(self, n: int, k: int, m: int, bias: bool = True) -> None:
        super().__init__()
        self.lins = nn.ModuleList([nn.Linear(k, m, bias=bias) for _ in range(n)])

    def forward(self, x: torch.Tensor) -> list[torch.Tensor]:
        return [lin(x[i] * 1.0) for i, lin in enumerate(self.lins)]


@pytest.mark.parametrize(
    ("n", "lead", "k", "m", "bias"),
    [
        (6, (4,), 8, 8, True),
        (7, (3,), 6, 10, False),
        (8, (2, 3), 8, 4, True),
        (6, (), 5, 7, True),
        (16, (16,), 16, 16, True),
    ],
)
def test_fuses_independent_linears(n: int, lead: tuple[int, ...], k: int, m: int, bias: bool) -> None:
    torch.manual_seed(0)
    mod = Parallel(n, k, m, bias)
    xs = [torch.randn(n, *lead, k)]
    gm = optimize_traced(mod, xs, rules=RULES)
    assert gm.optimus_report.rules_fired == {"batch_linear": 1}
    assert count_calls(gm, F.linear) == 0
    assert count_calls(gm, torch.baddbmm, torch.bmm) == 1
    assert_parity(mod, gm, xs)


def test_functional_and_module_forms_fuse_together() -> None:
    torch.manual_seed(0)
    lin = nn.Linear(6, 6)

    class Mixed(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.lin = lin
            self.w = nn.Parameter(torch.randn(6, 6))
            self.b = nn.Parameter(torch.randn(6))

        def forward(self, x: torch.Tensor, y: torch.Tensor) -> list[torch.Tensor]:
            outs = [self.lin(x[i]) for i in range(4)]  # module form
            outs += [F.linear(y[i], bias=self.b, weight=self.w) for i in range(4)]  # keyword form
            return outs

    mod = Mixed()
    xs = [torch.randn(4, 3, 6), torch.randn(4, 3, 6)]
    gm = optimize_traced(mod, xs, rules=RULES)
    assert gm.optimus_report.rules_fired.get("batch_linear") == 1
    assert_parity(mod, gm, xs)


def test_dependent_linears_do_not_fuse() -> None:
    torch.manual_seed(0)

    class Chain(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.a, self.b = nn.Linear(8, 8), nn.Linear(8, 8)

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return self.b(self.a(x))

    mod = Chain()
    xs = [torch.randn(4, 8)]
    gm = optimize_traced(mod, xs, rules=RULES)
    assert gm.optimus_report.rules_fired == {}
    assert count_calls(gm, F.linear) == 2
    assert_parity(mod, gm, xs)


@pytest.mark.parametrize("case", ["in_features", "out_features", "batch", "bias_mix", "dtype"])
def test_mismatched_signatures_do_not_fuse(case: str) -> None:
    torch.manual_seed(0)
    a = nn.Linear(8, 8)
    b = {
        "in_features": nn.Linear(6, 8),
        "out_features": nn.Linear(8, 5),
        "batch": nn.Linear(8, 8),
        "bias_mix": nn.Linear(8, 8, bias=False),
        "dtype": nn.Linear(8, 8).double(),
    }[case]
    x = torch.randn(4, 8)
    y = {
        "in_features": torch.randn(4, 6),
        "batch": torch.randn(5, 8),
        "dtype": torch.randn(4, 8).double(),
    }.get(case, torch.randn(4, 8))

    class Two(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.a, self.b = a, b

        def forward(self, x: torch.Tensor, y: torch.Tensor) -> list[torch.Tensor]:
            return [self.a(x * float(i)) for i in range(4)] + [self.b(y * float(i)) for i in range(1)]

    mod = Two()
    keys = rule_keys(mod, [x, y], "batch_linear")
    assert len(keys) == 5 and len(set(keys)) == 2  # a's four share a key; b's differs
    gm = optimize_traced(mod, [x, y], rules=RULES, cost_model=AnalyticCostModel(min_group=5))
    assert gm.optimus_report.rules_fired == {}
    assert_parity(mod, gm, [x, y])


def test_mutated_input_blocks_fusion() -> None:
    torch.manual_seed(0)

    class Mut(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.a, self.b = nn.Linear(8, 8), nn.Linear(8, 8)

        def forward(self, x: torch.Tensor, y: torch.Tensor) -> list[torch.Tensor]:
            outs = [self.a(x * float(i)) for i in range(8)]
            y = y * 1.0
            y.add_(1.0)  # in-place: y's value depends on where a read of it sits
            outs += [self.b(y) for _ in range(4)]
            return outs

    mod = Mut()
    xs = [torch.randn(4, 8), torch.randn(4, 8)]
    gm = optimize_traced(mod, xs, rules=RULES)
    # the eight linears on x fuse; none of the four reading the mutated y may move
    assert gm.optimus_report.rules_fired == {"batch_linear": 1}
    reads_y = [n for n in gm.graph.nodes if n.target is F.linear]
    assert len(reads_y) == 4
    assert_parity(mod, gm, xs)


def test_shared_weight_uses_broadcast_not_copy() -> None:
    torch.manual_seed(0)
    lin = nn.Linear(8, 8)

    class Shared(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.lin = lin

        def forward(self, x: torch.Tensor, y: torch.Tensor) -> list[torch.Tensor]:
            return [self.lin(x * float(i)) for i in range(3)] + [self.lin(y * float(i)) for i in range(3)]

    mod = Shared()
    xs = [torch.randn(4, 8), torch.randn(4, 8)]
    gm = optimize_traced(mod, xs, rules=RULES)
    assert gm.optimus_report.rules_fired == {"batch_linear": 1}
    assert_parity(mod, gm, xs)


def test_default_cost_model_declines_two_small_linears_on_cpu() -> None:
    """Two 8x8 linears: stacking inputs and weights costs more launches than it saves."""
    torch.manual_seed(0)
    mod = Parallel(2, 8, 8)
    xs = [torch.randn(2, 4, 8)]
    gm = optimize_traced(mod, xs, rules=RULES, cost_model=optimus.AnalyticCostModel())
    assert gm.optimus_report.rules_fired == {}
    assert gm.optimus_report.declined == {"batch_linear": 1}
    assert count_calls(gm, F.linear) == 2


class GatedTowers(nn.Module):
    """Each input feeds ``roles`` linears (a tower layer and its gate): the shared-input form."""

    def __init__(self, n: int, k: int, m: int, roles: int = 2, bias: bool = True) -> None:
        super().__init__()
        self.lins = nn.ModuleList(
            [nn.ModuleList([nn.Linear(k, m, bias=bias) for _ in range(roles)]) for _ in range(n)]
        )

    def forward(self, x: torch.Tensor) -> list[torch.Tensor]:
        outs = []
        for i, group in enumerate(self.lins):
            xi = x[i] * 1.0
            outs.append(torch.tanh(group[0](xi)) * torch.sigmoid(group[-1](xi)))
            outs.extend(torch.relu(lin(xi)) for lin in group[1:-1])  # (raw: its strides are seen)
        return outs


def _stacked_inputs(gm: torch.fx.GraphModule) -> int:
    """How many tensors are stacked into the batched matmul's input."""
    (mm,) = [n for n in gm.graph.nodes if n.target in (torch.baddbmm, torch.bmm)]
    x = mm.args[1] if mm.target is torch.baddbmm else mm.args[0]
    assert x.target is torch.stack
    return len(x.args[0])


@pytest.mark.parametrize(("roles", "bias"), [(2, True), (3, False), (2, False)])
def test_shared_inputs_are_stacked_once(roles: int, bias: bool) -> None:
    torch.manual_seed(0)
    mod = GatedTowers(6, 8, 5, roles, bias)
    xs = [torch.randn(6, 4, 8)]
    gm = optimize_traced(mod, xs, rules=RULES)
    assert gm.optimus_report.rules_fired == {"batch_linear": 1}
    assert count_calls(gm, torch.baddbmm, torch.bmm) == 1
    assert _stacked_inputs(gm) == 6  # each of the 6 inputs once, not 6 * roles
    assert_parity(mod, gm, xs)


def test_shared_inputs_under_relayout_train_like_unfused() -> None:
    """The [G', K, k*N] weight view of re-laid-out parameters: same outputs and SGD updates."""
    from optimus.params.relayout import RelayoutParams

    torch.manual_seed(0)
    ref = GatedTowers(6, 8, 5)
    mod = GatedTowers(6, 8, 5)
    mod.load_state_dict(ref.state_dict())
    x = torch.randn(6, 4, 8)
    config = optimus.OptimusConfig(
        rules=RULES, layout=RelayoutParams(), cost_model=AnalyticCostModel(min_group=2)
    )
    gm = optimus.optimize(mod, (x,), config=config)
    assert gm.optimus_report.rules_fired == {"batch_linear": 1}
    for model, fn in ((ref, ref), (mod, gm)):
        opt = torch.optim.SGD(model.parameters(), lr=0.1)
        for _ in range(3):
            opt.zero_grad()
            sum(o.square().sum() for o in fn(x)).backward()
            opt.step()
    for (name, a), b in zip(ref.state_dict().items(), mod.state_dict().values(), strict=True):
        torch.testing.assert_close(b, a, rtol=1e-5, atol=1e-6, msg=name)


def test_uneven_sharing_falls_back_to_plain_stacking() -> None:
    """Input 0 feeds two linears, the others one: no common k, so every input is stacked."""
    torch.manual_seed(0)

    class Uneven(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.lins = nn.ModuleList([nn.Linear(8, 8) for _ in range(6)])

        def forward(self, x: torch.Tensor) -> list[torch.Tensor]:
            xs = [x[0] * 1.0, x[0] * 1.0] + [x[i] * 1.0 for i in range(1, 5)]
            a = x[0] * 2.0
            return [self.lins[0](a), self.lins[1](a)] + [
                lin(xi) for lin, xi in zip(self.lins[2:], xs[2:], strict=True)
            ]

    mod = Uneven()
    xs = [torch.randn(5, 4, 8)]
    gm = optimize_traced(mod, xs, rules=RULES)
    assert gm.optimus_report.rules_fired == {"batch_linear": 1}
    assert _stacked_inputs(gm) == 6
    assert_parity(mod, gm, xs)


def test_default_cost_model_declines_a_small_shared_input_group_on_cpu() -> None:
    """Two inputs read by two small linears each (the shared-input form): the default CPU cost
    model keeps the four apart; with four inputs the same form pays and fires."""
    torch.manual_seed(0)
    small = GatedTowers(2, 8, 8)
    xs = [torch.randn(2, 4, 8)]
    gm = optimize_traced(small, xs, rules=RULES, cost_model=optimus.AnalyticCostModel())
    assert gm.optimus_report.rules_fired == {}
    assert gm.optimus_report.declined == {"batch_linear": 1}
    assert count_calls(gm, F.linear) == 4

    big = GatedTowers(4, 8, 8)
    xs = [torch.randn(4, 64, 8)]
    gm = optimize_traced(big, xs, rules=RULES, cost_model=optimus.AnalyticCostModel())
    assert gm.optimus_report.rules_fired == {"batch_linear": 1}
    assert _stacked_inputs(gm) == 4
    assert_parity(big, gm, xs)
