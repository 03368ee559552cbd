"""Fused results come back laid out as eager's.

merge_shared_linear, batch_linear (a tower and its gate on one input) and batch_unary/binary (on
the pieces of one split) used to hand back column slices or permuted views of the batched output:
``.view(-1)`` raised, ``as_strided`` read other elements. Each case runs under ``optimize`` with
the default layout and with ``RelayoutParams``; results must match eager in values, strides,
contiguity and aliasing, and every node's recorded meta must be what runs. The compile-marked
tests run the same cases through ``torch.compile(backend="optimus")`` and the pre-grad pass.
"""

from __future__ import annotations

import copy
from collections.abc import Callable
from typing import Any

import pytest
import torch
import torch.nn.functional as F
from layout_helpers import assert_meta_matches, assert_same_results
from optimus_helpers import LAUNCH_BOUND
from torch import nn

import optimus
from optimus import OptimusConfig
from optimus.params.relayout import RelayoutParams

LAYOUTS = {"default": lambda: OptimusConfig(), "relayout": lambda: OptimusConfig(layout=RelayoutParams())}


class QKV(nn.Module):
    """q, k, v = Linear(64, 64) on one x: merge_shared_linear's case."""

    def __init__(self, use: str, bias: bool = False) -> None:
        super().__init__()
        self.use = use
        self.q, self.k, self.v = (nn.Linear(64, 64, bias=bias) for _ in range(3))

    def forward(self, x: torch.Tensor) -> Any:
        q, k, v = self.q(x), self.k(x), self.v(x)
        if self.use == "view":
            return q.view(-1) + k.view(-1) * 2.0 + v.view(-1)
        if self.use == "as_strided":
            n = x.shape[0]
            return (
                q.as_strided((n, 64), (64, 1))
                + k.as_strided((n, 64), (64, 1)) * 2.0
                + v.as_strided((n, 64), (64, 1))
            )
        return q, k, v  # returned: the caller sees the layout


class Heads(nn.Module):
    """Unequal widths: the wide linear stays; the one observed piece gets a copy."""

    def __init__(self) -> None:
        super().__init__()
        self.heads = nn.ModuleList([nn.Linear(16, w, bias=False) for w in (8, 12, 4, 8, 6)])

    def forward(self, x: torch.Tensor) -> list[torch.Tensor]:
        first, *rest = (h(x) for h in self.heads)
        return [first.view(-1), *(torch.relu(r) for r in rest)]


class TowerGate(nn.Module):
    """A tower and its gate reading each input: batch_linear's shared-input form."""

    def __init__(self, g: int = 8, d: int = 16) -> None:
        super().__init__()
        self.tower = nn.ModuleList([nn.Linear(d, d) for _ in range(g)])
        self.gate = nn.ModuleList([nn.Linear(d, d) for _ in range(g)])

    def forward(self, *xs: torch.Tensor) -> list[torch.Tensor]:
        return [
            t(x).view(-1) * torch.sigmoid(g(x)).view(-1)
            for t, g, x in zip(self.tower, self.gate, xs, strict=True)
        ]


class SplitPointwise(nn.Module):
    """Unary and binary ops on the pieces of one split: batch_unary / batch_binary."""

    def __init__(self, use: str) -> None:
        super().__init__()
        self.use = use

    def forward(self, x: torch.Tensor) -> Any:
        ps = torch.split(x, 8, 1)
        ts = [torch.tanh(p) for p in ps]
        ms = [p * 3.0 for p in ps]
        if self.use == "view":
            return [t.view(-1) for t in ts] + [m.view(-1) for m in ms]
        if self.use == "as_strided":
            return [
                t.as_strided((4, 8), (8, 1)) + m.as_strided((4, 8), (8, 1))
                for t, m in zip(ts, ms, strict=True)
            ]
        return ts + ms


CASES: dict[str, tuple[Callable[[], nn.Module], Callable[[], list[torch.Tensor]], str]] = {
    "qkv_view": (lambda: QKV("view"), lambda: [torch.randn(512, 64)], "merge_shared_linear"),
    "qkv_as_strided": (lambda: QKV("as_strided"), lambda: [torch.randn(512, 64)], "merge_shared_linear"),
    "qkv_returned": (
        lambda: QKV("return"),
        lambda: [torch.randn(2, 8, 64)],
        "merge_shared_linear",
    ),
    "heads_unequal_view": (Heads, lambda: [torch.randn(6, 16)], "merge_shared_linear"),
    "tower_gate_view": (TowerGate, lambda: [torch.randn(8, 16) for _ in range(8)], "batch_linear"),
    "split_unary_view": (lambda: SplitPointwise("view"), lambda: [torch.randn(4, 32)], "batch_unary"),
    "split_as_strided": (lambda: SplitPointwise("as_strided"), lambda: [torch.randn(4, 32)], "batch_unary"),
    "split_returned": (lambda: SplitPointwise("return"), lambda: [torch.randn(4, 32)], "batch_binary"),
}


def _run(case: str, layout: str, cost_model: Any) -> tuple[nn.Module, Any, list[torch.Tensor]]:
    make, inputs, _ = CASES[case]
    torch.manual_seed(0)
    mod, xs = make(), inputs()
    gm = optimus.optimize(copy.deepcopy(mod), xs, cost_model=cost_model, config=LAYOUTS[layout]())
    return mod, gm, xs


@pytest.mark.parametrize("layout", list(LAYOUTS))
@pytest.mark.parametrize("case", list(CASES))
def test_fused_results_keep_eager_layout(case: str, layout: str) -> None:
    """Rules made to fire (a launch-bound cost model): values, strides, contiguity, aliasing and
    recorded meta all match eager."""
    mod, gm, xs = _run(case, layout, LAUNCH_BOUND)
    fired = gm.optimus_report.rules_fired
    rule = CASES[case][2]
    if not (rule == "batch_linear" and layout == "relayout"):  # relayout prefers merging per input
        assert fired.get(rule, 0) >= 1, fired
    else:
        assert fired.get(rule, 0) + fired.get("merge_shared_linear", 0) >= 1, fired
    with torch.no_grad():
        assert_same_results(mod(*xs), gm(*xs), [*xs, *mod.parameters()], rtol=1e-5, atol=1e-5)
    assert assert_meta_matches(gm, xs) > 0


@pytest.mark.parametrize("layout", list(LAYOUTS))
@pytest.mark.parametrize("case", ["qkv_view", "qkv_as_strided", "tower_gate_view", "split_unary_view"])
def test_default_cost_model_keeps_eager_layout(case: str, layout: str) -> None:
    mod, gm, xs = _run(case, layout, None)
    with torch.no_grad():
        assert_same_results(mod(*xs), gm(*xs), [*xs, *mod.parameters()], rtol=1e-5, atol=1e-5)
    assert_meta_matches(gm, xs)


def test_merged_linears_are_one_batched_gemm_with_contiguous_members() -> None:
    """By construction: equal widths give one bmm whose unbind pieces are contiguous (no copy)."""
    _mod, gm, xs = _run("qkv_returned", "default", LAUNCH_BOUND)
    targets = [n.target for n in gm.graph.nodes if n.op in ("call_function", "call_method")]
    assert targets.count(torch.bmm) == 1 and F.linear not in targets
    assert "contiguous" not in targets
    outs = gm(*xs)
    assert all(o.is_contiguous() for o in outs)


def test_merged_linear_gradients_match() -> None:
    from optimus_helpers import assert_parity

    torch.manual_seed(0)
    mod = QKV("return")
    xs = [torch.randn(2, 8, 64)]
    gm = optimus.optimize(mod, xs, cost_model=LAUNCH_BOUND)
    assert gm.optimus_report.rules_fired.get("merge_shared_linear") == 1
    assert_parity(mod, gm, xs)


@pytest.mark.compile
@pytest.mark.parametrize("case", ["qkv_as_strided", "split_as_strided"])
def test_optimus_backend_keeps_eager_layout(case: str) -> None:
    torch._dynamo.reset()
    make, inputs, _ = CASES[case]
    torch.manual_seed(0)
    mod, xs = make(), inputs()
    compiled = torch.compile(mod, backend=optimus.backend(OptimusConfig(cost_model=LAUNCH_BOUND)))
    with torch.no_grad():
        torch.testing.assert_close(compiled(*xs), mod(*xs), rtol=1e-4, atol=1e-4)


@pytest.mark.compile
def test_pre_grad_pass_keeps_eager_layout() -> None:
    torch._dynamo.reset()
    make, inputs, _ = CASES["qkv_as_strided"]
    torch.manual_seed(0)
    mod, xs = make(), inputs()
    from torch._inductor import config as inductor_config

    with inductor_config.patch(
        pre_grad_custom_pass=optimus.OptimusPreGradPass(OptimusConfig(cost_model=LAUNCH_BOUND))
    ):
        compiled = torch.compile(mod)
        with torch.no_grad():
            torch.testing.assert_close(compiled(*xs), mod(*xs), rtol=1e-4, atol=1e-4)
