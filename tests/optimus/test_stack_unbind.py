"""stack_unbind: unbind(stack(xs)) -> xs and stack(unbind(x)) -> x (or a narrow view of a run)."""

from __future__ import annotations

import pytest
import torch
from split_cat_helpers import fired, ops, run

RULES = ["stack_unbind"]


@pytest.mark.parametrize(
    ("shape", "sdim", "udim"), [((2, 3), 0, 0), ((2, 3), -1, 2), ((4,), 1, -1), ((2, 3, 2), 1, 1)]
)
def test_unbind_of_stack_becomes_the_inputs(shape, sdim, udim) -> None:  # type: ignore[no-untyped-def]
    def f(self, x, y, z):  # type: ignore[no-untyped-def]
        s = torch.stack([x * 1.0, y * 2.0, z * 3.0], sdim)
        a, b, c = torch.unbind(s, udim)
        return a + b, c.tanh()

    gm = run(f, [torch.randn(shape) for _ in range(3)], RULES)
    assert fired(gm, "stack_unbind") == 1
    assert ops(gm, "stack") == 0 and ops(gm, "unbind") == 0


@pytest.mark.parametrize(("shape", "dim"), [((3, 4), 0), ((3, 4), -1), ((2, 5, 3), 1)])
def test_stack_of_unbind_becomes_the_input(shape, dim) -> None:  # type: ignore[no-untyped-def]
    n = shape[dim]

    def f(self, x):  # type: ignore[no-untyped-def]
        parts = (x * 2.0).unbind(dim)
        return torch.stack([parts[i] for i in range(n)], dim) + 1.0

    gm = run(f, [torch.randn(shape)], RULES)
    assert fired(gm, "stack_unbind") == 1
    assert ops(gm, "stack") == 0 and ops(gm, "unbind") == 0


def test_stack_of_a_run_becomes_a_view() -> None:
    def f(self, x):  # type: ignore[no-untyped-def]
        p = torch.unbind(x * 2.0, 1)
        return torch.stack([p[1], p[2], p[3]], 1), p[0] * 3.0

    gm = run(f, [torch.randn(2, 5, 3)], RULES)
    assert fired(gm, "stack_unbind") == 1
    assert ops(gm, "stack") == 0 and ops(gm, "narrow") == 1


def test_other_users_of_the_stack_keep_it() -> None:
    def f(self, x, y):  # type: ignore[no-untyped-def]
        s = torch.stack([x * 1.0, y * 1.0], 0)
        a, b = s.unbind(0)
        return a * b, s.sum(0)

    gm = run(f, [torch.randn(3), torch.randn(3)], RULES)
    assert fired(gm, "stack_unbind") == 1
    assert ops(gm, "stack") == 1 and ops(gm, "unbind") == 0


@pytest.mark.parametrize("case", ["dims_differ", "permuted", "mutated", "returns_input"])
def test_must_not_fire(case) -> None:  # type: ignore[no-untyped-def]
    def f(self, x, y):  # type: ignore[no-untyped-def]
        if case == "dims_differ":
            a, b = torch.stack([x * 1.0, y * 1.0], 0).unbind(1)
            return a, b
        if case == "permuted":
            p = torch.unbind(x * 1.0, 0)
            return torch.stack([p[1], p[0]], 0)
        if case == "mutated":
            s = torch.stack([x * 1.0, y * 1.0], 0)
            s.add_(1.0)
            a, b = s.unbind(0)
            return a, b
        p = torch.unbind(x, 0)
        return torch.stack([p[0], p[1]], 0)

    gm = run(f, [torch.randn(2, 2), torch.randn(2, 2)], RULES)
    assert fired(gm, "stack_unbind") == 0
    assert ops(gm, "stack") == 1


def test_mixed_dtype_stack_promotes_so_pieces_are_not_its_inputs() -> None:
    def f(self, x, y):  # type: ignore[no-untyped-def]
        a, b = torch.stack([x * 1.0, y.double()], 0).unbind(0)
        return a, b

    gm = run(f, [torch.randn(2, 2), torch.randn(2, 2)], RULES)
    assert fired(gm, "stack_unbind") == 0
