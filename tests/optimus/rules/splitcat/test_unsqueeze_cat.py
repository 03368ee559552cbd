"""unsqueeze_cat: ``cat([x_i.unsqueeze(d) ..], d)`` (RecBole's field inputs) -> ``stack([x_i ..], d)``;
eager's values, gradients, dtype (type promotion included) and fresh contiguous layout; must not
fire for an input that is not unsqueezed, an unsqueeze on another dim, an unsqueeze made under
``no_grad`` for a cat outside it, a written source, or (priced) when every unsqueeze is read
elsewhere."""

from __future__ import annotations

import pytest
import torch
from layout_helpers import assert_same_results
from split_cat_helpers import fired, ops, run
from torch import fx

import optimus
from optimus.cost.analytic import AnalyticCostModel
from optimus.engine.context import RewriteContext
from optimus.rules.splitcat.pricing import views
from optimus.rules.splitcat.unsqueeze_cat import UnsqueezeCat

RULES = ["unsqueeze_cat"]


@pytest.mark.parametrize(("rank", "dim"), [(1, 1), (1, -1), (1, 0), (2, 1), (2, -2), (0, 0)])
def test_values_gradients_and_layout_are_the_cats(rank: int, dim: int) -> None:
    shape = (5, 3)[:rank]

    def f(self, a, b, c):  # type: ignore[no-untyped-def]
        return torch.cat([(a * 2.0).unsqueeze(dim), torch.unsqueeze(b, dim), c.tanh().unsqueeze(dim)], dim)

    xs = [torch.randn(shape, requires_grad=True) for _ in range(3)]
    gm = run(f, xs, RULES)  # forward and backward parity against f itself
    assert fired(gm, "unsqueeze_cat") == 1 and ops(gm, "cat") == 0 and ops(gm, "unsqueeze") == 0
    assert_same_results(f(None, *xs), gm(*xs), sources=xs)


def test_mixed_dtypes_promote_as_the_cat_does() -> None:
    def f(self, a, b):  # type: ignore[no-untyped-def]
        return torch.cat([a.unsqueeze(1), b.unsqueeze(1)], 1)

    a, b = torch.arange(4), torch.rand(4, dtype=torch.float64)
    gm = run(f, [a, b], RULES)
    assert fired(gm, "unsqueeze_cat") == 1
    out = gm(a, b)
    assert out.dtype == torch.float64 and torch.equal(out, f(None, a, b))


def test_a_recbole_style_input_layer_through_export() -> None:
    class Fields(torch.nn.Module):
        """Each field its own input ``[B]``, stacked into ``[B, F]`` then looked up (RecBole)."""

        def __init__(self) -> None:
            super().__init__()
            self.table = torch.nn.Embedding(40, 4)

        def forward(self, *fields: torch.Tensor) -> torch.Tensor:
            ids = torch.cat([f.unsqueeze(1) for f in fields], dim=1)  # [B, F]
            return self.table(ids).flatten(1)

    torch.manual_seed(0)
    model = Fields()
    fields = tuple(torch.randint(0, 40, (16,)) for _ in range(6))
    gm = optimus.optimize(model, fields)
    assert fired(gm, "unsqueeze_cat") == 1 and isinstance(gm, fx.GraphModule)
    assert_same_results(model(*fields), gm(*fields), sources=list(fields))
    g = torch.autograd.grad(gm(*fields).square().sum(), list(model.parameters()))
    w = torch.autograd.grad(model(*fields).square().sum(), list(model.parameters()))
    for x, y in zip(g, w, strict=True):
        torch.testing.assert_close(x, y)


@pytest.mark.parametrize("case", ["not_unsqueezed", "other_dim", "written", "read_elsewhere"])
def test_must_not_fire(case: str) -> None:
    def f(self, x):  # type: ignore[no-untyped-def]
        a, b = x * 2.0, x * 3.0
        if case == "not_unsqueezed":  # one input is [4, 1] already: a partial run stays
            return torch.cat([a.unsqueeze(1), b.unsqueeze(1), x[:, None] * 1.0], 1)
        if case == "other_dim":
            return torch.cat([a.unsqueeze(0), b.unsqueeze(0)], 1)
        if case == "written":
            ua = a.unsqueeze(1)
            a.add_(1.0)  # the unsqueeze is a view of a written tensor: ordered
            return torch.cat([ua, b.unsqueeze(1)], 1), a
        ua, ub = a.unsqueeze(1), b.unsqueeze(1)  # both read again: nothing dies with the cat
        return torch.cat([ua, ub], 1), ua * ub

    x = torch.randn(4, requires_grad=True)
    gm = run(f, [x], RULES)
    assert fired(gm, "unsqueeze_cat") == 0 and ops(gm, "cat") == 1
    if case == "read_elsewhere":
        assert "unsqueeze_cat" in gm.optimus_report.declined


def test_an_unsqueeze_made_under_no_grad_stays_for_a_cat_outside_it() -> None:
    """Through export (symbolic_trace drops the ``with`` block): a view made under ``no_grad``
    does not require grad, so the cat's result carries no gradient to ``a``; a stack of ``a``
    outside the block would."""

    class NoGradField(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.w = torch.nn.Parameter(torch.randn(4))

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            a, b = x * self.w, x + self.w
            with torch.no_grad():
                ua = a.unsqueeze(1)
            return torch.cat([ua, b.unsqueeze(1)], 1)

    torch.manual_seed(0)
    model, x = NoGradField(), torch.randn(4)
    gm = optimus.optimize(model, (x,), rules=RULES)
    assert gm.optimus_report.capture == "export" and fired(gm, "unsqueeze_cat") == 0
    (g,) = torch.autograd.grad(gm(x).sum(), [model.w])
    (w,) = torch.autograd.grad(model(x).sum(), [model.w])
    torch.testing.assert_close(g, w)
    torch.testing.assert_close(g, torch.ones(4))  # only b's path: the no_grad view carries none
    # the rule's own check (the engine also refuses a rewrite reading across the block)
    plain = optimus.optimize(model, (x,), rules=[])
    (cat,) = [n for n in plain.graph.nodes if n.target is torch.cat]
    assert UnsqueezeCat().find(cat, RewriteContext(plain, AnalyticCostModel())) is None


def test_the_price_saves_one_view_per_unsqueeze_that_dies_and_nothing_under_inductor() -> None:
    class Two(torch.nn.Module):
        def forward(self, a: torch.Tensor, b: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
            ub = b.unsqueeze(1)
            return torch.cat([a.unsqueeze(1), ub], 1), ub * 2.0

    gm = optimus.optimize(Two(), (torch.randn(4), torch.randn(4)), rules=[])  # price the original cat
    for model in (AnalyticCostModel(), AnalyticCostModel(inductor=True)):
        ctx = RewriteContext(gm, model)
        (cat,) = [n for n in gm.graph.nodes if n.target is torch.cat]
        found = UnsqueezeCat().find(cat, ctx)
        assert found is not None
        cpu = torch.device("cpu")
        saved = model.seconds(found.before, cpu) - model.seconds(found.after, cpu)
        if model.inductor:  # a view is folded into the cat's indexing: the same kernel either way
            assert saved == 0.0
        else:  # a's unsqueeze dies; b's stays for its other reader
            assert saved == pytest.approx(model.seconds(views(1), cpu))
    inductor = optimus.optimize(
        Two(), (torch.randn(4), torch.randn(4)), cost_model=AnalyticCostModel(inductor=True)
    )
    assert fired(inductor, "unsqueeze_cat") == 0 and "unsqueeze_cat" in inductor.optimus_report.declined
