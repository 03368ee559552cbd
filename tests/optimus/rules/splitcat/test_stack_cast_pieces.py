"""stack_cast_pieces: stack of the same dtype conversion of adjacent equal pieces of one tensor (the
DeepCTR input layer's ``X[:, i:i+1].long()``) -> one conversion of a view; eager's values,
gradients, dtype and fresh contiguous layout; must not fire for a conversion that keeps the dtype,
mixed conversions, a converted piece read elsewhere, non-adjacent pieces or a written source.

No cost-model decline case exists: the rewrite replaces n conversions and a stack by one
conversion of the same bytes, so every constant set prices it cheaper (the test below checks that
the price says so)."""

from __future__ import annotations

import pytest
import torch
from layout_helpers import assert_same_results
from split_cat_helpers import fired, ops, run
from torch import fx

import optimus
from optimus.cost.analytic import AnalyticCostModel
from optimus.engine.context import RewriteContext
from optimus.rules.splitcat.stack_cast_pieces import StackCastPieces

RULES = ["stack_cast_pieces"]


def test_the_input_layer_becomes_one_conversion() -> None:
    def f(self, x):  # type: ignore[no-untyped-def]
        ids = torch.stack([x[:, i : i + 1].long() for i in range(26)], 0)  # [26, B, 1]
        return ids.reshape(26, -1), x[:, 26:] * 2.0

    x = torch.rand(8, 39) * 100
    gm = run(f, [x], RULES)
    assert fired(gm, "stack_cast_pieces") == 1 and ops(gm, "stack") == 0
    assert not [n for n in gm.graph.nodes if n.op == "call_method" and n.target == "long"]
    assert_same_results(f(None, x), gm(x), sources=[x])


@pytest.mark.parametrize(("dim", "stack_dim"), [(1, 0), (1, 1), (0, 2), (1, -1)])
def test_float_conversions_keep_values_gradients_and_layout(dim: int, stack_dim: int) -> None:
    def f(self, x):  # type: ignore[no-untyped-def]
        y = x * 2.0
        pieces = [y.narrow(dim, 2 * i, 2) for i in range(4)]
        return torch.stack([p.double() for p in pieces], stack_dim)

    x = torch.randn(8, 10, requires_grad=True)
    gm = run(f, [x], RULES)  # forward and backward parity against f itself
    assert fired(gm, "stack_cast_pieces") == 1
    assert_same_results(f(None, x), gm(x), sources=[x])


@pytest.mark.parametrize("case", ["same_dtype", "mixed", "read_elsewhere", "gap", "written"])
def test_must_not_fire(case: str) -> None:
    def f(self, x):  # type: ignore[no-untyped-def]
        y = x * 2.0
        a, b, c = y[:, 0:1], y[:, 1:2], y[:, 2:3]
        if case == "same_dtype":  # .float() of a float tensor may return the piece itself
            return torch.stack([a.float(), b.float(), c.float()], 0)
        if case == "mixed":
            return torch.stack([a.double(), b.double(), c.long().double()], 0)
        if case == "read_elsewhere":
            bd = b.double()
            return torch.stack([a.double(), bd, c.double()], 0), bd * 3.0
        if case == "gap":
            return torch.stack([a.double(), c.double()], 0)
        y.add_(1.0)  # the pieces are views of a written tensor: ordered
        return torch.stack([a.double(), b.double(), c.double()], 0), y

    gm = run(f, [torch.randn(4, 5)], RULES)
    assert fired(gm, "stack_cast_pieces") == 0 and ops(gm, "stack") == 1


def test_the_price_is_lower_under_any_constants() -> None:
    class Ids(torch.nn.Module):
        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return torch.stack([x[:, i : i + 1].long() for i in range(3)], 0)

    gm = optimus.optimize(Ids(), (torch.rand(4, 5) * 10,), rules=[])  # price the original stack
    for model in (AnalyticCostModel(), AnalyticCostModel(inductor=True)):
        ctx = RewriteContext(gm, model)
        (stack,) = [n for n in gm.graph.nodes if n.target is torch.stack]
        found = StackCastPieces().find(stack, ctx)
        assert found is not None
        cpu = torch.device("cpu")
        assert model.seconds(found.after, cpu) < model.seconds(found.before, cpu)


def test_through_export_on_a_deepctr_style_module() -> None:
    class Inputs(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            # 13 features: fewer lookups than that are not worth batching (batch_embedding declines)
            self.tables = torch.nn.ModuleList(torch.nn.Embedding(50, 4) for _ in range(13))

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            embs = [t(x[:, i : i + 1].long()) for i, t in enumerate(self.tables)]
            return torch.cat(embs, 1).flatten(1)

    torch.manual_seed(0)
    model, x = Inputs(), torch.randint(0, 50, (16, 20)).float()
    gm = optimus.optimize(model, (x,))
    assert fired(gm, "batch_embedding") == 1 and fired(gm, "stack_cast_pieces") == 1
    assert isinstance(gm, fx.GraphModule)
    assert_same_results(model(x), gm(x), sources=[x])
    out, want = gm(x), model(x)
    g = torch.autograd.grad(out.square().sum(), list(model.parameters()))
    w = torch.autograd.grad(want.square().sum(), list(model.parameters()))
    for a, b in zip(g, w, strict=True):
        torch.testing.assert_close(a, b)
