"""stack_pieces: stack of adjacent equal pieces of one tensor -> unflatten + movedim (+ one copy)."""

from __future__ import annotations

import pytest
import torch
from split_cat_helpers import fired, ops, run

RULES = ["stack_pieces"]


@pytest.mark.parametrize(
    ("shape", "sdim", "stack_dim", "width"),
    [
        ((4, 24), 1, 0, 3),  # 8 pieces to a new leading dim: one copy
        ((4, 24), -1, -1, 2),  # 12 pieces, new trailing dim: one copy
        ((12, 3), 0, 0, 2),  # leading dim of a contiguous tensor: a view
        ((2, 16, 3), 1, 2, 2),
        ((2, 8, 3), 1, 1, 4),
    ],
)
def test_stack_of_split_pieces_becomes_a_reshape(shape, sdim, stack_dim, width) -> None:  # type: ignore[no-untyped-def]
    n = shape[sdim] // width

    def f(self, x):  # type: ignore[no-untyped-def]
        parts = torch.split(x * 2.0, width, sdim)
        return torch.stack([parts[i] for i in range(n)], stack_dim) + 1.0

    gm = run(f, [torch.randn(shape)], RULES)
    assert fired(gm, "stack_pieces") == 1
    assert ops(gm, "stack") == 0 and ops(gm, "split") == 0


def test_stack_of_narrows_and_slices_of_a_subrange() -> None:
    def f(self, x):  # type: ignore[no-untyped-def]
        y = x * 2.0
        return torch.stack([y[:, 2:4], y.narrow(1, 4, 2), y[:, 6:8]], 0), y[:, :2]

    gm = run(f, [torch.randn(3, 10)], RULES)
    assert fired(gm, "stack_pieces") == 1
    assert ops(gm, "stack") == 0 and ops(gm, "narrow") == 1


def test_split_with_other_readers_stays() -> None:
    def f(self, x):  # type: ignore[no-untyped-def]
        p = torch.split(x * 2.0, 2, 1)
        return torch.stack([p[i] for i in range(12)], 0), p[1].sum()

    gm = run(f, [torch.randn(3, 24)], RULES)
    assert fired(gm, "stack_pieces") == 1 and ops(gm, "split") == 1


def test_few_pieces_into_a_new_layout_do_not_pay() -> None:
    """Three pieces moved to a new leading dim: the copy costs what the stack did, plus views."""

    def f(self, x):  # type: ignore[no-untyped-def]
        p = torch.split(x * 2.0, 2, 1)
        return torch.stack([p[0], p[1], p[2]], 0), p[1].sum()

    gm = run(f, [torch.randn(3, 6)], RULES)
    assert fired(gm, "stack_pieces") == 0
    assert gm.optimus_report.declined.get("stack_pieces") == 1


@pytest.mark.parametrize("case", ["permuted", "gap", "two_sources", "mutated"])
def test_must_not_fire(case) -> None:  # type: ignore[no-untyped-def]
    def f(self, x):  # type: ignore[no-untyped-def]
        y = x * 2.0
        if case == "mutated":
            y.add_(1.0)
        if case == "permuted":
            return torch.stack([y[:, 2:4], y[:, 0:2]], 0)
        if case == "gap":
            return torch.stack([y[:, 0:2], y[:, 3:5]], 0)
        if case == "two_sources":
            return torch.stack([y[:, 0:2], (x * 3.0)[:, 2:4]], 0)
        return torch.stack([y[:, 0:2], y[:, 2:4]], 0)

    gm = run(f, [torch.randn(3, 6)], RULES)
    assert fired(gm, "stack_pieces") == 0 and ops(gm, "stack") == 1
