"""stack_unbind: unbind(stack(xs)) -> xs and stack(unbind(x)) -> x (or a narrow view of a run)."""

from __future__ import annotations

import pytest
import torch
from layout_helpers import assert_same_results
from split_cat_helpers import fired, module_of, ops, run

import optimus

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
        return torch.stack([p[1], p[2], p[3]], 1) * 2.0, p[0] * 3.0  # (returned raw: strides differ)

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


@pytest.mark.parametrize("case", ["dims_differ", "permuted", "mutated"])
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
        raise AssertionError(case)

    gm = run(f, [torch.randn(2, 2), torch.randn(2, 2)], RULES)
    assert fired(gm, "stack_unbind") == 0
    assert ops(gm, "stack") == 1


@pytest.mark.parametrize("case", ["input", "input_run", "returned_source", "strided_input"])
def test_round_trip_that_would_alias_is_one_fresh_copy(case: str) -> None:
    """stack(unbind(x, d)[i..j], d) where handing back x (or its narrow view) would be observable:
    x is a model input (the caller's write would reach it), or x is returned as well (two outputs
    would share memory), or x is strided (a consumer would see its layout). The round trip becomes
    one contiguous clone: the stack's fresh storage, its strides, one copy instead of n slices and
    an n-input stack."""

    def f(self, x, y):  # type: ignore[no-untyped-def]
        if case == "input":
            p = torch.unbind(x, 0)
            return torch.stack([p[0], p[1], p[2]], 0)
        if case == "input_run":
            p = torch.unbind(x, 1)
            return torch.stack([p[0], p[1]], 1)  # partial: x.narrow(1, 0, 2), cloned
        if case == "returned_source":
            h = x * 2.0
            p = torch.unbind(h, 0)
            return torch.stack([p[0], p[1], p[2]], 0), h
        p = torch.unbind(x.t(), 0)  # a strided view of the input
        return torch.stack([p[0], p[1], p[2]], 0)

    x, y = torch.randn(3, 3), torch.randn(3, 3)
    gm = run(f, [x, y], RULES)
    assert fired(gm, "stack_unbind") == 1
    assert ops(gm, "stack") == 0 and ops(gm, "unbind") == 0
    assert sum(1 for n in gm.graph.nodes if n.target is torch.clone) == 1
    mod = module_of(f)
    assert_same_results(mod(x, y), gm(x, y), sources=[x, y])


def test_fresh_round_trip_is_declined_when_the_copy_saves_nothing() -> None:
    """Two pieces of a model input's unbind, the others still read: the narrow and the clone cost
    more than the two-input stack they replace (default cost model)."""

    def f(self, x, y):  # type: ignore[no-untyped-def]
        p = torch.unbind(x, 0)
        return torch.stack([p[0], p[1]], 0), p[2] * 2.0

    gm = run(f, [torch.randn(3, 4), torch.randn(3, 4)], RULES, cost_model=optimus.AnalyticCostModel())
    assert fired(gm, "stack_unbind") == 0 and ops(gm, "stack") == 1
    assert gm.optimus_report.declined.get("stack_unbind", 0) >= 1


def test_a_source_written_after_the_unbind_keeps_the_round_trip() -> None:
    """Real aliasing: the pieces are views of h, so writing h between the unbind and the stack
    changes what the stack reads; nothing of it is moved or replaced (integer inputs: autograd
    forbids writing the base of an unbind's views)."""

    def f(self, x, y):  # type: ignore[no-untyped-def]
        h = x * 1
        p = torch.unbind(h, 0)
        h.add_(1)
        return torch.stack([p[0], p[1]], 0)

    gm = run(f, [torch.randint(0, 9, (2, 3)), torch.randint(0, 9, (2, 3))], RULES)
    assert fired(gm, "stack_unbind") == 0 and ops(gm, "stack") == 1


def test_mixed_dtype_stack_promotes_so_pieces_are_not_its_inputs() -> None:
    def f(self, x, y):  # type: ignore[no-untyped-def]
        a, b = torch.stack([x * 1.0, y.double()], 0).unbind(0)
        return a, b

    gm = run(f, [torch.randn(2, 2), torch.randn(2, 2)], RULES)
    assert fired(gm, "stack_unbind") == 0


@pytest.mark.parametrize(("udim", "sdim"), [(0, 1), (0, 0), (1, 2)])
def test_runs_inside_a_bigger_stack_become_views_in_one_cat(udim: int, sdim: int) -> None:
    """DLRM's interaction: stack([bottom, *pieces of the fused projections], d), here with two
    runs of 20 pieces and two other tensors."""

    def f(self, x, y):  # type: ignore[no-untyped-def]
        p = torch.unbind(x * 2.0, udim)
        a = y * 3.0
        items = [a, *[p[i] for i in range(20)], a.tanh(), *[p[i] for i in range(20, 40)]]
        return torch.stack(items, sdim) + 1.0

    x = torch.randn(41, 4, 5) if udim == 0 else torch.randn(4, 41, 5)
    gm = run(f, [x, torch.randn(4, 5)], RULES)
    assert fired(gm, "stack_unbind") == 1
    assert ops(gm, "stack") == 0 and ops(gm, "unbind") == 0
    (cat,) = [n for n in gm.graph.nodes if n.target is torch.cat]
    assert len(cat.args[0]) == 4  # a, the run p[0..19], tanh(a), the run p[20..39]


def test_a_whole_unbind_with_an_extra_tensor_needs_no_narrow() -> None:
    def f(self, x, y):  # type: ignore[no-untyped-def]
        p = torch.unbind(x * 2.0, 0)
        return torch.stack([y * 1.0, *[p[i] for i in range(20)]], 1)

    gm = run(f, [torch.randn(20, 3, 2), torch.randn(3, 2)], RULES)
    assert fired(gm, "stack_unbind") == 1
    assert ops(gm, "narrow") == 0 and ops(gm, "stack") == 0


@pytest.mark.parametrize("case", ["no_run", "permuted_run"])
def test_stacks_without_a_run_are_left_alone(case: str) -> None:
    def f(self, x, y):  # type: ignore[no-untyped-def]
        p = torch.unbind(x * 2.0, 0)
        items = [y * 1.0, p[0], y * 2.0, p[1]] if case == "no_run" else [y * 1.0, p[2], p[1], p[0]]
        return torch.stack(items, 1)

    gm = run(f, [torch.randn(3, 4, 2), torch.randn(4, 2)], RULES)
    assert fired(gm, "stack_unbind") == 0
    assert ops(gm, "stack") == 1


def test_default_cost_model_declines_a_short_run_beside_many_singles() -> None:
    """One two-piece run among four other tensors saves less than the views it adds."""
    import optimus

    def f(self, x, y):  # type: ignore[no-untyped-def]
        p = torch.unbind(x * 2.0, 0)
        return torch.stack([y * 1.0, y * 2.0, p[0], p[1], y * 3.0, y * 4.0], 1)

    gm = run(f, [torch.randn(3, 4, 2), torch.randn(4, 2)], RULES, cost_model=optimus.AnalyticCostModel())
    assert fired(gm, "stack_unbind") == 0
    assert gm.optimus_report.declined.get("stack_unbind", 0) >= 1


@pytest.mark.parametrize(("shape", "udim", "sdim"), [((4, 3, 5), 0, 1), ((4, 3, 5), 0, 2), ((3, 4, 5), 1, 0)])
def test_stack_of_unbind_on_another_dim_is_one_contiguous_clone(shape, udim, sdim) -> None:  # type: ignore[no-untyped-def]
    n = shape[udim]

    def f(self, x):  # type: ignore[no-untyped-def]
        parts = (x * 2.0).unbind(udim)
        return torch.stack([parts[i] for i in range(n)], sdim)  # returned raw: layout observed

    x = torch.randn(shape)
    gm = run(f, [x], RULES)
    assert fired(gm, "stack_unbind") == 1
    assert ops(gm, "stack") == 0 and ops(gm, "unbind") == 0
    got, want = gm(x), torch.stack(list((x * 2.0).unbind(udim)), sdim)
    assert got.is_contiguous() and got.stride() == want.stride()
    torch.testing.assert_close(got, want)


def test_stack_of_unbind_on_another_dim_never_aliases_the_input() -> None:
    # x.movedim(0, 1) of a [4, 1, 5] tensor is contiguous already: ``.contiguous()`` would return
    # x itself, and the caller could write through the result into x. The clone never does.
    def f(self, x):  # type: ignore[no-untyped-def]
        a, b, c, d = x.unbind(0)
        return torch.stack([a, b, c, d], 1)

    x = torch.randn(4, 1, 5)
    gm = run(f, [x], RULES)
    out = gm(x)
    assert out.untyped_storage().data_ptr() != x.untyped_storage().data_ptr()


def test_a_permuted_stack_of_unbind_on_another_dim_is_left_alone() -> None:
    def f(self, x):  # type: ignore[no-untyped-def]
        a, b, c = (x * 2.0).unbind(0)
        return torch.stack([b, a, c], 1)

    gm = run(f, [torch.randn(3, 4, 5)], RULES)
    assert fired(gm, "stack_unbind") == 0
