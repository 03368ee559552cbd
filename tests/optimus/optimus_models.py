"""Small models the optimus tests share."""

from __future__ import annotations

import torch
from torch import nn


class Towers(nn.Module):
    """``n`` parallel Linear -> LayerNorm -> tanh towers over a split input (the acceptance model)."""

    def __init__(self, n: int = 32, width: int = 16, hidden: int = 16, bias: bool = True) -> None:
        super().__init__()
        self.width = width
        self.linears = nn.ModuleList([nn.Linear(width, hidden, bias=bias) for _ in range(n)])
        self.norms = nn.ModuleList([nn.LayerNorm(hidden) for _ in range(n)])

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        parts = torch.split(x, self.width, dim=1)
        outs = [
            torch.tanh(norm(lin(p))) for p, lin, norm in zip(parts, self.linears, self.norms, strict=True)
        ]
        return torch.cat(outs, dim=1)


class SlicedTowers(Towers):
    """Towers that index the input by slices instead of iterating over ``split`` outputs, so plain
    ``torch.fx.symbolic_trace`` can trace it (fast driver/rule tests without Dynamo)."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        w = self.width
        outs = [
            torch.tanh(norm(lin(x[:, i * w : (i + 1) * w])))
            for i, (lin, norm) in enumerate(zip(self.linears, self.norms, strict=True))
        ]
        return torch.cat(outs, dim=1)
