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
