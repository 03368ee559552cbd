"""The split/cat pattern classes Inductor's pre-grad passes fuse (the classes of PyTorch's own
``test/inductor/test_split_cat_fx_passes.py``), each as a small case of our own, through
``optimus.optimize`` with the default cost model: fused here too, declined by the cost model (the
report counts it), left alone where it must be (a mutated piece), or a known gap. Every case
matches eager in values, gradients and layout. docs/optimus.md ("Inductor's split/cat pattern
classes") has the table; a gap that gets fixed fails its test here, so the table stays true."""

from __future__ import annotations

from collections.abc import Callable

import pytest
import torch
from layout_helpers import assert_same_results
from optimus_helpers import assert_parity
from split_cat_helpers import ops
from torch import nn

import optimus

KINDS = ("split", "cat", "stack", "unbind", "squeeze")


def _ones(*shape: int) -> torch.Tensor:
    return torch.ones(*shape)


def normalization(x):  # type: ignore[no-untyped-def]
    return [torch.relu(s) for s in torch.split(tensor=x, split_size_or_sections=2, dim=-1)]


def consecutive_splits(x):  # type: ignore[no-untyped-def]
    return [torch.relu(t) for s in torch.split(x, [16, 16], 1) for t in torch.split(s, 4, 1)]


def split_cat_round_trip(x):  # type: ignore[no-untyped-def]
    return torch.cat(torch.split(x, 4, dim=1), dim=1) * 2


def split_stack(x):  # type: ignore[no-untyped-def]
    return torch.stack(torch.split(x, 4, dim=1), dim=1) * 2


def split_cat_other_dim(x):  # type: ignore[no-untyped-def]
    return torch.cat(torch.split(x, 4, dim=1), dim=2) * 2


def split_inside_bigger_cat(x):  # type: ignore[no-untyped-def]
    return torch.cat([_ones(2, 5, 8, 4), *torch.split(x, 4, dim=1), _ones(2, 6, 8, 4)], dim=1) * 2


def reordered_runs(x):  # type: ignore[no-untyped-def]
    p = torch.split(x, 4, dim=1)
    return torch.cat([_ones(2, 4, 8, 4), p[1], p[2], p[3], _ones(2, 4, 8, 4), p[5], p[6], p[7]], 1) * 2


def size1_split_squeeze(x):  # type: ignore[no-untyped-def]
    return torch.stack([torch.squeeze(s, 1) for s in torch.split(x, 1, dim=1)]) * 2


def unbind_stack(x):  # type: ignore[no-untyped-def]
    return torch.stack(torch.unbind(x, 1), 1) * 2


def unbind_stack_other_dim(x):  # type: ignore[no-untyped-def]
    return torch.stack(torch.unbind(x, dim=1), 0) * 2


def unbind_cat(x):  # type: ignore[no-untyped-def]
    return torch.cat(torch.unbind(x, dim=1), 1) * 2


def unbind_inside_bigger_cat(x):  # type: ignore[no-untyped-def]
    return torch.cat([_ones(2, 8, 4), *torch.unbind(x, dim=1), _ones(2, 8, 4)], dim=1) * 2


def unbind_inside_bigger_stack(x):  # type: ignore[no-untyped-def]
    return torch.stack([_ones(2, 8, 4), *torch.unbind(x, dim=1), _ones(2, 8, 4)], dim=1) * 2


def cat_then_split(x):  # type: ignore[no-untyped-def]
    a = torch.split(x * 2, [8, 8, 16], 1)
    b = torch.split(torch.cat([a[0], a[1]], 1), [4, 12], 1)
    return torch.cat([b[0], b[1], a[2]], 1) + 1


def numpy_compat_kwargs(x):  # type: ignore[no-untyped-def]
    return torch.concatenate(torch.split(x, 4, 1), axis=1) * 2


def mutated_piece(x):  # type: ignore[no-untyped-def]
    s = torch.split(x * 1.0, 4, dim=1)
    s[1].copy_(s[0])
    return torch.cat(s, dim=1)


def aten_calls(x):  # type: ignore[no-untyped-def]
    s = torch.ops.aten.split.Tensor(x * 2, 4, 1)
    return torch.ops.aten.cat.default(list(s), 1) + 1


def split_reshape_stack(x):  # type: ignore[no-untyped-def]
    return torch.stack([s.reshape(2, -1) for s in torch.split(x, 4, 1)], 1) * 2


BIG, FLAT, SMALL, UNB = (2, 32, 8, 4), (4, 32), (2, 6), (2, 6, 8, 4)
# case, input shape, outcome, rule (fused: the rule that fires; declined: the one the cost model
# declines), the split/cat-family ops that must be gone ("fused")
CASES: list[tuple[Callable[..., object], tuple[int, ...], str, str, tuple[str, ...]]] = [
    (normalization, FLAT, "fused", "normalize_split_cat", ("split",)),
    (consecutive_splits, FLAT, "fused", "merge_splits", ("split",)),
    (split_cat_round_trip, BIG, "fused", "split_cat", ("split", "cat")),
    (split_stack, BIG, "fused", "stack_pieces", ("split", "stack")),
    (split_cat_other_dim, BIG, "fused", "cat_pieces", ("split", "cat")),
    (split_inside_bigger_cat, BIG, "fused", "split_cat", ("split",)),
    (reordered_runs, BIG, "declined", "split_cat", ()),
    (size1_split_squeeze, SMALL, "fused", "split_squeeze", ("split", "squeeze", "stack")),
    (unbind_stack, UNB, "fused", "stack_unbind", ("unbind", "stack")),
    (unbind_stack_other_dim, UNB, "fused", "stack_unbind", ("unbind", "stack")),
    (unbind_cat, UNB, "fused", "unbind_cat", ("unbind", "cat")),
    (unbind_inside_bigger_cat, UNB, "fused", "unbind_cat", ("unbind",)),
    (unbind_inside_bigger_stack, UNB, "declined", "stack_unbind", ()),
    (cat_then_split, FLAT, "fused", "split_cat", ()),
    (numpy_compat_kwargs, BIG, "fused", "split_cat", ("split", "cat")),
    (mutated_piece, BIG, "left alone", "", ()),
    (aten_calls, BIG, "fused", "split_cat", ("split", "cat")),
    (split_reshape_stack, BIG, "fused", "reshape_pieces", ("split", "stack")),
]


class Case(nn.Module):
    def __init__(self, fn: Callable[..., object]) -> None:
        super().__init__()
        self.fn = fn

    def forward(self, x: torch.Tensor) -> object:
        return self.fn(x)


@pytest.mark.parametrize(
    ("fn", "shape", "outcome", "rule", "gone"), CASES, ids=[c[0].__name__ for c in CASES]
)
def test_inductor_pattern_class(
    fn: Callable[..., object], shape: tuple[int, ...], outcome: str, rule: str, gone: tuple[str, ...]
) -> None:
    torch.manual_seed(0)
    x = torch.randn(shape)
    model = Case(fn)
    plain = optimus.optimize(model, (x,), rules=[])
    gm = optimus.optimize(model, (x,))
    report = gm.optimus_report
    before = {k: ops(plain, k) for k in KINDS}
    after = {k: ops(gm, k) for k in KINDS}
    family = {r for r in report.rules_fired if r not in ("cse", "dce", "normalize_split_cat")}
    if outcome == "fused":
        assert report.rules_fired.get(rule, 0) > 0, report.rules_fired
        for kind in gone:
            assert before[kind] > 0 and after[kind] == 0, (kind, before, after)
        assert after != before or not gone, (before, after)
    elif outcome == "declined":
        assert report.declined.get(rule, 0) > 0, (report.declined, report.rules_fired)
        assert after == before
    else:  # left alone (must not fire) or a known gap: nothing of the family fires
        assert family == set(), report.rules_fired
        assert after == before
    if fn is not mutated_piece:
        assert_parity(model, gm, [x])
    assert_same_results(fn(x.clone()), gm(x.clone()), sources=[])
