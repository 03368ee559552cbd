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
from models.layers import PerFeatureTowers, mlp
from models.sparse import SparseLayout

FIELDS: dict[str, Field] = {
    "num_experts": Field("int", "expert MLPs shared by all tasks", 1, 4096),
    "expert_mlp": Field("widths", "widths of each expert MLP", 1),
    "task_tower": Field("widths", "widths of each task tower (a 1-logit layer is appended)", 0),
    "adapter_dim": Field("int", "per-feature Linear->LayerNorm->SiLU width (0: none)", 0, 4096),
}


class MMoEDense(nn.Module):
    def __init__(self, cfg: Mapping[str, Any], lay: SparseLayout) -> None:
        super().__init__()
        d, n, adapter = lay.embedding_dim, lay.num_features, int(cfg["adapter_dim"])
        self.dim = d
        self.adapters = (
            PerFeatureTowers([d] * n, adapter, 1, norm=True, act=True, gate=False) if adapter else None
        )
        width = (adapter or d) * n + int(cfg["num_dense_features"])
        experts, tasks = int(cfg["num_experts"]), int(cfg["num_tasks"])
        self.experts = nn.ModuleList(mlp(width, cfg["expert_mlp"]) for _ in range(experts))
        self.gates = nn.ModuleList(nn.Linear(width, experts) for _ in range(tasks))
        hidden = cfg["expert_mlp"][-1]
        self.towers = nn.ModuleList(
            mlp(hidden, [*cfg["task_tower"], 1], last_act=False) for _ in range(tasks)
        )

    def forward(self, dense_features: Tensor, pooled: Tensor) -> Tensor:
        if self.adapters is not None:
            x = torch.cat([*self.adapters(torch.split(pooled, self.dim, dim=1)), dense_features], dim=1)
        else:
            x = torch.cat([pooled, dense_features], dim=1)
        experts = torch.stack([expert(x) for expert in self.experts], dim=1)  # [B, E, H]
        logits = []
        for gate, tower in zip(self.gates, self.towers, strict=True):
            weights = torch.softmax(gate(x), dim=-1).unsqueeze(-1)  # [B, E, 1]
            logits.append(tower((weights * experts).sum(dim=1)))
        return torch.cat(logits, dim=1)


def build_dense(cfg: Mapping[str, Any], lay: SparseLayout) -> nn.Module:
    return MMoEDense(cfg, lay)
