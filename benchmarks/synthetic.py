"""Large synthetic dense graphs for timing the optimizer's own passes.

Why synthetic: the optimizer's cost must stay about linear in graph size, and the model
presets stop at a few thousand nodes. A per-feature-tower graph (split -> N independent
linear/relu/linear/layer_norm branches -> cat -> head) has the shape Optimus targets
(horizontal fusion, split/cat) and scales to any width with one parameter.
"""

from __future__ import annotations

from typing import Any


def build_towers(branches: int, dim: int = 8, hidden: int = 16, batch: int = 32, seed: int = 0) -> Any:
    """Return ``(module, example_inputs)`` for a graph of ``branches`` parallel towers."""
    import torch
    from torch import nn

    if branches < 1:
        raise ValueError(f"branches must be >= 1, got {branches}")

    class Towers(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.inner = nn.ModuleList(nn.Linear(dim, hidden) for _ in range(branches))
            self.outer = nn.ModuleList(nn.Linear(hidden, hidden) for _ in range(branches))
            self.norms = nn.ModuleList(nn.LayerNorm(hidden) for _ in range(branches))
            self.head = nn.Linear(branches * hidden, 1)

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            parts = torch.split(x, dim, dim=1)
            outs = [
                norm(torch.relu(outer(torch.relu(inner(p)))))
                for p, inner, outer, norm in zip(parts, self.inner, self.outer, self.norms, strict=True)
            ]
            return self.head(torch.cat(outs, dim=1))

    torch.manual_seed(seed)
    module = Towers().eval()
    example = (torch.randn(batch, branches * dim, generator=torch.Generator().manual_seed(seed)),)
    return module, example
