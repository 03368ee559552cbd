"""unbind_cat: cat of consecutive unbind outputs -> movedim + flatten of the unbound tensor."""

from __future__ import annotations

import pytest
import torch
from split_cat_helpers import fired, ops, run

RULES = ["unbind_cat"]


@pytest.mark.parametrize(
    ("shape", "udim", "cdim"),
    [((4, 3, 5), 0, 1), ((4, 3, 5), 0, -1), ((3, 4, 2), 1, 0), ((2, 3), -1, 0), ((3, 2, 2), 2, 1)],
)
def test_cat_of_all_pieces_becomes_one_reshape(shape, udim, cdim) -> None:  # type: ignore[no-untyped-def]
    n = shape[udim]

    def f(self, x):  # type: ignore[no-untyped-def]
        parts = torch.unbind(x * 2.0, udim)
        return torch.cat([parts[i] for i in range(n)], cdim) + 1.0

    gm = run(f, [torch.randn(shape)], RULES)
    assert fired(gm, "unbind_cat") == 1
    assert ops(gm, "cat") == 0 and ops(gm, "unbind") == 0


def test_a_run_of_pieces_narrows_first_and_other_pieces_keep_working() -> None:
    def f(self, x):  # type: ignore[no-untyped-def]
        p = (x * 2.0).unbind(0)
        return torch.cat([p[i] for i in range(1, 16)], 1), p[0].relu()

    gm = run(f, [torch.randn(17, 3, 2)], RULES)
    assert fired(gm, "unbind_cat") == 1
    assert ops(gm, "cat") == 0 and ops(gm, "narrow") == 1


@pytest.mark.parametrize("case", ["permuted", "repeated", "two_sources", "mutated"])
def test_must_not_fire(case) -> None:  # type: ignore[no-untyped-def]
    def f(self, x):  # type: ignore[no-untyped-def]
        y = x * 2.0
        if case == "mutated":
            y.add_(1.0)
        p = y.unbind(0)
        if case == "permuted":
            return torch.cat([p[1], p[0]], 1)
        if case == "repeated":
            return torch.cat([p[0], p[0]], 1)
        if case == "two_sources":
            return torch.cat([p[0], (x * 3.0).unbind(0)[1]], 1)
        return torch.cat([p[0], p[1]], 1)

    gm = run(f, [torch.randn(2, 3, 2)], RULES)
    assert fired(gm, "unbind_cat") == 0 and ops(gm, "cat") == 1
