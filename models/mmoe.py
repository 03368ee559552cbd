"""MMoE: multi-gate mixture of experts (Ma et al. 2018) for multi-task ranking.

Shared input -> N expert MLPs; each task has its own softmax gate over the experts and its own
tower; logits [B, num_tasks] and the multi-task BCE loss. Industrial-scale change
(docs/models.md): `adapter_dim > 0` gives each sparse feature its own Linear -> LayerNorm -> SiLU
before the shared input is concatenated (0 = paper exact: raw pooled embeddings).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import torch
from torch import Tensor, nn

from models.fields import Field
from models.layers import adapted_input, feature_adapters, mlp
from models.sparse import SparseLayout
from models.widths import widths

FIELDS: dict[str, Field] = {
    "num_experts": Field("int", "expert MLPs shared by all tasks", 1, 4096),
    "expert_mlp": Field("widths", "widths of each expert MLP", 1),
    "task_tower": Field("widths", "widths of each task tower (a 1-logit layer is appended)", 0),
    "adapter_dim": Field("int", "per-feature Linear->LayerNorm->SiLU width (0: none)", 0, 4096),
}

# This family's own sizes per base scale; models/presets.py adds the sizes every family shares
# (SCALE_COMMON) and makes medium-hetero from medium.
PRESETS: dict[str, dict[str, Any]] = {
    "tiny": dict(num_sparse_features=4, num_experts=2, expert_mlp=(16,), task_tower=(8,),
                 adapter_dim=8),
    "small": dict(num_sparse_features=26, num_experts=4, expert_mlp=(128, 64), task_tower=(32,),
                  adapter_dim=16),
    "medium": dict(num_sparse_features=100, num_experts=8, expert_mlp=(256, 64), task_tower=(32,),
                   adapter_dim=8),
    "large": dict(num_sparse_features=385, num_experts=8, expert_mlp=(256, 64), task_tower=(32,),
                  adapter_dim=8),
    "xl": dict(num_sparse_features=1260, num_experts=16, expert_mlp=(512, 128), task_tower=(64,),
               adapter_dim=8),
}  # fmt: skip


class MMoEDense(nn.Module):
    def __init__(self, cfg: Mapping[str, Any], lay: SparseLayout) -> None:
        super().__init__()
        self.split, self.adapters, width = feature_adapters(cfg, lay, act=True)
        experts, tasks = int(cfg["num_experts"]), int(cfg["num_tasks"])
        # hetero: each expert's hidden widths but the last (stacked across experts) are drawn
        mlp_w = list(cfg["expert_mlp"])
        inner = [widths(cfg, experts, f"experts.{i}", w) for i, w in enumerate(mlp_w[:-1])]
        self.experts = nn.ModuleList(
            mlp(width, [*(col[e] for col in inner), mlp_w[-1]]) for e in range(experts)
        )
        self.gates = nn.ModuleList(nn.Linear(width, experts) for _ in range(tasks))
        hidden = mlp_w[-1]
        tower_w = [widths(cfg, tasks, f"task_towers.{i}", w) for i, w in enumerate(cfg["task_tower"])]
        self.towers = nn.ModuleList(
            mlp(hidden, [*(col[t] for col in tower_w), 1], last_act=False) for t in range(tasks)
        )

    def forward(self, dense_features: Tensor, pooled: Tensor) -> Tensor:
        x = adapted_input(self.adapters, self.split, dense_features, pooled)
        experts = torch.stack([expert(x) for expert in self.experts], dim=1)  # [B, E, H]
        logits = []
        for gate, tower in zip(self.gates, self.towers, strict=True):
            weights = torch.softmax(gate(x), dim=-1).unsqueeze(-1)  # [B, E, 1]
            logits.append(tower((weights * experts).sum(dim=1)))
        return torch.cat(logits, dim=1)


def build_dense(cfg: Mapping[str, Any], lay: SparseLayout) -> nn.Module:
    return MMoEDense(cfg, lay)
