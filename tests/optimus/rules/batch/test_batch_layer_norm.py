"""batch_layer_norm: shapes, affine variants, must-not-fire cases, parity."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from optimus_helpers import LAUNCH_BOUND, assert_parity, count_calls, optimize_traced, rule_keys
from torch import nn

import optimus

RULES = ["batch_layer_norm"]


class Norms(nn.Module):
    def __init__(self, n: int, shape: tuple[int, ...], affine: bool = True, bias: bool = True) -> None:
        super().__init__()
        self.norms = nn.ModuleList(
            [nn.LayerNorm(shape, elementwise_affine=affine, bias=bias) for _ in range(n)]
        )
        for norm in self.norms:  # non-trivial affine parameters
            if norm.weight is not None:
                nn.init.normal_(norm.weight)
            if norm.bias is not None:
                nn.init.normal_(norm.bias)

    def forward(self, x: torch.Tensor) -> list[torch.Tensor]:
        return [norm(x[i] * 2.0) for i, norm in enumerate(self.norms)]


@pytest.mark.parametrize(
    ("n", "lead", "shape", "affine", "bias"),
    [
        (6, (4,), (8,), True, True),
        (7, (2, 3), (5,), True, False),
        (6, (3,), (4, 5), True, True),
        (8, (4,), (16,), False, False),
    ],
)
def test_fuses_layer_norms(
    n: int, lead: tuple[int, ...], shape: tuple[int, ...], affine: bool, bias: bool
) -> None:
    torch.manual_seed(0)
    mod = Norms(n, shape, affine, bias)
    xs = [torch.randn(n, *lead, *shape)]
    gm = optimize_traced(mod, xs, rules=RULES)
    assert gm.optimus_report.rules_fired == {"batch_layer_norm": 1}
    assert count_calls(gm, F.layer_norm) == 1
    assert_parity(mod, gm, xs)


def test_positional_and_keyword_eps_must_match() -> None:
    torch.manual_seed(0)
    w, b = torch.randn(8), torch.randn(8)

    class Mixed(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.w, self.b = nn.Parameter(w), nn.Parameter(b)

        def forward(self, x: torch.Tensor) -> list[torch.Tensor]:
            outs = [F.layer_norm(x[i], (8,), self.w, self.b, 1e-3) for i in range(3)]  # positional eps
            outs += [F.layer_norm(x[i], (8,), weight=self.w, bias=self.b, eps=1e-3) for i in range(3, 6)]
            outs += [
                F.layer_norm(x[i], (8,), self.w, self.b) for i in range(6, 9)
            ]  # default eps: other group
            return outs

    mod = Mixed()
    xs = [torch.randn(9, 4, 8)]
    gm = optimize_traced(mod, xs, rules=RULES)
    assert gm.optimus_report.rules_fired == {"batch_layer_norm": 1}
    assert count_calls(gm, F.layer_norm) == 1 + 3  # the eps=1e-3 six fused, the default-eps three left
    assert_parity(mod, gm, xs)


def test_dependent_layer_norms_do_not_fuse() -> None:
    torch.manual_seed(0)

    class Chain(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.norms = nn.ModuleList([nn.LayerNorm(8) for _ in range(6)])

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            for norm in self.norms:
                x = norm(x)
            return x

    mod = Chain()
    xs = [torch.randn(4, 8)]
    gm = optimize_traced(mod, xs, rules=RULES)
    assert gm.optimus_report.rules_fired == {}
    assert_parity(mod, gm, xs)


def test_mismatched_shapes_do_not_fuse() -> None:
    torch.manual_seed(0)

    class Shapes(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.a = nn.ModuleList([nn.LayerNorm(8) for _ in range(3)])
            self.b = nn.ModuleList([nn.LayerNorm(6) for _ in range(3)])

        def forward(self, x: torch.Tensor, y: torch.Tensor) -> list[torch.Tensor]:
            return [n(x[i]) for i, n in enumerate(self.a)] + [n(y[i]) for i, n in enumerate(self.b)]

    mod = Shapes()
    xs = [torch.randn(3, 4, 8), torch.randn(3, 4, 6)]
    keys = rule_keys(mod, xs, "batch_layer_norm")
    assert len(keys) == 6 and len(set(keys)) == 2
    gm = optimize_traced(
        mod, xs, rules=RULES, cost_model=__import__("optimus").AnalyticCostModel(min_group=4)
    )
    assert gm.optimus_report.rules_fired == {}
    assert_parity(mod, gm, xs)


class TwoGroupsOneNorm(nn.Module):
    """Two batched-linear groups (different input widths) feed one group of LayerNorms."""

    def __init__(self, n: int = 6) -> None:
        super().__init__()
        self.a = nn.ModuleList([nn.Linear(8, 5) for _ in range(n)])
        self.b = nn.ModuleList([nn.Linear(4, 5) for _ in range(n)])
        self.norms = nn.ModuleList([nn.LayerNorm(5) for _ in range(2 * n)])
        for norm in self.norms:
            nn.init.normal_(norm.weight)
            nn.init.normal_(norm.bias)

    def forward(self, x: torch.Tensor, y: torch.Tensor) -> list[torch.Tensor]:
        hs = [lin(x[i] * 1.0) for i, lin in enumerate(self.a)] + [
            lin(y[i] * 1.0) for i, lin in enumerate(self.b)
        ]
        return [norm(h) for norm, h in zip(self.norms, hs, strict=True)]


def test_pieces_of_two_fused_groups_are_joined_by_one_cat() -> None:
    torch.manual_seed(0)
    mod = TwoGroupsOneNorm()
    xs = [torch.randn(6, 3, 8), torch.randn(6, 3, 4)]
    gm = optimize_traced(mod, xs, rules=["batch_linear", *RULES])
    assert gm.optimus_report.rules_fired == {"batch_linear": 2, "batch_layer_norm": 1}
    (norm,) = [n for n in gm.graph.nodes if n.target is F.layer_norm]
    cat = norm.args[0]
    assert cat.target is torch.cat and len(cat.args[0]) == 2  # the two [6, 3, 5] outputs, not 12 pieces
    assert all(a.target in (torch.baddbmm, torch.bmm) for a in cat.args[0])
    assert_parity(mod, gm, xs)


def test_pieces_in_another_order_are_stacked() -> None:
    """Pieces of two groups interleaved are not runs: a real stack, and still the same results."""
    torch.manual_seed(0)

    class Interleaved(TwoGroupsOneNorm):
        def forward(self, x: torch.Tensor, y: torch.Tensor) -> list[torch.Tensor]:
            ha = [lin(x[i] * 1.0) for i, lin in enumerate(self.a)]
            hb = [lin(y[i] * 1.0) for i, lin in enumerate(self.b)]
            hs = [h for pair in zip(ha, hb, strict=True) for h in pair]
            return [norm(h) for norm, h in zip(self.norms, hs, strict=True)]

    mod = Interleaved()
    xs = [torch.randn(6, 3, 8), torch.randn(6, 3, 4)]
    gm = optimize_traced(mod, xs, rules=["batch_linear", *RULES])
    assert gm.optimus_report.rules_fired == {"batch_linear": 2, "batch_layer_norm": 1}
    (norm,) = [n for n in gm.graph.nodes if n.target is F.layer_norm]
    assert norm.args[0].target is torch.stack
    assert_parity(mod, gm, xs)


class AutocastNorms(nn.Module):
    """LayerNorms of bfloat16 linear outputs under CPU autocast, float32 affine parameters: eager
    keeps each result bfloat16 (fuzz seed 362 found the batched form returning float32)."""

    def __init__(self, n: int) -> None:
        super().__init__()
        self.linears = nn.ModuleList([nn.Linear(6, 8) for _ in range(n)])
        self.norms = nn.ModuleList([nn.LayerNorm(8) for _ in range(n)])

    def forward(self, x: torch.Tensor) -> list[torch.Tensor]:
        with torch.autocast("cpu", dtype=torch.bfloat16):
            return [norm(lin(x)) for lin, norm in zip(self.linears, self.norms, strict=True)]


@pytest.mark.parametrize("rules", [RULES, None], ids=["layer_norm_only", "all_rules"])
def test_mixed_dtype_layer_norms_keep_eager_dtype(rules: list[str] | None) -> None:
    torch.manual_seed(0)
    mod, x = AutocastNorms(6), torch.randn(4, 6)
    gm = optimus.optimize(mod, (x,), rules=rules, cost_model=LAUNCH_BOUND)  # Dynamo: autocast regions
    want, got = mod(x), gm(x)
    assert [t.dtype for t in got] == [t.dtype for t in want] == [torch.bfloat16] * 6
    for a, b in zip(got, want, strict=True):
        torch.testing.assert_close(a, b)
    assert "batch_layer_norm" not in gm.optimus_report.rules_fired
    if rules == RULES:
        assert gm.optimus_report.declined_reasons.get(
            "batch_layer_norm: input and affine parameters differ in dtype"
        )


def test_affine_layer_norms_in_reduced_precision_are_declined() -> None:
    torch.manual_seed(0)
    mod = Norms(6, (8,)).to(torch.bfloat16)
    xs = [torch.randn(6, 4, 8, dtype=torch.bfloat16)]
    gm = optimize_traced(mod, xs, rules=RULES)
    assert gm.optimus_report.rules_fired.get("batch_layer_norm", 0) == 0
    assert gm.optimus_report.declined_reasons.get(
        "batch_layer_norm: affine LayerNorm in reduced precision (two roundings)"
    )
    plain = Norms(6, (8,), affine=False).to(torch.bfloat16)  # no affine step: one rounding, batched
    assert optimize_traced(plain, xs, rules=RULES).optimus_report.rules_fired == {"batch_layer_norm": 1}
