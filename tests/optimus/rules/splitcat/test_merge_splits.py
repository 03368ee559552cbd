"""merge_splits: a split of a split piece along the same dim -> one split."""

from __future__ import annotations

import pytest
import torch
from split_cat_helpers import fired, ops, run

RULES = ["merge_splits", "normalize_split_cat"]


@pytest.mark.parametrize(
    ("shape", "outer_dim", "inner_dim"),
    [((3, 12), 1, 1), ((3, 12), -1, 1), ((12, 2), 0, -2), ((2, 12, 3), 1, -2)],
)
def test_nested_split_becomes_one(shape, outer_dim, inner_dim) -> None:  # type: ignore[no-untyped-def]
    def f(self, x):  # type: ignore[no-untyped-def]
        a, b, c = torch.split(x * 2.0, [3, 6, 3], outer_dim)
        b0, b1, b2 = torch.split(b, 2, inner_dim)
        return a + 1.0, b0 * b1, b2, c.relu()

    gm = run(f, [torch.randn(shape)], RULES)
    assert fired(gm, "merge_splits") == 1
    assert ops(gm, "split") == 1


def test_three_levels_merge_into_one() -> None:
    def f(self, x):  # type: ignore[no-untyped-def]
        a, b = torch.split(x * 1.0, [8, 8], 1)
        b0, b1 = b.chunk(2, -1)
        b10, b11 = torch.split(b1, 2, 1)
        return a, b0, b10 * 2.0, b11

    gm = run(f, [torch.randn(2, 16)], RULES)
    assert fired(gm, "merge_splits") == 2
    assert ops(gm, "split") == 1


def test_different_dims_do_not_merge() -> None:
    def f(self, x):  # type: ignore[no-untyped-def]
        a, b = torch.split(x * 1.0, 4, 1)
        b0, b1 = torch.split(b, 2, 0)
        return a, b0, b1

    gm = run(f, [torch.randn(4, 8)], RULES)
    assert fired(gm, "merge_splits") == 0
    assert ops(gm, "split") == 2


def test_piece_with_other_readers_does_not_merge() -> None:
    def f(self, x):  # type: ignore[no-untyped-def]
        a, b = torch.split(x * 1.0, 4, 1)
        b0, b1 = torch.split(b, 2, 1)
        return a, b0, b1, b.sum()  # b itself is needed

    gm = run(f, [torch.randn(4, 8)], RULES)
    assert fired(gm, "merge_splits") == 0


def test_mutated_piece_does_not_merge() -> None:
    def f(self, x):  # type: ignore[no-untyped-def]
        y = x * 1.0
        y.mul_(2.0)
        a, b = torch.split(y, 4, 1)
        b0, b1 = torch.split(b, 2, 1)
        return a * 1.0, b0 * 1.0, b1 * 1.0

    gm = run(f, [torch.randn(4, 8)], RULES)
    assert fired(gm, "merge_splits") == 0
