"""Horizontal groups never mix values with and without ``requires_grad``: one stacked result would
require grad for every member, which a caller sees (``.numpy()`` raises, ``grad_fn`` is set).
Found by the user-program fuzzer (tests/optimus/fuzz_run.py)."""

from __future__ import annotations

from typing import Any

import pytest
import torch
import torch.nn.functional as F
from optimus_helpers import LAUNCH_BOUND
from torch import fx, nn

import optimus
from optimus.params.relayout import RelayoutParams


class PiecesOfTwoInputs(nn.Module):
    def forward(self, x: torch.Tensor, z: torch.Tensor) -> tuple[torch.Tensor, ...]:
        a0, b0 = torch.split(x, 3, dim=1)
        a1, b1 = torch.split(z, 3, dim=1)
        return F.gelu(b0), F.gelu(a0), F.gelu(b1), F.gelu(a1)


def _eager_backend(gm: fx.GraphModule, example_inputs: list[Any]) -> Any:
    return gm.forward


def _optimize(model: nn.Module, inputs: tuple[torch.Tensor, ...], path: str) -> Any:
    if path == "backend":
        cfg = optimus.OptimusConfig(cost_model=LAUNCH_BOUND)
        return torch.compile(model, backend=optimus.backend(cfg, inner=_eager_backend))
    layout = RelayoutParams() if path == "relayout" else None
    config = optimus.OptimusConfig(cost_model=LAUNCH_BOUND, **({"layout": layout} if layout else {}))
    return optimus.optimize(model, inputs, config=config)


@pytest.mark.parametrize("path", ["default", "relayout", "backend"])
def test_pieces_with_and_without_grad_keep_their_flags(path: str) -> None:
    x, z = torch.randn(4, 6, requires_grad=True), torch.randn(4, 6)
    expected = [o.requires_grad for o in PiecesOfTwoInputs()(x, z)]
    assert expected == [True, True, False, False]
    optimized = _optimize(PiecesOfTwoInputs(), (x, z), path)
    got = optimized(x, z)
    assert [o.requires_grad for o in got] == expected
    for o, ref in zip(got, PiecesOfTwoInputs()(x, z), strict=True):
        torch.testing.assert_close(o, ref)


def test_the_report_says_why() -> None:
    x, z = torch.randn(4, 6, requires_grad=True), torch.randn(4, 6)
    gm = optimus.optimize(PiecesOfTwoInputs(), (x, z), cost_model=LAUNCH_BOUND)
    assert "batch_unary: grouping values with and without requires_grad" in gm.optimus_report.declined_reasons


def test_pieces_that_all_require_grad_are_still_batched() -> None:
    x, z = torch.randn(4, 6, requires_grad=True), torch.randn(4, 6, requires_grad=True)
    gm = optimus.optimize(PiecesOfTwoInputs(), (x, z), cost_model=LAUNCH_BOUND)
    assert gm.optimus_report.rules_fired.get("batch_unary") == 1


class CatOfSplitUnderNoGrad(nn.Module):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = x * 1.5
        with torch.no_grad():
            return torch.cat(torch.split(h.contiguous(), 2, dim=1), dim=1)


class StackOfUnbindUnderNoGrad(nn.Module):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = x * 1.5
        with torch.no_grad():
            return torch.stack(torch.unbind(h.view(4, 4), 1), 1)


@pytest.mark.parametrize("model", [CatOfSplitUnderNoGrad, StackOfUnbindUnderNoGrad])
@pytest.mark.parametrize("path", ["default", "relayout", "backend"])
def test_a_view_made_under_no_grad_is_not_replaced_by_its_grad_base(
    model: type[nn.Module], path: str
) -> None:
    """Found by the fuzz runner at HEAD of the issue-13 merges: the split/cat rules replaced the
    no-grad result by ``h`` itself, which requires grad."""
    x = torch.randn(4, 4, requires_grad=True)
    expected = model()(x)
    assert not expected.requires_grad
    got = _optimize(model(), (x,), path)(x)
    assert got.requires_grad == expected.requires_grad
    torch.testing.assert_close(got, expected)


# ---------------------------------------------------------------------------------------------
# Found by the fuzzer (scripts/fuzz --start 98000, example 98000): an MMoE block whose experts are
# built in grad mode but pooled only under no_grad. In eager no gradient reaches the experts'
# Linears (their .grad stays None); merged with a tower's Linear on the same input into one wide
# Linear, the backward of the concatenated weight gave them zero gradients.


class ExpertsOnlyReadUnderNoGrad(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.tower = nn.Linear(8, 4)
        self.experts = nn.ModuleList([nn.Linear(8, 4) for _ in range(3)])

    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, ...]:
        a = torch.neg(self.tower(x))
        ex = torch.stack([e(x) for e in self.experts], dim=1)  # requires grad...
        with torch.no_grad():
            pooled = ex.sum(1)  # ...but its only reader records no autograd
        return a, pooled


class ExpertsAlsoReadWithGrad(ExpertsOnlyReadUnderNoGrad):
    """The same block with the pooling in grad mode: every Linear gets a gradient, so merging them
    stays allowed (the fix must not give up the rewrite where the gradients are all there)."""

    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, ...]:
        a = torch.neg(self.tower(x))
        ex = torch.stack([e(x) for e in self.experts], dim=1)
        return a, ex.sum(1)


def _grads(model: nn.Module, fn: Any, x: torch.Tensor) -> tuple[list[torch.Tensor], dict[str, Any]]:
    model.zero_grad(set_to_none=True)
    x = x.detach().clone().requires_grad_(True)
    outs = fn(x)
    sum(o.sum() * (k + 1) for k, o in enumerate(outs) if o.requires_grad).backward()
    grads = {n: p.grad for n, p in model.named_parameters()}
    return [o.detach() for o in outs], grads | {"x": x.grad}


@pytest.mark.parametrize("path", ["default", "relayout", "backend"])
def test_values_no_gradient_reaches_keep_grad_none(path: str) -> None:
    model, x = ExpertsOnlyReadUnderNoGrad(), torch.randn(3, 8, requires_grad=True)
    ref_outs, ref = _grads(model, model, x)
    assert ref["experts.0.weight"] is None and ref["tower.weight"] is not None
    optimized = _optimize(model, (x,), path)
    outs, got = _grads(model, optimized, x)
    for o, r in zip(outs, ref_outs, strict=True):
        torch.testing.assert_close(o, r)
    assert {n for n, g in got.items() if g is None} == {n for n, g in ref.items() if g is None}
    for n, g in ref.items():
        if g is not None:
            torch.testing.assert_close(got[n], g)


def test_no_merge_of_values_a_gradient_reaches_with_values_it_does_not() -> None:
    x = torch.randn(3, 8, requires_grad=True)
    gm = optimus.optimize(ExpertsOnlyReadUnderNoGrad(), (x,), cost_model=LAUNCH_BOUND)
    assert "merge_shared_linear" not in gm.optimus_report.rules_fired
    assert any("gradient reaches" in r for r in gm.optimus_report.declined_reasons)


def test_values_a_gradient_reaches_are_still_merged() -> None:
    model, x = ExpertsAlsoReadWithGrad(), torch.randn(3, 8, requires_grad=True)
    gm = optimus.optimize(model, (x,), cost_model=LAUNCH_BOUND)
    assert gm.optimus_report.rules_fired.get("merge_shared_linear") == 1
    ref_outs, ref = _grads(model, model, x)
    outs, got = _grads(model, gm, x)
    for o, r in zip(outs, ref_outs, strict=True):
        torch.testing.assert_close(o, r)
    for n, g in ref.items():
        assert g is not None
        torch.testing.assert_close(got[n], g)
