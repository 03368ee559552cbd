"""Large synthetic dense graphs for timing the optimizer's own passes.

Why synthetic: the optimizer's cost must stay about linear in graph size, and the model
presets stop at a few thousand nodes. A per-feature-tower graph (split -> N independent
linear/relu/linear/relu/layer_norm branches -> cat -> head) has the shape Optimus targets
(horizontal fusion, split/cat) and scales to any width with one parameter. The model is the
repository's one synthetic towers model (models/synthetic_towers.py) in this configuration.
"""

from __future__ import annotations

from typing import Any

BODY = ("linear", "relu", "linear", "relu", "norm")


def build_towers(branches: int, dim: int = 8, hidden: int = 16, batch: int = 32, seed: int = 0) -> Any:
    """Return ``(module, example_inputs)`` for a graph of ``branches`` parallel towers."""
    import torch

    from models.synthetic_towers import Towers

    if branches < 1:
        raise ValueError(f"branches must be >= 1, got {branches}")
    torch.manual_seed(seed)
    module = Towers(branches, dim, hidden, body=BODY, head=1).eval()
    example = (torch.randn(batch, branches * dim, generator=torch.Generator().manual_seed(seed)),)
    return module, example
