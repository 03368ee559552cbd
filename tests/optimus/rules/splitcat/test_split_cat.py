"""split_cat: cat of split pieces on the same dim -> the input (all pieces) or a narrow view (a run)."""

from __future__ import annotations

import pytest
import torch
from optimus_helpers import LAUNCH_BOUND, assert_parity
from split_cat_helpers import fired, ops, run
from torch import fx

import optimus

RULES = ["split_cat"]


@pytest.mark.parametrize(
    ("shape", "split_dim", "cat_dim", "sizes"),
    [
        ((4, 8), 1, 1, 2),
        ((4, 8), 1, -1, [3, 5]),
        ((6, 4), -2, 0, [1, 2, 3]),
        ((2, 3, 10), -1, 2, 5),
        ((2, 9, 3), 1, -2, [4, 4, 1]),
    ],
)
def test_full_round_trip_becomes_the_input(shape, split_dim, cat_dim, sizes) -> None:  # type: ignore[no-untyped-def]
    count = len(torch.split(torch.empty(shape), sizes, split_dim))

    def f(self, x):  # type: ignore[no-untyped-def]
        y = x * 2.0
        parts = torch.split(y, sizes, split_dim)
        return torch.cat([parts[i] for i in range(count)], cat_dim) + 1.0

    gm = run(f, [torch.randn(shape)], RULES)
    assert fired(gm, "split_cat") == 1
    assert ops(gm, "cat") == 0 and ops(gm, "split") == 0


def test_chunk_and_method_forms_round_trip() -> None:
    def f(self, x):  # type: ignore[no-untyped-def]
        y = x.tanh()
        a = torch.cat(y.chunk(3, dim=-1), 1)  # 8 -> 3, 3, 2
        b = torch.cat(torch.tensor_split(y, 3, 1), dim=-1)
        return a + b

    gm = run(f, [torch.randn(4, 8)], RULES)
    assert fired(gm, "split_cat") == 2
    assert ops(gm, "cat") == 0


@pytest.mark.parametrize(("shape", "dim"), [((4, 12), 1), ((12, 3), 0), ((2, 12, 2), -2)])
def test_contiguous_run_becomes_a_view(shape, dim) -> None:  # type: ignore[no-untyped-def]
    def f(self, x):  # type: ignore[no-untyped-def]
        y = x * 3.0
        p = torch.split(y, [2, 3, 4, 3], dim)
        # (* 2.0: a returned narrow view would have other strides than the cat; a pointwise
        # op makes both contiguous, so the view is allowed)
        return torch.cat([p[1], p[2]], dim) * 2.0, p[0] + 1.0, p[3]

    gm = run(f, [torch.randn(shape)], RULES)
    assert fired(gm, "split_cat") == 1
    assert ops(gm, "cat") == 0 and ops(gm, "narrow") == 1
    assert ops(gm, "split") == 1  # p[0] and p[3] still read the split


def test_other_users_of_pieces_keep_working() -> None:
    def f(self, x):  # type: ignore[no-untyped-def]
        y = x + 1.0
        p = torch.split(y, 4, 1)
        side = torch.relu(p[0]) * p[2]  # pieces also read elsewhere
        return torch.cat([p[0], p[1], p[2]], 1) * 2.0, side

    gm = run(f, [torch.randn(3, 12)], RULES)
    assert fired(gm, "split_cat") == 1
    assert ops(gm, "cat") == 0 and ops(gm, "split") == 1


def test_whole_split_tuple_passed_to_cat() -> None:
    def f(self, x):  # type: ignore[no-untyped-def]
        return torch.cat(torch.split(x * 2.0, 3, -1), dim=1)  # traced: cat reads the tuple itself

    gm = run(f, [torch.randn(2, 9)], RULES)
    assert fired(gm, "split_cat") == 1
    assert ops(gm, "cat") == 0


def _no_fire(f, shape=(4, 12)):  # type: ignore[no-untyped-def]
    gm = run(f, [torch.randn(shape)], RULES)
    assert fired(gm, "split_cat") == 0
    assert ops(gm, "cat") >= 1
    return gm


def test_different_dims_do_not_fire() -> None:
    _no_fire(lambda self, x: torch.cat(torch.split(x * 1.0, 6, 0), 1), shape=(12, 12))


def test_permuted_order_does_not_fire() -> None:
    def f(self, x):  # type: ignore[no-untyped-def]
        p = torch.split(x * 1.0, 4, 1)
        return torch.cat([p[1], p[0], p[2]], 1)

    _no_fire(f)


def test_gap_or_repeat_does_not_fire() -> None:
    def f(self, x):  # type: ignore[no-untyped-def]
        p = torch.split(x * 1.0, 3, 1)
        return torch.cat([p[0], p[2]], 1), torch.cat([p[1], p[1]], 1)

    _no_fire(f)


def test_pieces_of_two_different_splits_do_not_fire() -> None:
    def f(self, x):  # type: ignore[no-untyped-def]
        a = torch.split(x * 1.0, 6, 1)
        b = torch.split(x * 2.0, 6, 1)
        return torch.cat([a[0], b[1]], 1)

    _no_fire(f)


def test_input_mutated_after_the_cat_does_not_fire() -> None:
    def f(self, x):  # type: ignore[no-untyped-def]
        y = x * 1.0
        p = torch.split(y, 6, 1)
        out = torch.cat([p[0], p[1]], 1)  # a snapshot of y before the add_
        y.add_(1.0)
        return out, y

    _no_fire(f)


def test_cat_result_mutated_does_not_fire() -> None:
    def f(self, x):  # type: ignore[no-untyped-def]
        y = x * 1.0
        p = torch.split(y, 6, 1)
        out = torch.cat([p[0], p[1]], 1)
        out.mul_(3.0)  # must not write into y
        return out, y

    _no_fire(f)


def test_would_return_the_model_input_itself_becomes_a_fresh_copy() -> None:
    """The caller must not get its own input back: one contiguous clone replaces split + cat."""

    def f(self, x):  # type: ignore[no-untyped-def]
        return torch.cat(torch.split(x, 4, 1), 1)

    x = torch.randn(3, 8)
    gm = run(f, [x], RULES)
    assert fired(gm, "split_cat") == 1
    targets = [n.target for n in gm.graph.nodes if n.op == "call_function"]
    assert targets == [torch.clone], targets
    out = gm(x)
    assert out.untyped_storage().data_ptr() != x.untyped_storage().data_ptr()
    assert out.is_contiguous()
    torch.testing.assert_close(out, x, rtol=0, atol=0)


def test_would_return_a_strided_input_as_a_contiguous_copy() -> None:
    """``cat`` of the pieces of ``x.t()`` is contiguous in eager; the clone keeps that layout."""

    def f(self, x):  # type: ignore[no-untyped-def]
        return torch.cat(torch.split(x.t(), 2, 1), 1)

    x = torch.randn(4, 6)
    gm = run(f, [x], RULES)
    assert fired(gm, "split_cat") == 1
    out, want = gm(x), f(None, x)
    assert out.stride() == want.stride() and out.is_contiguous()
    assert out.untyped_storage().data_ptr() != x.untyped_storage().data_ptr()
    torch.testing.assert_close(out, want, rtol=0, atol=0)


def test_default_cost_model_fires_on_a_round_trip() -> None:
    def f(self, x):  # type: ignore[no-untyped-def]
        return torch.cat(torch.split(x * 2.0, 16, 1), 1) + 1.0

    gm = run(f, [torch.randn(8, 64)], RULES, cost_model=optimus.AnalyticCostModel())
    assert fired(gm, "split_cat") == 1


def test_graph_has_no_leftover_nodes() -> None:
    def f(self, x):  # type: ignore[no-untyped-def]
        return torch.cat(torch.split(x * 2.0, 2, 1), 1) + 1.0

    gm = run(f, [torch.randn(3, 8)], RULES)
    targets = [n.target for n in gm.graph.nodes if n.op == "call_function"]
    assert len(targets) == 2, targets  # mul, add
    assert isinstance(gm, fx.GraphModule)


def test_long_run_inside_a_longer_cat_becomes_one_view() -> None:
    def f(self, x):  # type: ignore[no-untyped-def]
        p = torch.split(x * 1.0, 1, -1)
        return torch.cat([p[0].relu(), *[p[i] for i in range(1, 9)], p[9].tanh()], -1)

    gm = run(f, [torch.randn(3, 10)], RULES)
    assert fired(gm, "split_cat") == 1
    (cat,) = [n for n in gm.graph.nodes if n.target is torch.cat]
    assert len(cat.args[0]) == 3 and ops(gm, "narrow") == 1


def test_short_run_inside_a_longer_cat_does_not_pay() -> None:
    def f(self, x):  # type: ignore[no-untyped-def]
        p = torch.split(x * 1.0, 2, 1)
        return torch.cat([p[0].relu(), p[1], p[2], p[3].tanh()], 1)

    gm = run(f, [torch.randn(3, 8)], RULES)
    assert fired(gm, "split_cat") == 0
    assert gm.optimus_report.declined.get("split_cat") == 1


@pytest.mark.parametrize(
    ("pieces", "dim", "full"),
    [
        (lambda y: [y[:, :4], y[:, 4:]], 1, True),  # basic slices
        (lambda y: [y[:, 0:3], y.narrow(1, 3, 2), torch.narrow(y, -1, 5, 3)], -1, True),  # mixed forms
        (lambda y: [y[:, 2:4], y[:, 4:-1]], 1, False),  # negative bound, partial -> a view
        (lambda y: [y[1:2], y[2:]], 0, False),  # dim 0 slices
    ],
)
def test_slices_and_narrows_of_one_source_are_pieces(pieces, dim, full) -> None:  # type: ignore[no-untyped-def]
    def f(self, x):  # type: ignore[no-untyped-def]
        return torch.cat(pieces(x * 2.0), dim) + 1.0

    gm = run(f, [torch.randn(3, 8)], RULES)
    assert fired(gm, "split_cat") == 1
    assert ops(gm, "cat") == 0
    assert ops(gm, "narrow") == (0 if full else 1)


def test_slices_that_overlap_or_skip_do_not_fire() -> None:
    def f(self, x):  # type: ignore[no-untyped-def]
        y = x * 2.0
        return (
            torch.cat([y[:, :4], y[:, 3:]], 1),
            torch.cat([y[:, :2], y[:, 3:]], 1),
            torch.cat([y[:, 0:8:2], y[:, 1:8:2]], 1),
        )

    gm = run(f, [torch.randn(3, 8)], RULES)
    assert fired(gm, "split_cat") == 0
    assert ops(gm, "cat") == 3


def test_strided_input_feeding_a_view_gets_a_contiguous_copy() -> None:
    """cat returns a contiguous copy; x.t() is strided and ``.view`` on it would raise, so the
    round trip becomes a contiguous clone, never the strided source itself."""

    def f(self, x):  # type: ignore[no-untyped-def]
        y = (x * 2.0).t()
        return torch.cat(torch.split(y, 2, 1), 1).view(-1), torch.cat([y[:, 0:2], y[:, 2:4]], 1).view(-1)

    x = torch.randn(6, 3)
    gm = run(f, [x], RULES)
    assert fired(gm, "split_cat") == 2
    assert ops(gm, "cat") == 0
    for got, want in zip(gm(x), f(None, x), strict=True):
        torch.testing.assert_close(got, want, rtol=0, atol=0)


def test_exported_graph_with_known_contiguous_input_fires_before_a_view() -> None:
    """Dynamo records strides: a contiguous source with the cat's strides may replace it."""

    class M(torch.nn.Module):
        def forward(self, x: torch.Tensor) -> torch.Tensor:
            y = x * 2.0
            return torch.cat(torch.split(y, 2, 1), 1).view(-1)

    mod, xs = M(), [torch.randn(3, 6)]
    gm = optimus.optimize(mod, xs, rules=RULES, cost_model=LAUNCH_BOUND)
    assert fired(gm, "split_cat") == 1
    assert_parity(mod, gm, xs)


def test_would_return_a_view_of_the_model_input_becomes_a_fresh_copy() -> None:
    """cat returns a copy; a narrow view of x returned instead would let the caller write into x,
    so the run becomes a clone of the narrow view (new contiguous storage, as eager's)."""

    def f(self, x):  # type: ignore[no-untyped-def]
        return torch.cat([x[:, 2:4], x[:, 4:6]], 1)

    x = torch.randn(4, 12)
    gm = run(f, [x], RULES)
    assert fired(gm, "split_cat") == 1 and ops(gm, "cat") == 0
    out = gm(x)
    assert out.untyped_storage().data_ptr() != x.untyped_storage().data_ptr() and out.is_contiguous()
    torch.testing.assert_close(out, f(None, x), rtol=0, atol=0)
