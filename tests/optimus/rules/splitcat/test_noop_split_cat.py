"""noop_split_cat: one-piece splits and one-input cats -> their input."""

from __future__ import annotations

import pytest
import torch
from split_cat_helpers import fired, ops, run

RULES = ["noop_split_cat"]


@pytest.mark.parametrize(("shape", "dim"), [((4, 8), 1), ((4, 8), -1), ((5, 2), 0), ((2, 3, 4), -2)])
def test_one_piece_split_and_one_input_cat_vanish(shape, dim) -> None:  # type: ignore[no-untyped-def]
    n = shape[dim]

    def f(self, x):  # type: ignore[no-untyped-def]
        y = x * 2.0
        (only,) = torch.split(y, n, dim)
        return torch.cat([only.tanh()], dim) + 1.0, torch.chunk(y, 1, dim)[0] * 3.0

    gm = run(f, [torch.randn(shape)], RULES)
    assert fired(gm, "noop_split_cat") == 3  # split, chunk, cat
    assert ops(gm, "split") == 0 and ops(gm, "chunk") == 0 and ops(gm, "cat") == 0


def test_stack_of_one_is_not_a_noop() -> None:
    gm = run(lambda self, x: torch.stack([x * 1.0], 0), [torch.randn(2, 3)], RULES)
    assert fired(gm, "noop_split_cat") == 0 and ops(gm, "stack") == 1


def test_cat_of_one_returning_the_input_itself_does_not_fire() -> None:
    gm = run(lambda self, x: torch.cat([x], 0), [torch.randn(2, 3)], RULES)
    assert fired(gm, "noop_split_cat") == 0


def test_mutated_single_cat_does_not_fire() -> None:
    def f(self, x):  # type: ignore[no-untyped-def]
        y = x * 1.0
        c = torch.cat([y], 1)
        c.add_(1.0)  # must not write into y
        return c, y

    gm = run(f, [torch.randn(2, 3)], RULES)
    assert fired(gm, "noop_split_cat") == 0


def test_two_piece_split_is_not_a_noop() -> None:
    def f(self, x):  # type: ignore[no-untyped-def]
        a, b = torch.split(x * 1.0, 2, 1)
        return a, b

    gm = run(f, [torch.randn(2, 4)], RULES)
    assert fired(gm, "noop_split_cat") == 0 and ops(gm, "split") == 1
