"""Cases every horizontal rule must leave alone: inputs that are mutated in place later, chains
of dependent ops, and members whose shapes differ. Each rule fires on the same graph without the
obstacle (so a pass here is not a rule that never fires)."""

from __future__ import annotations

from collections.abc import Callable

import pytest
import torch
import torch.nn.functional as F
from optimus_helpers import Fn, assert_parity, optimize_traced, rule_keys
from torch import nn

N = 8


def _params() -> dict[str, torch.Tensor]:
    torch.manual_seed(0)
    return {"w": torch.randn(8, 8), "b": torch.randn(8), "g": torch.randn(8), "h": torch.randn(8)}


OPS: dict[str, Callable[[nn.Module, torch.Tensor], torch.Tensor]] = {
    "batch_linear": lambda m, t: F.linear(t, m.w, m.b),
    "merge_shared_linear": lambda m, t: F.linear(t, m.w, m.b),
    "batch_layer_norm": lambda m, t: F.layer_norm(t, (8,), m.g, m.h),
    "batch_unary": lambda m, t: torch.tanh(t),
    "batch_binary": lambda m, t: t * 3.0,
}


def _independent(rule: str, mutate: bool) -> nn.Module:
    op = OPS[rule]

    def f(m, x):  # type: ignore[no-untyped-def]
        ys = [x * float(i + 1) for i in range(N)] if rule != "merge_shared_linear" else [x * 2.0] * N
        outs = [op(m, y) for y in ys]
        if mutate:
            for y in ys:
                y.add_(1.0)  # every input is written after it is read
        return outs

    return Fn(f, **_params())


@pytest.mark.parametrize("rule", sorted(OPS))
def test_fires_without_the_obstacle(rule: str) -> None:
    mod, xs = _independent(rule, mutate=False), [torch.randn(4, 8)]
    gm = optimize_traced(mod, xs, rules=[rule])
    assert gm.optimus_report.rules_fired == {rule: 1}
    assert_parity(mod, gm, xs)


@pytest.mark.parametrize("rule", sorted(OPS))
def test_inputs_mutated_later_block_every_rule(rule: str) -> None:
    mod, xs = _independent(rule, mutate=True), [torch.randn(4, 8)]
    gm = optimize_traced(mod, xs, rules=[rule])
    assert gm.optimus_report.rules_fired == {}
    with torch.no_grad():  # the model itself cannot backpropagate (it writes saved tensors)
        for got, want in zip(gm(*xs), mod(*xs), strict=True):
            torch.testing.assert_close(got, want)


@pytest.mark.parametrize("rule", sorted(set(OPS) - {"merge_shared_linear"}))
def test_dependent_chain_blocks_every_rule(rule: str) -> None:
    op = OPS[rule]

    def f(m, x):  # type: ignore[no-untyped-def]
        for _ in range(N):
            x = op(m, x)
        return x

    mod, xs = Fn(f, **_params()), [torch.randn(4, 8)]
    gm = optimize_traced(mod, xs, rules=[rule])
    assert gm.optimus_report.rules_fired == {}
    assert_parity(mod, gm, xs)


@pytest.mark.parametrize("rule", ["batch_unary", "batch_binary", "batch_layer_norm"])
def test_members_of_different_shapes_get_different_keys(rule: str) -> None:
    op = OPS[rule]
    mod = Fn(lambda m, x, y: [op(m, x * 1.0), op(m, y * 1.0)], **_params())
    keys = rule_keys(mod, [torch.randn(4, 8), torch.randn(5, 8)], rule)
    keys = [k for k in keys if k[0] != "binary" or k[1] != "mul" or k[-1] != ("scalar", ("float", 1.0))]
    assert len(keys) == 2 and keys[0] != keys[1]
