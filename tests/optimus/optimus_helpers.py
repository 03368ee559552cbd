"""Shared checks: forward and backward parity between a module and its optimized graph."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch
from torch import fx, nn

import optimus
from optimus.cost.analytic import AnalyticCostModel, DeviceConstants

# A launch-dominated device: every rewrite that saves launches is rated a win, so rule tests
# exercise the rewrite itself (the default model's declines are tested separately).
LAUNCH_BOUND = AnalyticCostModel(cpu=DeviceConstants(launch_s=1e-3, bytes_per_s=1e12, flops_per_s=1e14))


def grads_of(module: nn.Module, inputs: Sequence[torch.Tensor], fn: Any = None) -> tuple[Any, list[Any]]:
    """Output and gradients (parameters, then float inputs) of a seeded forward + backward."""
    leaves = [x.detach().clone().requires_grad_(True) if x.is_floating_point() else x for x in inputs]
    params = [p for p in module.parameters() if p.requires_grad]
    torch.manual_seed(0)
    out = (fn if fn is not None else module)(*leaves)
    outs = out if isinstance(out, (list, tuple)) else (out,)
    gen = torch.Generator().manual_seed(1)
    loss = sum((o * torch.randn(o.shape, generator=gen)).sum() for o in outs if o.is_floating_point())
    wrt = params + [x for x in leaves if isinstance(x, torch.Tensor) and x.requires_grad]
    grads = torch.autograd.grad(loss, wrt, allow_unused=True) if wrt else ()
    return [o.detach() for o in outs], list(grads)


def assert_parity(
    module: nn.Module, gm: Any, inputs: Sequence[torch.Tensor], rtol: float = 1e-4, atol: float = 1e-5
) -> None:
    """Outputs and the gradients on ``module``'s own parameters (and inputs) match."""
    ref_out, ref_grads = grads_of(module, inputs)
    new_out, new_grads = grads_of(module, inputs, fn=gm)
    assert len(ref_out) == len(new_out)
    for a, b in zip(ref_out, new_out, strict=True):
        torch.testing.assert_close(b, a, rtol=rtol, atol=atol)
    assert len(ref_grads) == len(new_grads)
    for a, b in zip(ref_grads, new_grads, strict=True):
        assert (a is None) == (b is None)
        if a is not None:
            torch.testing.assert_close(b, a, rtol=rtol, atol=atol)


def optimize_traced(module: nn.Module, inputs: Sequence[torch.Tensor], **kw: Any) -> fx.GraphModule:
    """optimize() on a symbolic_trace of ``module`` (fast: no Dynamo) for rule unit tests."""
    kw.setdefault("cost_model", LAUNCH_BOUND)
    return optimus.optimize(fx.symbolic_trace(module), tuple(inputs), **kw)


def count_calls(gm: fx.GraphModule, *targets: Any) -> int:
    return sum(1 for n in gm.graph.nodes if n.op == "call_function" and n.target in targets)


class _Fn1(nn.Module):
    def __init__(self, fn: Any, **params: torch.Tensor) -> None:
        super().__init__()
        self.fn = fn
        for name, value in params.items():
            self.register_parameter(name, nn.Parameter(value))

    def forward(self, x: Any) -> Any:
        return self.fn(self, x)


class _Fn2(_Fn1):
    def forward(self, x: Any, y: Any) -> Any:  # type: ignore[override]
        return self.fn(self, x, y)


def Fn(fn: Any, **params: torch.Tensor) -> nn.Module:
    """Wrap ``fn(self, x)`` or ``fn(self, x, y)`` (plus named parameters) as a traceable module."""
    arity = fn.__code__.co_argcount - 1
    return (_Fn1 if arity == 1 else _Fn2)(fn, **params)


def traced_context(module: nn.Module, inputs: Sequence[torch.Tensor]) -> Any:
    """A ``RewriteContext`` over ``module`` traced, its values recorded from ``inputs`` and its
    modules lowered, priced launch-bound: what a rule or the live estimate sees of it."""
    from optimus.engine.context import RewriteContext
    from optimus.semantics.meta import record
    from optimus.semantics.normalize import lower_modules

    gm = fx.symbolic_trace(module)
    record(gm, tuple(inputs))
    lower_modules(gm)
    return RewriteContext(gm, LAUNCH_BOUND)


def rule_keys(module: nn.Module, inputs: Sequence[torch.Tensor], rule_name: str) -> list[Any]:
    """The horizontal-group key ``rule_name`` gives each node of the traced module (None: declined).
    Nodes with different keys can never be fused together, whatever the cost model says."""
    from optimus.rules import REGISTRY

    ctx = traced_context(module, inputs)
    gm = ctx.gm
    rule = REGISTRY[rule_name]()
    return [
        rule.key(n, ctx)
        for n in gm.graph.nodes
        if n.op in ("call_function", "call_method") and rule.key(n, ctx) is not None
    ]
