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
