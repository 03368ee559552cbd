"""Small models for the caller's-world tests: towers whose linears Optimus batches (so the
re-layout applies), with mode-dependent layers, in-place input updates and Python side effects."""

from __future__ import annotations

from typing import Any

import torch
from optimus_helpers import LAUNCH_BOUND
from torch import nn

import optimus
from optimus.params.relayout import RelayoutParams

# optimize() under the default layout and under the parameter re-layout (the harness's); the
# launch-bound cost model makes the rules fire on these small models (so relayout applies)
CONFIGS = {
    "default": optimus.OptimusConfig(cost_model=LAUNCH_BOUND),
    "relayout": optimus.OptimusConfig(cost_model=LAUNCH_BOUND, layout=RelayoutParams()),
}


class ModeTowers(nn.Module):
    """Sixteen Linear -> BatchNorm1d -> Dropout towers over a split input: dropout and BatchNorm's
    statistics depend on train/eval mode; the linears are batched by Optimus. (Local, not the
    shared models/synthetic_towers.py: these tests need the mode-dependent BatchNorm/Dropout.)"""

    def __init__(self, n: int = 16, width: int = 16) -> None:
        super().__init__()
        self.width = width
        self.linears = nn.ModuleList([nn.Linear(width, width) for _ in range(n)])
        self.norms = nn.ModuleList([nn.BatchNorm1d(width) for _ in range(n)])
        self.drop = nn.Dropout(0.5)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        parts = torch.split(x, self.width, dim=1)
        outs = [self.drop(n(lin(p))) for p, lin, n in zip(parts, self.linears, self.norms, strict=True)]
        return torch.cat(outs, dim=1)


class ScaledTowers(nn.Module):
    """Towers whose output depends on a Python scalar and on the batch size (a reshape). (Local,
    not the shared models/synthetic_towers.py: the test needs the extra scalar argument.)"""

    def __init__(self, n: int = 16, width: int = 16) -> None:
        super().__init__()
        self.width = width
        self.linears = nn.ModuleList([nn.Linear(width, width) for _ in range(n)])

    def forward(self, x: torch.Tensor, scale: float = 1.0) -> torch.Tensor:
        parts = torch.split(x, self.width, dim=1)
        h = torch.cat([torch.tanh(lin(p)) for p, lin in zip(parts, self.linears, strict=True)], dim=1)
        return (h * scale).reshape(x.shape[0] * 2, -1)


class MutatingTowers(ModeTowers):
    """Also adds to its input in place (unless ``inplace=False``) and draws from the RNG outside
    any module."""

    def __init__(self, inplace: bool = True) -> None:
        super().__init__()
        self.inplace = inplace

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.inplace:
            x.add_(1.0)
        return super().forward(x) + 0.01 * torch.rand_like(x)


class RecordingTowers(ModeTowers):
    """Python side effects in forward: an attribute assignment and a list append."""

    def __init__(self) -> None:
        super().__init__()
        self.calls: list[int] = []
        self.last: Any = "before"

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = super().forward(x)
        self.calls.append(1)
        self.last = y.detach()
        return y


def state_of(module: nn.Module) -> dict[str, torch.Tensor]:
    """Every parameter and buffer, cloned (bitwise comparisons before/after)."""
    return {k: v.detach().clone() for k, v in module.state_dict(keep_vars=True).items()}


def assert_same_state(a: dict[str, torch.Tensor], b: dict[str, torch.Tensor]) -> None:
    assert a.keys() == b.keys()
    for k in a:
        assert torch.equal(a[k], b[k]), f"{k} changed"


def seeded(fn: Any, *args: Any, seed: int = 1) -> Any:
    torch.manual_seed(seed)
    return fn(*args)


def backward_grads(model: nn.Module, fn: Any, *args: Any) -> list[torch.Tensor | None]:
    """``.grad`` of every parameter of ``model`` after ``fn(*args)``'s weighted sum's backward
    (``.backward()``, which the re-layout supports; ``autograd.grad`` on the originals it does not)."""
    model.zero_grad(set_to_none=True)
    out = fn(*args)
    weight = torch.randn(out.shape, generator=torch.Generator().manual_seed(1))
    (out * weight).sum().backward()
    grads = [None if p.grad is None else p.grad.clone() for p in model.parameters()]
    model.zero_grad(set_to_none=True)
    return grads
