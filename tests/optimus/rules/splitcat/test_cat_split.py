"""cat_split: a split of a cat along the same dim -> the cat's inputs (or a split of one input)."""

from __future__ import annotations

import pytest
import torch
from split_cat_helpers import fired, ops, run

RULES = ["cat_split"]


@pytest.mark.parametrize(
    ("shapes", "cat_dim", "split_dim"),
    [
        ([(4, 3), (4, 5)], 1, 1),
        ([(4, 3), (4, 5), (4, 2)], -1, 1),
        ([(2, 6), (3, 6)], 0, -2),
        ([(2, 1, 5), (2, 4, 5), (2, 2, 5)], 1, -2),
    ],
)
def test_exact_pieces_become_the_cat_inputs(shapes, cat_dim, split_dim) -> None:  # type: ignore[no-untyped-def]
    d = cat_dim % len(shapes[0])
    sizes = [s[d] for s in shapes]
    n = len(shapes)

    def f(self, x, y, z):  # type: ignore[no-untyped-def]
        ins = [x * 1.0, y * 2.0, z * 3.0][:n]
        parts = torch.split(torch.cat(ins, cat_dim), sizes, split_dim)
        return tuple(torch.tanh(parts[i]) for i in range(n))

    inputs = [torch.randn(s) for s in shapes] + [torch.randn(1)] * (3 - n)
    gm = run(f, inputs, RULES)
    assert fired(gm, "cat_split") == 1
    assert ops(gm, "cat") == 0 and ops(gm, "split") == 0


def test_finer_pieces_split_the_cat_input_instead() -> None:
    def f(self, x, y):  # type: ignore[no-untyped-def]
        parts = torch.split(torch.cat([x * 1.0, y * 2.0], -1), [8, 2, 2, 4], 1)
        return parts[0] + 1.0, parts[1] * parts[2], parts[3] * 2.0  # (returned raw: strides differ)

    gm = run(f, [torch.randn(3, 8), torch.randn(3, 8)], RULES)
    assert fired(gm, "cat_split") == 1
    assert ops(gm, "cat") == 0 and ops(gm, "split") == 1  # split(y, [2, 2, 4])


def test_cat_with_other_users_stays_and_split_goes() -> None:
    def f(self, x, y):  # type: ignore[no-untyped-def]
        c = torch.cat([x * 1.0, y * 2.0], 1)
        a, b = torch.split(c, [4, 6], 1)
        return a * b.sum(), c

    gm = run(f, [torch.randn(2, 4), torch.randn(2, 6)], RULES)
    assert fired(gm, "cat_split") == 1
    assert ops(gm, "cat") == 1 and ops(gm, "split") == 0


def _no_fire(f, inputs):  # type: ignore[no-untyped-def]
    gm = run(f, inputs, RULES)
    assert fired(gm, "cat_split") == 0
    assert ops(gm, "split") == 1
    return gm


def test_straddling_piece_does_not_fire() -> None:
    def f(self, x, y):  # type: ignore[no-untyped-def]
        a, b = torch.split(torch.cat([x * 1.0, y * 1.0], 1), [3, 7], 1)
        return a, b

    _no_fire(f, [torch.randn(2, 4), torch.randn(2, 6)])


def test_different_dims_do_not_fire() -> None:
    def f(self, x, y):  # type: ignore[no-untyped-def]
        a, b = torch.split(torch.cat([x * 1.0, y * 1.0], 1), 2, 0)
        return a, b

    _no_fire(f, [torch.randn(4, 4), torch.randn(4, 4)])


def test_mutated_cat_does_not_fire() -> None:
    def f(self, x, y):  # type: ignore[no-untyped-def]
        c = torch.cat([x * 1.0, y * 1.0], 1)
        c.add_(1.0)  # the pieces are no longer the cat's inputs
        a, b = torch.split(c, [4, 4], 1)
        return a * 2.0, b * 1.0

    _no_fire(f, [torch.randn(2, 4), torch.randn(2, 4)])


def test_would_return_a_model_input_itself_does_not_fire() -> None:
    def f(self, x, y):  # type: ignore[no-untyped-def]
        a, b = torch.split(torch.cat([x, y], 1), [4, 4], 1)
        return a, b

    _no_fire(f, [torch.randn(2, 4), torch.randn(2, 4)])


@pytest.mark.parametrize(
    "take",
    [
        lambda c: (c[:, 0:3], c[:, 3:8]),  # exactly the inputs
        lambda c: (c.narrow(1, 3, 2), torch.narrow(c, -1, 5, 3), c[:, :3]),  # inside one input
    ],
)
def test_slices_of_a_cat_read_its_inputs(take) -> None:  # type: ignore[no-untyped-def]
    def f(self, x, y):  # type: ignore[no-untyped-def]
        return tuple(t * 2.0 for t in take(torch.cat([x * 1.0, y * 1.0], 1)))

    gm = run(f, [torch.randn(2, 3), torch.randn(2, 5)], RULES)
    assert fired(gm, "cat_split") == 1  # all readers of the cat in one rewrite
    assert ops(gm, "cat") == 0


def test_readers_that_straddle_keep_the_cat_and_the_rest_still_move() -> None:
    def f(self, x, y):  # type: ignore[no-untyped-def]
        c = torch.cat([x * 1.0, y * 1.0], 1)
        return c[:, 2:5] * 2.0, c[:, 3:8] + 1.0  # the first straddles, the second is y

    gm = run(f, [torch.randn(2, 3), torch.randn(2, 5)], RULES)
    assert fired(gm, "cat_split") == 1 and ops(gm, "cat") == 1


def test_slice_straddling_two_cat_inputs_does_not_fire() -> None:
    def f(self, x, y):  # type: ignore[no-untyped-def]
        return torch.cat([x * 1.0, y * 1.0], 1)[:, 2:5] * 2.0

    gm = run(f, [torch.randn(2, 3), torch.randn(2, 5)], RULES)
    assert fired(gm, "cat_split") == 0 and ops(gm, "cat") == 1


def test_mixed_dtype_cat_promotes_so_pieces_are_not_its_inputs() -> None:
    def f(self, x, y):  # type: ignore[no-untyped-def]
        a, b = torch.split(torch.cat([x * 1.0, y.double()], 1), [3, 5], 1)
        return a, b, torch.cat([x * 1.0, y.double()], 1)[:, :3]

    gm = run(f, [torch.randn(2, 3), torch.randn(2, 5)], RULES)
    assert fired(gm, "cat_split") == 0
