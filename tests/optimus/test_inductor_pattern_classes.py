"""The split/cat pattern classes Inductor's pre-grad passes fuse (the classes of PyTorch's own
``test/inductor/test_split_cat_fx_passes.py``), each as small cases of our own, through
``optimus.optimize`` with the default cost model: fused here too, declined by the cost model (the
report counts it), left alone where it must be (a mutated piece, permuted pieces), or a known
gap. Every case matches eager in values, gradients, layout and aliasing (many read the model
input itself, so a round trip must not hand it back). docs/optimus.md ("Inductor's split/cat
pattern classes") has the table; each case names its row, ``test_every_case_is_in_the_docs_table``
checks that the row says what the case finds, and a gap that gets fixed fails its test here, so
the table stays true."""

from __future__ import annotations

import pathlib
from collections.abc import Callable
from dataclasses import dataclass

import pytest
import torch
from layout_helpers import assert_same_results
from optimus_helpers import assert_parity
from split_cat_helpers import op_name, ops
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


def split_reshape_cat(x):  # type: ignore[no-untyped-def]
    return torch.cat([s.reshape(2, -1) for s in torch.split(x, 4, 1)], 1)


# -- cases of the older issue-19 branch (327df4c) that the ones above did not cover ----------------
def norm_method_kwargs_negative_dim(x):  # type: ignore[no-untyped-def]
    return [p.tanh() for p in x.split(split_size=5, dim=-1)]  # 5, 5, 2: the last piece is short


def nested_unequal_splits(x):  # type: ignore[no-untyped-def]
    a, b, c = torch.split(x, [8, 10, 12], dim=1)
    return [p.sigmoid() for p in [*a.split([3, 5], 1), *b.split([6, 4], 1), *c.split([4, 4, 4], -1)]]


def nested_splits_on_other_dims(x):  # type: ignore[no-untyped-def]
    return [q for p in torch.split(x, 6, dim=1) for q in torch.split(p, 2, dim=0)]


def nested_split_pieces_glued_back(x):  # type: ignore[no-untyped-def]
    a, b, c = torch.split(x, [3, 3, 24], dim=1)
    return torch.cat([a, b, *c.split([6, 6, 6, 6], 1)], dim=1) * 2.0


def nested_split_pieces_reordered(x):  # type: ignore[no-untyped-def]
    a, b, c, d = torch.split(x, [3, 3, 4, 20], dim=1)
    return torch.cat([a, c, b, *d.split([5, 5, 10], 1)], dim=1) + 1.0


def split_run_in_cat_on_other_dim(x):  # type: ignore[no-untyped-def]
    return torch.cat([_ones(2, 2, 3, 2), *torch.split(x, 2, dim=1), _ones(2, 2, 3, 2)], dim=2)


def split_pieces_swapped(x):  # type: ignore[no-untyped-def]
    a, b = torch.split(x, 4, dim=1)
    return torch.cat([b, a], dim=1)


def split_cat_and_a_returned_piece(x):  # type: ignore[no-untyped-def]
    p = torch.split(x, 4, dim=1)
    return torch.cat(p, dim=1), p[0]  # the cat must stay fresh: not x, not sharing p[0]'s memory


def split_stack_other_dim(x):  # type: ignore[no-untyped-def]
    return torch.stack(torch.split(x, 2, dim=1), 3)


def split_run_in_bigger_stack(x):  # type: ignore[no-untyped-def]
    return torch.stack([_ones(2, 2, 3, 2), *torch.split(x, 2, dim=1), _ones(2, 2, 3, 2)], dim=1)


def split_runs_in_one_stack(x):  # type: ignore[no-untyped-def]
    p = torch.split(x, 2, dim=1)
    return torch.stack([p[0].clone(), p[1].clone(), *p, p[2] * 2.0], dim=2)


def unit_split_method_squeeze_stack_same_dim(x):  # type: ignore[no-untyped-def]
    return torch.stack([p.squeeze(dim=1) for p in x.split(1, dim=1)], 1)


def unit_split_piece_read_unsqueezed(x):  # type: ignore[no-untyped-def]
    items = torch.split(x, 1, dim=1)
    return torch.stack([p.squeeze(1) for p in items]), items[0].relu()


def unit_split_squeezed_on_other_dim(x):  # type: ignore[no-untyped-def]
    return torch.stack([torch.squeeze(p, 0) for p in torch.split(x, 1, dim=1)])


def unit_split_squeezed_piece_written(x):  # type: ignore[no-untyped-def]
    rows = [p.squeeze(1) for p in torch.split(x * 1, 1, dim=1)]
    rows[0].add_(1)
    return torch.stack(rows)


def unbind_stack_round_trip(x):  # type: ignore[no-untyped-def]
    return torch.stack(torch.unbind(x, 1), 1)  # of the model input: one fresh clone, never x


def unbind_cat_same_position(x):  # type: ignore[no-untyped-def]
    return torch.cat(torch.unbind(x, dim=-3), 1)  # of the model input: cloned, then flattened


def unbind_pieces_reversed(x):  # type: ignore[no-untyped-def]
    p = torch.unbind(x * 2.0, 0)
    return torch.stack([p[1], p[0]], 0)


def unbind_run_in_one_stack(x):  # type: ignore[no-untyped-def]
    u = torch.unbind(x.view(10, 4, 6), 1)
    return torch.stack([u[0].clone(), *u, u[1].clone()], 1)


def cat_of_pieces_resplit(x):  # type: ignore[no-untyped-def]
    p = torch.split(x, [20, 5, 5, 2, 2, 2, 4], 1)
    q = torch.split(torch.cat((p[0], p[1]), 1), [5, 12, 8], 1)
    return torch.cat([q[0], q[1], q[2], p[2], p[3], p[4]], 1)


def cat_of_every_piece_beside_partials(x):  # type: ignore[no-untyped-def]
    p = torch.split(x, [10, 10, 4, 4, 4, 8], 0)
    q = torch.split(torch.cat((p[0], p[1]), 0), [5, 7, 8], 0)
    return torch.cat((torch.cat([q[0], q[1], q[2], p[2], p[3]], 0), torch.cat(p, 0)), 0)


def cat_of_some_pieces_reordered(x):  # type: ignore[no-untyped-def]
    p = torch.split(x, [10, 10, 4, 4, 4, 8], 0)
    return torch.cat((torch.cat((p[3], p[4], p[5], p[2]), 0), p[0] * 2.0), 0)


def runs_of_two_splits_in_one_cat(x):  # type: ignore[no-untyped-def]
    p = torch.split(x * 2.0, 4, 0)
    q = torch.split(x * 3.0, 8, 0)
    return torch.cat([p[0].clone(), *p, *q[2:], *q[:2]], 0)


def unbind_runs_in_one_cat(x):  # type: ignore[no-untyped-def]
    u = torch.unbind(x.view(4, 10, 3), 0)
    return torch.cat([u[0], u[1], u[2], u[3].clone(), *u], 1)


def reshaped_pieces_in_bigger_stack(x):  # type: ignore[no-untyped-def]
    r = [t.reshape(-1, 4) for t in torch.split(x.view(80, 3), 1, 1)]
    return torch.stack([r[0].clone(), *r, r[2].clone()], 0)


def aten_split_then_cat(x):  # type: ignore[no-untyped-def]
    p = torch.ops.aten.split.Tensor(x, 2, 1)  # of the model input: the cat stays fresh
    return torch.ops.aten.cat.default([p[0], p[1], p[2], p[3]], 1)


def aten_unbind_then_stack(x):  # type: ignore[no-untyped-def]
    return torch.ops.aten.stack.default(list(torch.ops.aten.unbind.int(x, 0)), 0)


def numpy_axis_stack_unbind_cat(x):  # type: ignore[no-untyped-def]
    a = torch.stack([x, x * 2.0], axis=1)
    return torch.cat(torch.unbind(a, axis=1), axis=1)


@dataclass(frozen=True)
class Case:
    fn: Callable[..., object]
    shape: tuple[int, ...]
    outcome: str  # "fused" | "declined" | "left alone" | "gap"
    rule: str  # fused: a rule that fires; declined: the one the cost model declines
    gone: tuple[str, ...]  # fused: split/cat-family ops that must be gone (none listed: fewer)
    klass: str  # the row of the docs table
    dtype: torch.dtype = torch.float32


# the docs table's rows (first column), by short name
K = {
    "norm": "split call forms: kwargs, negative dims, sizes (`normalization_pass`)",
    "merge": "consecutive splits (`merge_splits_pass`)",
    "merge_other": "consecutive splits on another dim (`merge_splits_pass`)",
    "merge_cat": "consecutive splits, then a cat of their pieces (`merge_splits_pass`, `split_cat_pass`)",
    "round": "split -> cat round trip, same dim (`split_cat_pass`)",
    "returned": "split -> cat with a piece returned too (real aliasing)",
    "stack": "split -> stack (`split_cat_pass`)",
    "stack_other": "split -> stack on another dim (`split_cat_pass`)",
    "cat_other": "split -> cat on another dim (`split_cat_pass`, dim mismatch)",
    "cat_other_inside": "split pieces inside a cat with other tensors, on another dim (`split_cat_pass`)",
    "inside": "split pieces inside a cat with other tensors (`merge_getitem_cat_pass`)",
    "reordered": "reordered runs of pieces with other tensors (`split_cat_pass`, input shuffling)",
    "squeeze": "size-1 split + squeeze, then stack (`split_cat_pass`, split squeeze)",
    "squeeze_kept": "size-1 split squeezed on another dim, or a squeezed piece written in place",
    "unbind_stack": "unbind -> stack, same and another dim (`unbind_stack_pass`)",
    "unbind_cat": "unbind -> cat, alone or inside a bigger cat (`unbind_stack_pass`)",
    "unbind_inside": "unbind pieces inside a bigger stack (`unbind_stack_pass`, `unbind_stack_to_slices_pass`)",
    "unbind_cat_view": "unbind runs with other tensors in one cat (`unbind_cat_to_view_pass`)",
    "split_in_stack": "split pieces inside a bigger stack (`split_cat_pass`, `split_stack_to_cats_pass`)",
    "cat_split_cat": "cat -> split -> cat (`split_cat_pass`, new patterns; `merge_getitem_cat_pass`, `mutate_cat_pass`)",
    "cat_some": "a cat of some pieces, reordered, in another cat (`mutate_cat_pass`)",
    "slices": "runs of two splits in one cat (`split_cat_to_slices_pass`)",
    "numpy": "numpy-style kwargs (`axis=`; `numpy_compat_normalization`)",
    "mutated": "a piece written in place before the cat (`test_split_cat_merge_mutation`)",
    "permuted": "permuted pieces (split -> cat, unbind -> stack)",
    "aten": "`torch.ops.aten.split` / `aten.cat` / `aten.unbind` / `aten.stack` written directly",
    "reshape": "split -> per-piece reshape -> stack or cat (`move_reshape_out_of_split_stack`)",
    "reshape_inside": "per-piece reshapes inside a bigger stack (`move_reshape_out_of_split_stack`)",
}

BIG, FLAT, SMALL, UNB = (2, 32, 8, 4), (4, 32), (2, 6), (2, 6, 8, 4)
CASES: list[Case] = [
    Case(normalization, FLAT, "fused", "normalize_split_cat", ("split",), K["norm"]),
    Case(norm_method_kwargs_negative_dim, (2, 12), "fused", "normalize_split_cat", (), K["norm"]),
    Case(consecutive_splits, FLAT, "fused", "merge_splits", ("split",), K["merge"]),
    Case(nested_unequal_splits, (2, 30), "fused", "merge_splits", (), K["merge"]),
    Case(nested_splits_on_other_dims, (4, 12), "left alone", "", (), K["merge_other"]),
    Case(nested_split_pieces_glued_back, (2, 30), "fused", "merge_splits", ("split", "cat"), K["merge_cat"]),
    Case(nested_split_pieces_reordered, (2, 30), "fused", "split_cat", (), K["merge_cat"]),
    Case(split_cat_round_trip, BIG, "fused", "split_cat", ("split", "cat"), K["round"]),
    Case(split_cat_and_a_returned_piece, (2, 8), "fused", "split_cat", ("cat",), K["returned"]),
    Case(split_stack, BIG, "fused", "stack_pieces", ("split", "stack"), K["stack"]),
    Case(split_stack_other_dim, (2, 8, 3, 2), "declined", "stack_pieces", (), K["stack_other"]),
    Case(split_cat_other_dim, BIG, "fused", "cat_pieces", ("split", "cat"), K["cat_other"]),
    Case(split_run_in_cat_on_other_dim, (2, 8, 3, 2), "declined", "cat_pieces", (), K["cat_other_inside"]),
    Case(split_inside_bigger_cat, BIG, "fused", "split_cat", ("split",), K["inside"]),
    Case(reordered_runs, BIG, "declined", "split_cat", (), K["reordered"]),
    Case(size1_split_squeeze, SMALL, "fused", "split_squeeze", ("split", "squeeze", "stack"), K["squeeze"]),
    Case(
        unit_split_method_squeeze_stack_same_dim,
        (3, 5),
        "fused",
        "stack_unbind",
        ("split", "squeeze", "stack"),
        K["squeeze"],
    ),
    Case(
        unit_split_piece_read_unsqueezed, SMALL, "fused", "split_squeeze", ("squeeze", "stack"), K["squeeze"]
    ),
    Case(unit_split_squeezed_on_other_dim, (1, 6), "left alone", "", (), K["squeeze_kept"]),
    Case(
        unit_split_squeezed_piece_written, (2, 4), "left alone", "", (), K["squeeze_kept"], dtype=torch.int64
    ),
    Case(unbind_stack, UNB, "fused", "stack_unbind", ("unbind", "stack"), K["unbind_stack"]),
    Case(unbind_stack_other_dim, UNB, "fused", "stack_unbind", ("unbind", "stack"), K["unbind_stack"]),
    Case(unbind_stack_round_trip, (3, 4, 5), "fused", "stack_unbind", ("unbind", "stack"), K["unbind_stack"]),
    Case(unbind_cat, UNB, "fused", "unbind_cat", ("unbind", "cat"), K["unbind_cat"]),
    Case(unbind_cat_same_position, (3, 4, 5, 2), "fused", "unbind_cat", ("unbind", "cat"), K["unbind_cat"]),
    Case(unbind_inside_bigger_cat, UNB, "fused", "unbind_cat", ("unbind",), K["unbind_cat"]),
    Case(unbind_inside_bigger_stack, UNB, "declined", "stack_unbind", (), K["unbind_inside"]),
    Case(unbind_run_in_one_stack, (40, 6), "declined", "stack_unbind", (), K["unbind_inside"]),
    Case(unbind_runs_in_one_cat, (40, 3), "declined", "unbind_cat", (), K["unbind_cat_view"]),
    Case(split_run_in_bigger_stack, (2, 8, 3, 2), "declined", "stack_pieces", (), K["split_in_stack"]),
    Case(split_runs_in_one_stack, (40, 6), "declined", "stack_pieces", (), K["split_in_stack"]),
    Case(cat_then_split, FLAT, "fused", "split_cat", (), K["cat_split_cat"]),
    Case(cat_of_pieces_resplit, (4, 40), "fused", "split_cat", ("split",), K["cat_split_cat"]),
    Case(cat_of_every_piece_beside_partials, (40, 3), "fused", "split_cat", ("split",), K["cat_split_cat"]),
    Case(cat_of_some_pieces_reordered, (40, 3), "declined", "split_cat", (), K["cat_some"]),
    Case(runs_of_two_splits_in_one_cat, (40, 3), "fused", "split_cat", (), K["slices"]),
    Case(numpy_compat_kwargs, BIG, "fused", "split_cat", ("split", "cat"), K["numpy"]),
    Case(numpy_axis_stack_unbind_cat, (4, 3), "fused", "unbind_cat", ("unbind", "cat"), K["numpy"]),
    Case(mutated_piece, BIG, "left alone", "", (), K["mutated"]),
    Case(split_pieces_swapped, (2, 8), "left alone", "", (), K["permuted"]),
    Case(unbind_pieces_reversed, (2, 3), "left alone", "", (), K["permuted"]),
    Case(aten_calls, BIG, "fused", "split_cat", ("split", "cat"), K["aten"]),
    Case(aten_split_then_cat, (4, 8), "fused", "split_cat", ("split", "cat"), K["aten"]),
    Case(aten_unbind_then_stack, (4, 8), "fused", "stack_unbind", ("unbind", "stack"), K["aten"]),
    Case(split_reshape_stack, BIG, "fused", "reshape_pieces", ("split", "stack"), K["reshape"]),
    Case(split_reshape_cat, BIG, "fused", "reshape_pieces", ("split", "cat"), K["reshape"]),
    Case(reshaped_pieces_in_bigger_stack, (40, 6), "declined", "reshape_pieces", (), K["reshape_inside"]),
]


class Module(nn.Module):
    def __init__(self, fn: Callable[..., object]) -> None:
        super().__init__()
        self.fn = fn

    def forward(self, x: torch.Tensor) -> object:
        return self.fn(x)


def _canonical_split(n: object) -> bool:
    """torch.split(x, [int sizes], dim=d) with d >= 0 (what normalize_split_cat writes)."""
    args, kwargs = n.args, n.kwargs  # type: ignore[attr-defined]
    sizes = args[1] if len(args) > 1 else None
    dim = args[2] if len(args) > 2 else kwargs.get("dim", 0)
    return (
        n.target is torch.split  # type: ignore[attr-defined]
        and isinstance(sizes, list)
        and all(type(v) is int for v in sizes)
        and type(dim) is int
        and dim >= 0
    )


@pytest.mark.parametrize("c", CASES, ids=[c.fn.__name__ for c in CASES])
def test_inductor_pattern_class(c: Case) -> None:
    torch.manual_seed(0)
    x = torch.randn(c.shape) if c.dtype.is_floating_point else torch.randint(-5, 5, c.shape, dtype=c.dtype)
    model = Module(c.fn)
    plain = optimus.optimize(model, (x,), rules=[])
    gm = optimus.optimize(model, (x,))
    report = gm.optimus_report
    assert report.rolled_back == {}, report.rolled_back
    before = {k: ops(plain, k) for k in KINDS}
    after = {k: ops(gm, k) for k in KINDS}
    family = {r for r in report.rules_fired if r not in ("cse", "dce", "normalize_split_cat")}
    if c.outcome == "fused":
        assert report.rules_fired.get(c.rule, 0) > 0, report.rules_fired
        for kind in c.gone:
            assert before[kind] > 0 and after[kind] == 0, (kind, before, after)
        if not c.gone and c.rule == "normalize_split_cat":  # every split in its canonical form
            splits = [n for n in gm.graph.nodes if op_name(n) == "split"]
            assert splits and all(_canonical_split(n) for n in splits), [n.format_node() for n in splits]
        elif not c.gone:
            assert sum(after.values()) < sum(before.values()), (before, after)
    elif c.outcome == "declined":
        assert report.declined.get(c.rule, 0) > 0, (report.declined, report.rules_fired)
        assert c.rule not in report.rules_fired, report.rules_fired
    else:  # left alone (must not fire) or a known gap: nothing of the family fires
        assert family == set(), report.rules_fired
        assert after == before
    if c.fn is not mutated_piece and c.dtype.is_floating_point:
        assert_parity(model, gm, [x])
    assert_same_results(c.fn(x.clone()), gm(x.clone()), sources=[])
    # and on the model input itself: a result shares memory with x exactly where eager's does
    assert_same_results(c.fn(x), gm(x), sources=[x])


def _table() -> dict[str, str]:
    doc = (pathlib.Path(__file__).parents[2] / "docs" / "optimus.md").read_text()
    section = doc.split("## Inductor's split/cat pattern classes", 1)[1].split("\n## ", 1)[0]
    rows = {}
    for line in section.splitlines():
        cells = [cell.strip() for cell in line.strip().strip("|").split(" | ")]
        if line.startswith("| ") and len(cells) == 2 and cells[0] not in ("class (Inductor pass)", "---"):
            rows[cells[0]] = cells[1]
    return rows


def test_every_case_is_in_the_docs_table() -> None:
    """Each case's row says what the case finds (its outcome and rule), and no row is left
    without a case."""
    rows = _table()
    for c in CASES:
        assert c.klass in rows, c.klass
        here = rows[c.klass]
        assert here.startswith(c.outcome), (c.fn.__name__, here)
        if c.rule:
            assert f"`{c.rule}`" in here or f'["{c.rule}"]' in here, (c.fn.__name__, c.rule, here)
    assert set(rows) == {c.klass for c in CASES}, set(rows) ^ {c.klass for c in CASES}
