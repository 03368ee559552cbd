"""batch_unary / batch_binary: call forms, settings that must match, must-not-fire cases, parity."""

from __future__ import annotations

import operator

import pytest
import torch
import torch.nn.functional as F
from optimus_helpers import Fn, assert_parity, count_calls, optimize_traced
from torch import nn


def _group(fn, n: int = 6):  # type: ignore[no-untyped-def]
    return Fn(lambda self, x: [fn(x[i] + 0.0, i) for i in range(n)])


UNARY_CASES = {
    "relu_forms": lambda x, i: (
        torch.relu(x),
        F.relu(x),
        x.relu(),
        F.relu(x, False),
        F.relu(x, inplace=False),
        torch.relu(x),
    )[i],
    "tanh": lambda x, i: torch.tanh(x),
    "sigmoid_method": lambda x, i: x.sigmoid(),
    "gelu_tanh": lambda x, i: F.gelu(x, approximate="tanh"),
    "silu": lambda x, i: F.silu(x),
    "leaky_positional": lambda x, i: F.leaky_relu(x, 0.2) if i % 2 else F.leaky_relu(x, negative_slope=0.2),
    "clamp_positional": lambda x, i: torch.clamp(x, -0.5, 0.5) if i % 2 else x.clamp(min=-0.5, max=0.5),
    "nan_to_num": lambda x, i: torch.nan_to_num(x, 1.0, 2.0, -2.0),
    "hardtanh": lambda x, i: F.hardtanh(x, -0.3, 0.7),
}


@pytest.mark.parametrize("case", sorted(UNARY_CASES))
@pytest.mark.parametrize("shape", [(4, 8), (3,), (2, 3, 5)])
def test_unary_fuses(case: str, shape: tuple[int, ...]) -> None:
    torch.manual_seed(0)
    mod = _group(UNARY_CASES[case])
    x = torch.randn(6, *shape)
    if case == "nan_to_num":
        x[0, 0] = float("nan")
        x[1, 0] = float("inf")
    gm = optimize_traced(mod, [x], rules=["batch_unary"])
    assert gm.optimus_report.rules_fired == {"batch_unary": 1}
    assert_parity(mod, gm, [x])


@pytest.mark.parametrize(
    ("name", "fn"),
    [
        (
            "clamp_bounds_differ",
            lambda x, i: torch.clamp(x, -0.5, 0.5) if i % 2 else torch.clamp(x, -0.4, 0.5),
        ),
        ("leaky_slope_differs", lambda x, i: F.leaky_relu(x, 0.2) if i % 2 else F.leaky_relu(x)),
        (
            "nan_to_num_values_differ",
            lambda x, i: torch.nan_to_num(x, 1.0) if i % 2 else torch.nan_to_num(x, 2.0),
        ),
        ("gelu_approximate_differs", lambda x, i: F.gelu(x, approximate="tanh") if i % 2 else F.gelu(x)),
    ],
)
def test_unary_settings_must_match(name: str, fn) -> None:  # type: ignore[no-untyped-def]
    torch.manual_seed(0)
    mod = _group(fn)
    x = torch.randn(6, 4, 8)
    gm = optimize_traced(mod, [x], rules=["batch_unary"])
    # two groups of three (one per setting), never one group of six
    assert gm.optimus_report.rules_fired == {"batch_unary": 2}
    assert_parity(mod, gm, [x])


def test_unary_dropout_and_inplace_never_fuse() -> None:
    torch.manual_seed(0)
    mod = Fn(
        lambda self, x: (
            [F.dropout(x[i] + 0.0, 0.3, True) for i in range(6)]
            + [F.relu(x[i] + 1.0, inplace=True) for i in range(6)]
        )
    )
    x = torch.randn(6, 4, 8)
    gm = optimize_traced(mod, [x], rules=["batch_unary"])
    assert gm.optimus_report.rules_fired == {}
    assert count_calls(gm, F.dropout) == 6


def test_unary_values_nobody_reads_are_not_batched() -> None:
    """Six dead tanh calls (computed, never read) stay out of every group: batching them adds
    work, and they must not split or join the group of six live ones."""
    torch.manual_seed(0)

    def fn(self, x):  # type: ignore[no-untyped-def]
        for i in range(6):
            torch.tanh(x[i] + 2.0)  # dead
        return [torch.tanh(x[i] + 0.0) for i in range(6)]

    mod = Fn(fn)
    x = torch.randn(6, 4, 8)
    gm = optimize_traced(mod, [x], rules=["batch_unary"])
    assert gm.optimus_report.rules_fired == {"batch_unary": 1}
    stacked = [n for n in gm.graph.nodes if n.target is torch.stack]
    assert len(stacked) == 1 and len(stacked[0].args[0]) == 6
    assert_parity(mod, gm, [x])


def test_unary_dependent_chain_does_not_fuse() -> None:
    mod = Fn(lambda self, x: torch.tanh(torch.tanh(torch.tanh(torch.tanh(x)))))
    x = torch.randn(4, 8)
    gm = optimize_traced(mod, [x], rules=["batch_unary"])
    assert gm.optimus_report.rules_fired == {}
    assert_parity(mod, gm, [x])


BINARY_CASES = {
    "add_tensor": lambda x, y, i: x + y,
    "add_alpha_positional_vs_kw": lambda x, y, i: (
        torch.add(x, y, alpha=2.0) if i % 2 else x.add(y, alpha=2.0)
    ),
    "sub_scalar": lambda x, y, i: x - 3.0,
    "rmul_scalar": lambda x, y, i: 2.0 * x,
    "mul_tensor": lambda x, y, i: torch.mul(x, y),
    "div_floor": lambda x, y, i: torch.div(x, y, rounding_mode="floor"),
    "div_scalar": lambda x, y, i: x / 4,
    "maximum": lambda x, y, i: torch.maximum(x, y),
}


@pytest.mark.parametrize("case", sorted(BINARY_CASES))
@pytest.mark.parametrize("shape", [(4, 8), (5,)])
def test_binary_fuses(case: str, shape: tuple[int, ...]) -> None:
    torch.manual_seed(0)
    fn = BINARY_CASES[case]
    mod = Fn(lambda self, x, y: [fn(x[i], y[i], i) for i in range(6)])
    xs = [torch.randn(6, *shape) * 3, torch.rand(6, *shape) + 0.5]
    gm = optimize_traced(mod, xs, rules=["batch_binary"])
    assert gm.optimus_report.rules_fired.get("batch_binary") == 1
    assert_parity(mod, gm, xs)


def test_binary_alpha_must_match() -> None:
    mod = Fn(
        lambda self, x, y: [torch.add(x[i] * 1.0, y[i] * 1.0, alpha=float(i % 2 + 1)) for i in range(12)]
    )
    xs = [torch.randn(12, 4), torch.randn(12, 4)]
    gm = optimize_traced(mod, xs, rules=["batch_binary"])
    # the "* 1.0" pre-ops: one group of 24; the adds: one group of six per alpha
    assert gm.optimus_report.rules_fired == {"batch_binary": 3}
    assert sorted(n.kwargs["alpha"] for n in gm.graph.nodes if n.target is torch.add) == [1.0, 2.0]
    assert_parity(mod, gm, xs)


def test_binary_broadcast_and_scalar_first_sub_do_not_fuse() -> None:
    mod = Fn(
        lambda self, x, b: (
            [x[i] * 1.0 + b for i in range(6)] + [operator.sub(1.0, x[i] * 2.0) for i in range(6)]
        )
    )
    xs = [torch.randn(6, 4, 8), torch.randn(8)]
    gm = optimize_traced(mod, xs, rules=["batch_binary"])
    # the only group is the six "* 1.0"/"* 2.0" multiplies that feed them; the broadcast adds and
    # scalar-first subs stay as they are
    fired_on = [n for n in gm.graph.nodes if n.target is operator.add or n.target is operator.sub]
    assert len(fired_on) == 12
    assert_parity(mod, gm, xs)


def test_binary_inplace_never_fuses() -> None:
    def f(self: nn.Module, x: torch.Tensor) -> list[torch.Tensor]:
        outs = []
        for i in range(6):
            t = x[i] * 1.0
            t.add_(1.0)
            outs.append(t)
        return outs

    mod = Fn(f)
    xs = [torch.randn(6, 4)]
    gm = optimize_traced(mod, xs, rules=["batch_binary"])
    assert count_calls(gm, operator.mul) == 6  # the multiplies read values that are later mutated
    assert_parity(mod, gm, xs)


def test_a_run_of_equal_pieces_inside_a_longer_split_is_stacked_as_a_view() -> None:
    """MMoE's merged expert-and-gate linear splits ``[32] * 4 + [8] * 2``: the experts' relus stack
    their four pieces as one view of the split's input (no copy), and the gates stay apart."""
    from split_cat_helpers import ops, run

    def f(self, x):  # type: ignore[no-untyped-def]
        a, b, c, d, g1, g2 = torch.split(x * 1.0, [32, 32, 32, 32, 8, 8], 1)
        experts = [torch.relu(p) + 1.0 for p in (a, b, c, d)]
        return torch.cat(experts, 1) * 2.0, g1.sigmoid() + g2

    x = torch.randn(16, 144)
    gm = run(f, [x], ["batch_unary"])
    assert gm.optimus_report.rules_fired.get("batch_unary") == 1
    assert ops(gm, "stack") == 0 and ops(gm, "narrow") == 1
    torch.testing.assert_close(gm(x)[0], f(None, x)[0])
