"""unbind_cat: cat of consecutive unbind outputs -> movedim + flatten of the unbound tensor."""

from __future__ import annotations

import pytest
import torch
from layout_helpers import assert_same_results
from split_cat_helpers import fired, module_of, ops, run

import optimus

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


@pytest.mark.parametrize("case", ["input_same_dim", "input_moved", "input_run", "returned_source"])
def test_cat_that_would_alias_is_one_fresh_copy(case: str) -> None:
    """cat(unbind(y, u)[i..j], c) whose flatten could be a view of y where y is a model input or
    is returned too: the moved view is copied once into fresh contiguous storage (what the cat
    returned) and flattened there, instead of being left alone."""

    def f(self, x):  # type: ignore[no-untyped-def]
        if case == "input_same_dim":
            p = torch.unbind(x, 0)
            return torch.cat([p[i] for i in range(8)], 0)  # flatten(x, 0, 1) would be a view of x
        if case == "input_moved":
            p = torch.unbind(x, 1)
            return torch.cat([p[i] for i in range(6)], 0)
        if case == "input_run":
            p = torch.unbind(x, 0)
            return torch.cat([p[i] for i in range(1, 8)], 0)
        h = x * 2.0
        p = torch.unbind(h, 0)
        return torch.cat([p[i] for i in range(8)], 0), h

    x = torch.randn(8, 6, 2)  # enough pieces that one clone beats the many-input cat
    gm = run(f, [x], RULES)
    assert fired(gm, "unbind_cat") == 1
    assert ops(gm, "cat") == 0 and ops(gm, "unbind") == 0
    assert sum(1 for n in gm.graph.nodes if n.target is torch.clone) == 1
    assert_same_results(module_of(f)(x), gm(x), sources=[x])


def test_fresh_cat_is_declined_when_the_copy_saves_nothing() -> None:
    """Two pieces of a model input's unbind, the others still read: narrow, clone and flatten
    cost more than the two-input cat (default cost model)."""

    def f(self, x):  # type: ignore[no-untyped-def]
        p = torch.unbind(x, 0)
        return torch.cat([p[0], p[1]], 0), p[2] * 2.0

    gm = run(f, [torch.randn(3, 4, 2)], RULES, cost_model=optimus.AnalyticCostModel())
    assert fired(gm, "unbind_cat") == 0 and ops(gm, "cat") == 1
    assert gm.optimus_report.declined.get("unbind_cat", 0) >= 1


def test_a_source_written_after_the_unbind_keeps_the_cat() -> None:
    """Real aliasing: writing y between the unbind and the cat changes what the cat reads
    (integer inputs: autograd forbids writing the base of an unbind's views)."""

    def f(self, x):  # type: ignore[no-untyped-def]
        y = x * 1
        p = torch.unbind(y, 0)
        y.add_(1)
        return torch.cat([p[0], p[1]], 0)

    gm = run(f, [torch.randint(0, 9, (2, 3))], RULES)
    assert fired(gm, "unbind_cat") == 0 and ops(gm, "cat") == 1


@pytest.mark.parametrize(("udim", "cdim"), [(0, 1), (0, 0), (1, 1)])
def test_runs_inside_a_bigger_cat_become_one_input_each(udim: int, cdim: int) -> None:
    """MMoE's shape: cat([*adapter pieces (two fused groups), dense features], 1), launch-bound."""

    def f(self, x, y, d):  # type: ignore[no-untyped-def]
        p = torch.unbind(x * 2.0, udim)
        q = torch.unbind(y * 3.0, udim)
        return torch.cat([*[p[i] for i in range(40)], d * 1.0, *[q[i] for i in range(1, 40)]], cdim) + 1.0

    x = torch.randn(40, 4, 5) if udim == 0 else torch.randn(4, 40, 5)
    d = torch.randn(4, 5)  # the shape of one piece
    gm = run(f, [x, x.clone(), d], RULES)
    assert fired(gm, "unbind_cat") == 1
    assert ops(gm, "unbind") == 0
    (cat,) = [n for n in gm.graph.nodes if n.target is torch.cat]
    assert len(cat.args[0]) == 3  # the run of p, d, the run of q[1..39]


def test_default_cost_model_declines_runs_inside_a_cat_on_cpu() -> None:
    """On CPU a run's flatten is one more copy of its bytes: the default model keeps the cat."""
    import optimus

    def f(self, x, d):  # type: ignore[no-untyped-def]
        p = torch.unbind(x * 2.0, 0)
        return torch.cat([*[p[i] for i in range(100)], d * 1.0], 1)

    gm = run(
        f, [torch.randn(100, 256, 8), torch.randn(256, 32)], RULES, cost_model=optimus.AnalyticCostModel()
    )
    assert fired(gm, "unbind_cat") == 0
    assert gm.optimus_report.declined.get("unbind_cat", 0) >= 1


def test_inductor_priced_model_takes_runs_inside_a_cat_that_eager_declines() -> None:
    """Under Inductor the run's flatten is written into the cat's own loop: the same graph the
    eager CPU model keeps (test above) is rewritten, with forward and backward parity."""
    import optimus

    def f(self, x, d):  # type: ignore[no-untyped-def]
        p = torch.unbind(x * 2.0, 0)
        return torch.cat([*[p[i] for i in range(100)], d * 1.0], 1)

    gm = run(
        f,
        [torch.randn(100, 256, 8), torch.randn(256, 32)],
        RULES,
        cost_model=optimus.AnalyticCostModel(inductor=True),
    )
    assert fired(gm, "unbind_cat") == 1
    assert ops(gm, "unbind") == 0
    (cat,) = [n for n in gm.graph.nodes if n.target is torch.cat]
    assert len(cat.args[0]) == 2


def test_inductor_priced_model_still_declines_what_cannot_be_rewritten() -> None:
    """Pricing for Inductor changes costs, not safety: permuted pieces stay a cat."""
    import optimus

    def f(self, x, d):  # type: ignore[no-untyped-def]
        p = torch.unbind(x * 2.0, 0)
        return torch.cat([*[p[i] for i in reversed(range(10))], d * 1.0], 1)

    gm = run(
        f,
        [torch.randn(10, 4, 8), torch.randn(4, 3)],
        RULES,
        cost_model=optimus.AnalyticCostModel(inductor=True),
    )
    assert fired(gm, "unbind_cat") == 0 and ops(gm, "cat") == 1
