"""Per-feature towers: the pattern that dominates industrial rankers.

Each sparse feature has its own small tower (Linear -> LayerNorm -> SiLU, 1-3 layers) gated by a
second Linear reading the same input (tower(x) * sigmoid(gate(x))); the wide dense-feature input
is split into feature groups with their own gated towers; everything is concatenated back and an
over-arch MLP makes the task logits. These are the shapes Optimus rewrites: many independent
same-shape Linear/LayerNorm/pointwise ops, shared-input Linears, split -> ... -> cat.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import torch
from torch import Tensor, nn

from models.fields import Field
from models.layers import PerFeatureTowers, feature_split, mlp, split_sizes
from models.sparse import SparseLayout
from models.widths import widths

FIELDS: dict[str, Field] = {
    "tower_layers": Field("int", "Linear->LayerNorm->SiLU layers per feature tower", 1, 3),
    "tower_dim": Field("int", "width of every feature tower", 1, 4096),
    "dense_groups": Field("int", "groups the dense features are split into", 1, 100_000),
    "gated": Field("bool", "gate every tower with sigmoid(Linear(x))"),
    "over_arch": Field("widths", "over-arch MLP widths (a num_tasks logits layer is appended)", 1),
}

# This family's own sizes per base scale; models/presets.py adds the sizes every family shares
# (SCALE_COMMON) and makes medium-hetero from medium.
PRESETS: dict[str, dict[str, Any]] = {
    "tiny": dict(num_sparse_features=4, tower_layers=2, tower_dim=8, dense_groups=2, gated=True,
                 over_arch=(16,)),
    "small": dict(num_sparse_features=26, tower_layers=2, tower_dim=16, dense_groups=4, gated=True,
                  over_arch=(256, 64)),
    "medium": dict(num_sparse_features=60, tower_layers=2, tower_dim=16, dense_groups=8, gated=True,
                   over_arch=(512, 128)),
    "large": dict(num_sparse_features=150, tower_layers=2, tower_dim=16, dense_groups=16, gated=True,
                  over_arch=(1024, 256)),
    "xl": dict(num_sparse_features=480, tower_layers=2, tower_dim=16, dense_groups=32, gated=True,
               over_arch=(1024, 256)),
}  # fmt: skip


def check_config(cfg: Mapping[str, Any]) -> None:
    """Limits between this family's fields (models/presets.py runs it after the field checks)."""
    if cfg["dense_groups"] > cfg["num_dense_features"]:
        raise ValueError(
            f"towers: config field 'dense_groups'={cfg['dense_groups']} exceeds num_dense_features="
            f"{cfg['num_dense_features']}; allowed: 1..num_dense_features"
        )


class TowersDense(nn.Module):
    def __init__(self, cfg: Mapping[str, Any], lay: SparseLayout) -> None:
        super().__init__()
        n = lay.num_features
        width, layers, gated = int(cfg["tower_dim"]), int(cfg["tower_layers"]), bool(cfg["gated"])
        self.split = feature_split(lay)
        self.group_sizes = split_sizes(int(cfg["num_dense_features"]), int(cfg["dense_groups"]))
        groups = len(self.group_sizes)
        tower_widths = widths(cfg, n + groups, "towers", width)  # all tower_dim unless hetero
        self.sparse_towers = PerFeatureTowers(
            lay.feature_dims, tower_widths[:n], layers, norm=True, act=True, gate=gated
        )
        self.dense_towers = PerFeatureTowers(
            self.group_sizes, tower_widths[n:], layers, norm=True, act=True, gate=gated
        )
        over_in = sum(tower_widths)
        self.over_arch = mlp(over_in, [*cfg["over_arch"], int(cfg["num_tasks"])], last_act=False)

    def forward(self, dense_features: Tensor, pooled: Tensor) -> Tensor:
        sparse = self.sparse_towers(torch.split(pooled, self.split, dim=1))
        dense = self.dense_towers(torch.split(dense_features, self.group_sizes, dim=1))
        return self.over_arch(torch.cat([*sparse, *dense], dim=1))


def build_dense(cfg: Mapping[str, Any], lay: SparseLayout) -> nn.Module:
    return TowersDense(cfg, lay)
