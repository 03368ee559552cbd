"""flatten_cats: a cat of cats on the same dim -> one cat."""

from __future__ import annotations

import pytest
import torch
from split_cat_helpers import fired, ops, run

RULES = ["flatten_cats"]


@pytest.mark.parametrize(
    ("shape", "outer", "inner"), [((2, 3), 1, 1), ((2, 3), -1, 1), ((3, 2), 0, -2), ((2, 3, 4), 2, -1)]
)
def test_nested_cat_becomes_one(shape, outer, inner) -> None:  # type: ignore[no-untyped-def]
    def f(self, x, y, z):  # type: ignore[no-untyped-def]
        return torch.cat([x * 1.0, torch.cat([y * 2.0, z * 3.0], inner), x * 4.0], outer)

    gm = run(f, [torch.randn(shape) for _ in range(3)], RULES)
    assert fired(gm, "flatten_cats") == 1
    assert ops(gm, "cat") == 1


def test_deep_nesting_flattens_fully() -> None:
    def f(self, x, y, z):  # type: ignore[no-untyped-def]
        inner = torch.cat([y, torch.cat([z, x], 1)], 1)
        return torch.cat([torch.concat([x, inner], dim=-1), z], 1)

    gm = run(f, [torch.randn(2, 3) for _ in range(3)], RULES)
    assert fired(gm, "flatten_cats") >= 1
    assert ops(gm, "cat") == 1


def test_different_dims_do_not_flatten() -> None:
    def f(self, x, y, z):  # type: ignore[no-untyped-def]
        return torch.cat([torch.cat([x, y], 0), torch.cat([z, z], 0)], 1)

    gm = run(f, [torch.randn(2, 2) for _ in range(3)], RULES)
    assert fired(gm, "flatten_cats") == 0
    assert ops(gm, "cat") == 3


def test_inner_cat_with_other_users_is_kept() -> None:
    def f(self, x, y, z):  # type: ignore[no-untyped-def]
        inner = torch.cat([x, y], 1)
        return torch.cat([inner, z], 1), inner.sum()

    gm = run(f, [torch.randn(2, 2) for _ in range(3)], RULES)
    assert fired(gm, "flatten_cats") == 0


def test_mutated_inner_cat_does_not_flatten() -> None:
    def f(self, x, y, z):  # type: ignore[no-untyped-def]
        inner = torch.cat([x, y], 1)
        inner.add_(1.0)
        return torch.cat([inner, z], 1)

    gm = run(f, [torch.randn(2, 2) for _ in range(3)], RULES)
    assert fired(gm, "flatten_cats") == 0
    assert ops(gm, "cat") == 2
