"""DLRM: bottom MLP on dense features, pairwise dot interaction with the embeddings, top MLP.

Structure of the DLRM paper (Naumov et al. 2019), with two industrial-scale changes, both
documented in docs/models.md:
- `feature_projections`: each sparse feature's pooled embedding gets its own Linear projection
  (the adapter production DLRMs use when tables have different widths); off = paper exact.
- `interaction_groups`: features are split into groups and the dot interaction runs per group
  (bottom-MLP output joins every group), so hundreds of features do not need an F x F matrix.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import torch
from torch import Tensor, nn

from models.fields import Field
from models.layers import PerFeatureTowers, feature_split, mlp, split_sizes
from models.sparse import SparseLayout

FIELDS: dict[str, Field] = {
    "bottom_mlp": Field("widths", "bottom MLP hidden widths (an embedding_dim layer is appended)", 0),
    "top_mlp": Field("widths", "top MLP hidden widths (a num_tasks logits layer is appended)", 1),
    "interaction_groups": Field("int", "feature groups with their own dot interaction", 1, 10_000),
    "feature_projections": Field("bool", "per-feature Linear projection before the interaction"),
}

# This family's own sizes per base scale; models/presets.py adds the sizes every family shares
# (SCALE_COMMON) and makes medium-hetero from medium.
PRESETS: dict[str, dict[str, Any]] = {
    "tiny": dict(num_sparse_features=4, bottom_mlp=(16,), top_mlp=(16,), interaction_groups=1,
                 feature_projections=True),
    "small": dict(num_sparse_features=26, bottom_mlp=(128, 64), top_mlp=(256, 128),
                  interaction_groups=1, feature_projections=True),
    "medium": dict(num_sparse_features=200, bottom_mlp=(256, 64), top_mlp=(512, 256),
                   interaction_groups=8, feature_projections=True),
    "large": dict(num_sparse_features=760, bottom_mlp=(256, 64), top_mlp=(512, 256),
                  interaction_groups=24, feature_projections=True),
    "xl": dict(num_sparse_features=2500, bottom_mlp=(512, 128), top_mlp=(1024, 512),
               interaction_groups=64, feature_projections=True),
}  # fmt: skip


def check_config(cfg: Mapping[str, Any]) -> None:
    """Limits between this family's fields (models/presets.py runs it after the field checks)."""
    if cfg["interaction_groups"] > cfg["num_sparse_features"]:
        raise ValueError(
            f"dlrm: config field 'interaction_groups'={cfg['interaction_groups']} exceeds "
            f"num_sparse_features={cfg['num_sparse_features']}; allowed: 1..num_sparse_features"
        )
    if "hetero_seed" in cfg and not cfg["feature_projections"]:
        raise ValueError(
            "dlrm: config field 'hetero_seed' needs feature_projections=True (the projections bring "
            "every table's own dim to the interaction's embedding_dim); allowed: feature_projections=True"
        )


class DLRMDense(nn.Module):
    def __init__(self, cfg: Mapping[str, Any], lay: SparseLayout) -> None:
        super().__init__()
        d, n = lay.embedding_dim, lay.num_features
        self.split = feature_split(lay)
        self.bottom = mlp(int(cfg["num_dense_features"]), [*cfg["bottom_mlp"], d])
        # hetero configs: each projection brings its table's own dim to d (different-K linears)
        self.projections = (
            PerFeatureTowers(lay.feature_dims, d, 1, norm=False, act=False, gate=False)
            if cfg["feature_projections"]
            else None
        )
        self.group_sizes = split_sizes(n, int(cfg["interaction_groups"]))
        interaction_width = 0
        for g, size in enumerate(self.group_sizes):
            rows, cols = torch.tril_indices(size + 1, size + 1, offset=-1)
            # Flat indices of the strictly-lower triangle of the (size+1)^2 dot-product matrix.
            self.register_buffer(f"pairs_{g}", rows * (size + 1) + cols, persistent=False)
            interaction_width += rows.numel()
        self.top = mlp(d + interaction_width, [*cfg["top_mlp"], int(cfg["num_tasks"])], last_act=False)

    def forward(self, dense_features: Tensor, pooled: Tensor) -> Tensor:
        x = self.bottom(dense_features)
        feats = list(torch.split(pooled, self.split, dim=1))
        if self.projections is not None:
            feats = self.projections(feats)
        outs = [x]
        start = 0
        for g, size in enumerate(self.group_sizes):
            group = torch.stack([x, *feats[start : start + size]], dim=1)  # [B, size+1, D]
            dots = torch.bmm(group, group.transpose(1, 2)).flatten(1)
            outs.append(dots[:, getattr(self, f"pairs_{g}")])
            start += size
        return self.top(torch.cat(outs, dim=1))


def build_dense(cfg: Mapping[str, Any], lay: SparseLayout) -> nn.Module:
    return DLRMDense(cfg, lay)
