"""A cat/stack result stays fresh storage where the caller can tell.

split_cat, stack_unbind, stack_pieces, unbind_cat, cat_split and noop_split_cat replace a cat or
stack (always a new tensor) by a tensor the graph already has or a view of it. When the result is
returned and that tensor is a model input, a parameter, or another output, the caller's in-place
op on the result used to change them. Each case runs under ``optimize`` (default layout and
``RelayoutParams``); outputs must match eager in values, layout and aliasing, and an in-place op
on the outputs must leave inputs and parameters as eager leaves them. Rewrites whose result stays
private still fire.
"""

from __future__ import annotations

import copy
from typing import Any

import pytest
import torch
from layout_helpers import assert_meta_matches, assert_same_results
from optimus_helpers import LAUNCH_BOUND
from torch import nn

import optimus
from optimus import OptimusConfig
from optimus.params.relayout import RelayoutParams

LAYOUTS = {"default": lambda: OptimusConfig(), "relayout": lambda: OptimusConfig(layout=RelayoutParams())}


class Case(nn.Module):
    def __init__(self, kind: str) -> None:
        super().__init__()
        self.kind = kind
        self.w = nn.Parameter(torch.randn(4, 8))

    def forward(self, x: torch.Tensor) -> Any:
        k = self.kind
        if k == "cat_of_input_view":
            return torch.cat(torch.split(x.view(8, 4), 2, 1), 1)
        if k == "cat_of_contiguous_input":
            return torch.cat(torch.split(x.contiguous(), 2, 1), 1)
        if k == "cat_of_input_slices":
            return torch.cat([x[:, :2], x[:, 2:3], x[:, 3:4]], 1)
        if k == "cat_of_weight_t":
            return torch.cat(torch.split(self.w.t(), 2, 1), 1)
        if k == "cat_of_another_output":
            y = x * 2.0
            return y, torch.cat(torch.split(y, 2, 1), 1)
        if k == "stack_of_unbound_input":
            return torch.stack(torch.unbind(x.view(8, 4), 0), 0)
        if k == "unbind_of_stack_twice":
            y = x * 2.0
            a, b = torch.unbind(torch.stack([y, y]), 0)
            return a, b
        if k == "unbind_of_stack_with_input":
            a, b = torch.unbind(torch.stack([x * 2.0, x]), 0)
            return a, b
        if k == "stack_of_input_pieces":
            return torch.stack(torch.split(x.view(8, 4), 2, 0), 0)
        if k == "cat_of_unbound_input":
            return torch.cat(torch.unbind(x.view(2, 4, 4), 0), 0)
        if k == "split_of_cat_of_input":
            a, b = torch.split(torch.cat([x, x * 2.0], 1), 4, 1)
            return a, b
        if k == "cat_of_one_input":
            return torch.cat([x.view(8, 4)], 0)
        raise ValueError(k)


KINDS = [
    "cat_of_input_view",
    "cat_of_contiguous_input",
    "cat_of_input_slices",
    "cat_of_weight_t",
    "cat_of_another_output",
    "stack_of_unbound_input",
    "unbind_of_stack_twice",
    "unbind_of_stack_with_input",
    "stack_of_input_pieces",
    "cat_of_unbound_input",
    "split_of_cat_of_input",
    "cat_of_one_input",
]


def _inputs(kind: str) -> list[torch.Tensor]:
    return [
        torch.randn(32)
        if "view" in kind or "unbound" in kind or "pieces" in kind or "one" in kind
        else torch.randn(8, 4)
    ]


def _outs(value: Any) -> list[torch.Tensor]:
    return list(value) if isinstance(value, (tuple, list)) else [value]


@pytest.mark.parametrize("layout", list(LAYOUTS))
@pytest.mark.parametrize("kind", KINDS)
def test_returned_cat_stays_fresh(kind: str, layout: str) -> None:
    torch.manual_seed(0)
    mod, xs = Case(kind), _inputs(kind)
    gm = optimus.optimize(copy.deepcopy(mod), xs, cost_model=LAUNCH_BOUND, config=LAYOUTS[layout]())
    with torch.no_grad():
        assert_same_results(mod(*xs), gm(*xs), [*xs, *mod.parameters()])
    assert_meta_matches(gm, xs)


@pytest.mark.parametrize(
    "kind", ["cat_of_input_view", "cat_of_weight_t", "stack_of_input_pieces", "cat_of_another_output"]
)
def test_in_place_on_outputs_changes_what_eager_changes(kind: str) -> None:
    """The caller writes into every output (under no_grad, as an optimizer step would)."""
    torch.manual_seed(0)
    mod, xs = Case(kind), _inputs(kind)
    gm = optimus.optimize(copy.deepcopy(mod), xs, cost_model=LAUNCH_BOUND)
    with torch.no_grad():
        x_eager, x_opt = xs[0].clone(), xs[0].clone()
        want = _outs(mod(x_eager))
        for o in want:
            o.add_(1.0)
        got = _outs(gm(x_opt))
        for o in got:
            o.add_(1.0)
    torch.testing.assert_close(x_opt, x_eager, rtol=0, atol=0)
    for p_opt, p_eager in zip(gm.parameters(), mod.parameters(), strict=False):
        torch.testing.assert_close(p_opt, p_eager, rtol=0, atol=0)
    for o_opt, o_eager in zip(got, want, strict=True):  # two outputs sharing memory: added twice
        torch.testing.assert_close(o_opt, o_eager, rtol=1e-6, atol=1e-6)


@pytest.mark.parametrize(
    ("kind", "rule"),
    [
        ("private_cat", "split_cat"),
        ("private_stack", "stack_unbind"),
        ("input_pieces_stacked", "stack_pieces"),
    ],
)
def test_rewrites_of_private_values_still_fire(kind: str, rule: str) -> None:
    """A result that is not the caller's (or is made fresh with a priced clone) is still rewritten."""

    class Private(nn.Module):
        def forward(self, x: torch.Tensor) -> Any:
            if kind == "private_cat":
                return torch.cat(torch.split(x * 2.0, 2, 1), 1)  # x * 2.0 is private: returned as is
            if kind == "private_stack":
                return torch.stack(torch.unbind(x * 2.0, 0), 0)
            return torch.stack(torch.split(x, 2, 0), 0)  # a clone of x's rows: fresh

    torch.manual_seed(0)
    mod, xs = Private(), [torch.randn(8, 4)]
    gm = optimus.optimize(mod, xs, cost_model=LAUNCH_BOUND)
    assert gm.optimus_report.rules_fired.get(rule, 0) == 1, gm.optimus_report.rules_fired
    with torch.no_grad():
        assert_same_results(mod(*xs), gm(*xs), xs)


@pytest.mark.compile
@pytest.mark.parametrize("kind", ["cat_of_input_view", "cat_of_contiguous_input"])
def test_default_optimus_backend_never_hands_back_the_input(kind: str) -> None:
    """Plain Inductor returns ``x``'s view for ``cat(split(x.view(8, 4), 2, 1), 1)`` (its post-grad
    ``splitwithsizes_cat_replace``, torch 2.13); ``backend="optimus"`` turns the round trip into a
    clone first, which Inductor keeps, so the caller gets new storage as from eager."""
    torch._dynamo.reset()
    mod, xs = Case(kind), _inputs(kind)
    compiled = torch.compile(mod, backend="optimus")
    with torch.no_grad():
        out = compiled(xs[0])
    assert out.untyped_storage().data_ptr() != xs[0].untyped_storage().data_ptr()
    assert out.is_contiguous()
    torch.testing.assert_close(out, mod(xs[0]), rtol=0, atol=0)


@pytest.mark.compile
@pytest.mark.parametrize("kind", ["cat_of_weight_t", "stack_of_input_pieces", "cat_of_input_view"])
def test_optimus_backend_returns_fresh_cat(kind: str) -> None:
    torch._dynamo.reset()
    torch.manual_seed(0)
    mod, xs = Case(kind), _inputs(kind)
    w = mod.w.detach().clone()
    compiled = torch.compile(mod, backend=optimus.backend(OptimusConfig(cost_model=LAUNCH_BOUND)))
    x = xs[0].clone()
    with torch.no_grad():
        out = compiled(x)
        out.add_(1.0)
    torch.testing.assert_close(x, xs[0], rtol=0, atol=0)
    torch.testing.assert_close(mod.w.detach(), w, rtol=0, atol=0)


@pytest.mark.compile
def test_pre_grad_pass_returns_fresh_cat() -> None:
    from torch._inductor import config as inductor_config

    torch._dynamo.reset()
    torch.manual_seed(0)
    mod, xs = Case("cat_of_weight_t"), _inputs("cat_of_weight_t")
    w = mod.w.detach().clone()
    with inductor_config.patch(
        pre_grad_custom_pass=optimus.OptimusPreGradPass(OptimusConfig(cost_model=LAUNCH_BOUND))
    ):
        compiled = torch.compile(mod)
        with torch.no_grad():
            out = compiled(xs[0])
            out.add_(1.0)
    torch.testing.assert_close(mod.w.detach(), w, rtol=0, atol=0)
