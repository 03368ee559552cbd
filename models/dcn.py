"""DCN-v2: low-rank cross network (stacked or parallel with a deep tower) over the embeddings.

Wang et al. 2021: x_{l+1} = x_0 * (U_l (V_l^T x_l) + b_l) + x_l, with V_l, U_l of rank r.
`structure="stacked"` feeds the cross output into the deep tower; `"parallel"` runs both on x_0
and concatenates. Industrial-scale change (docs/models.md): `adapter_dim > 0` gives each sparse
feature its own Linear -> LayerNorm before the concatenation into x_0 (0 = paper exact).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import torch
from torch import Tensor, nn

from models.fields import Field
from models.layers import adapted_input, feature_adapters, mlp
from models.sparse import SparseLayout

FIELDS: dict[str, Field] = {
    "structure": Field("str", "cross and deep arrangement", choices=("stacked", "parallel")),
    "cross_layers": Field("int", "low-rank cross layers", 1, 1000),
    "cross_rank": Field("int", "rank r of each cross layer", 1, 4096),
    "deep_mlp": Field("widths", "deep tower widths", 1),
    "adapter_dim": Field("int", "per-feature Linear->LayerNorm width (0: none)", 0, 4096),
}

# This family's own sizes per base scale; models/presets.py adds the sizes every family shares
# (SCALE_COMMON) and makes medium-hetero from medium.
PRESETS: dict[str, dict[str, Any]] = {
    "tiny": dict(num_sparse_features=4, structure="stacked", cross_layers=2, cross_rank=4,
                 deep_mlp=(16,), adapter_dim=8),
    "small": dict(num_sparse_features=26, structure="stacked", cross_layers=3, cross_rank=32,
                  deep_mlp=(256, 128), adapter_dim=16),
    "medium": dict(num_sparse_features=120, structure="parallel", cross_layers=3, cross_rank=64,
                   deep_mlp=(512, 256), adapter_dim=8),
    "large": dict(num_sparse_features=440, structure="parallel", cross_layers=4, cross_rank=64,
                  deep_mlp=(512, 256), adapter_dim=8),
    "xl": dict(num_sparse_features=1450, structure="parallel", cross_layers=4, cross_rank=128,
               deep_mlp=(1024, 512), adapter_dim=8),
}  # fmt: skip


class LowRankCross(nn.Module):
    """One DCN-v2 cross layer with a rank-r weight: x0 * U(V(x)) + x."""

    def __init__(self, width: int, rank: int) -> None:
        super().__init__()
        self.v = nn.Linear(width, rank, bias=False)
        self.u = nn.Linear(rank, width)

    def forward(self, x0: Tensor, x: Tensor) -> Tensor:
        return x0 * self.u(self.v(x)) + x


class DCNDense(nn.Module):
    def __init__(self, cfg: Mapping[str, Any], lay: SparseLayout) -> None:
        super().__init__()
        self.split, self.adapters, width = feature_adapters(cfg, lay, act=False)
        self.cross = nn.ModuleList(
            LowRankCross(width, int(cfg["cross_rank"])) for _ in range(cfg["cross_layers"])
        )
        self.stacked = cfg["structure"] == "stacked"
        self.deep = mlp(width, cfg["deep_mlp"])
        head_in = cfg["deep_mlp"][-1] + (0 if self.stacked else width)
        self.head = nn.Linear(head_in, int(cfg["num_tasks"]))

    def forward(self, dense_features: Tensor, pooled: Tensor) -> Tensor:
        x0 = adapted_input(self.adapters, self.split, dense_features, pooled)
        x = x0
        for layer in self.cross:
            x = layer(x0, x)
        if self.stacked:
            return self.head(self.deep(x))
        return self.head(torch.cat([x, self.deep(x0)], dim=1))


def build_dense(cfg: Mapping[str, Any], lay: SparseLayout) -> nn.Module:
    return DCNDense(cfg, lay)
