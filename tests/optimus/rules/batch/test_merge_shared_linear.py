"""merge_shared_linear: linears reading one tensor -> one wide linear + split."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from optimus_helpers import assert_parity, count_calls, optimize_traced, rule_keys
from torch import nn

RULES = ["merge_shared_linear"]


class Heads(nn.Module):
    def __init__(self, k: int, widths: list[int], bias: bool = True) -> None:
        super().__init__()
        self.heads = nn.ModuleList([nn.Linear(k, w, bias=bias) for w in widths])

    def forward(self, x: torch.Tensor) -> list[torch.Tensor]:
        h = x * 2.0
        return [torch.relu(head(h)) for head in self.heads]


@pytest.mark.parametrize(
    ("lead", "k", "widths", "bias"),
    [
        ((4,), 8, [8, 8, 8, 8, 8], True),
        ((3,), 6, [2, 5, 7, 1], False),
        ((2, 3), 8, [4, 4, 4, 4, 4], True),
        ((), 5, [3, 3, 3, 3, 3], True),
    ],
)
def test_merges_linears_sharing_input(lead: tuple[int, ...], k: int, widths: list[int], bias: bool) -> None:
    torch.manual_seed(0)
    mod = Heads(k, widths, bias)
    xs = [torch.randn(*lead, k)]
    gm = optimize_traced(mod, xs, rules=RULES)
    assert gm.optimus_report.rules_fired == {"merge_shared_linear": 1}
    # equal widths: one batched GEMM (contiguous results); unequal: one wide linear
    assert count_calls(gm, F.linear, torch.bmm, torch.baddbmm) == 1
    assert_parity(mod, gm, xs)


def test_different_inputs_do_not_merge() -> None:
    torch.manual_seed(0)

    class TwoInputs(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.a, self.b = nn.Linear(8, 8), nn.Linear(8, 8)

        def forward(self, x: torch.Tensor, y: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
            return self.a(x), self.b(y)

    mod = TwoInputs()
    xs = [torch.randn(4, 8), torch.randn(4, 8)]
    keys = rule_keys(mod, xs, "merge_shared_linear")
    assert len(keys) == 2 and keys[0] != keys[1]
    gm = optimize_traced(mod, xs, rules=RULES)
    assert gm.optimus_report.rules_fired == {}
    assert count_calls(gm, F.linear) == 2


def test_dependent_linear_on_same_input_does_not_merge() -> None:
    """The second linear's weight is computed from the first's output: they cannot run as one."""
    torch.manual_seed(0)

    class Dep(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.a = nn.Linear(8, 8, bias=False)
            self.w = nn.Parameter(torch.randn(8, 8))

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            a = self.a(x)
            return F.linear(x, self.w + a.sum())  # weight computed from a

    mod = Dep()
    xs = [torch.randn(4, 8)]
    keys = rule_keys(mod, xs, "merge_shared_linear")
    assert len(keys) == 2 and keys[0] == keys[1]  # same key: only the dependency keeps them apart
    gm = optimize_traced(mod, xs, rules=RULES)
    assert gm.optimus_report.rules_fired == {}
    assert_parity(mod, gm, xs)


def test_mixed_bias_does_not_merge() -> None:
    torch.manual_seed(0)

    class Mixed(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.a, self.b = nn.Linear(8, 4), nn.Linear(8, 4, bias=False)

        def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
            return self.a(x), self.b(x)

    mod = Mixed()
    xs = [torch.randn(4, 8)]
    keys = rule_keys(mod, xs, "merge_shared_linear")
    assert len(keys) == 2 and keys[0] != keys[1]
    gm = optimize_traced(mod, xs, rules=RULES)
    assert gm.optimus_report.rules_fired == {}
    assert_parity(mod, gm, xs)
