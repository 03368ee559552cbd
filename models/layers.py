"""Dense building blocks shared by the families: MLPs and per-feature towers.

Why per-feature blocks: production rankers process each feature (or feature group) with its own
small module, which is exactly the many-small-independent-ops shape that Optimus batches
horizontally. Writing the block once keeps the four families consistent and the node counts
predictable (about 7 FX nodes per Linear->LayerNorm->act layer, parameters included).
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
from torch import Tensor, nn

from models.sparse import SparseLayout


def mlp(in_dim: int, widths: Sequence[int], last_act: bool = True) -> nn.Sequential:
    """Linear -> ReLU stack; `last_act=False` leaves the last Linear bare (logits, projections)."""
    layers: list[nn.Module] = []
    for i, w in enumerate(widths):
        layers.append(nn.Linear(in_dim, w))
        if last_act or i < len(widths) - 1:
            layers.append(nn.ReLU())
        in_dim = w
    return nn.Sequential(*layers)


class FeatureTower(nn.Module):
    """`layers` x (Linear -> [LayerNorm] -> [SiLU]) on one feature, optionally gated.

    With `gate`, a second Linear reads the same input and the output is
    tower(x) * sigmoid(gate(x)): two modules reading one tensor, the shared-input pattern.
    """

    def __init__(self, in_dim: int, width: int, layers: int, norm: bool, act: bool, gate: bool) -> None:
        super().__init__()
        body: list[nn.Module] = []
        for _ in range(layers):
            body.append(nn.Linear(in_dim, width))
            if norm:
                body.append(nn.LayerNorm(width))
            if act:
                body.append(nn.SiLU())
            in_dim = width
        self.body = nn.Sequential(*body)
        self.gate = nn.Linear(body[0].in_features, width) if gate else None  # type: ignore[arg-type]

    def forward(self, x: Tensor) -> Tensor:
        y = self.body(x)
        if self.gate is not None:
            y = y * torch.sigmoid(self.gate(x))
        return y


class PerFeatureTowers(nn.Module):
    """One FeatureTower per input piece; returns the list of outputs in order. ``width``: one
    width for every tower, or one per tower (heterogeneous configs, see models/widths.py)."""

    def __init__(
        self,
        in_dims: Sequence[int],
        width: int | Sequence[int],
        layers: int,
        norm: bool,
        act: bool,
        gate: bool,
    ) -> None:
        super().__init__()
        outs = [width] * len(in_dims) if isinstance(width, int) else list(width)
        if len(outs) != len(in_dims):
            raise ValueError(f"PerFeatureTowers: {len(outs)} widths for {len(in_dims)} inputs")
        self.widths = outs
        self.towers = nn.ModuleList(
            FeatureTower(d, w, layers, norm, act, gate) for d, w in zip(in_dims, outs, strict=True)
        )

    def forward(self, pieces: Sequence[Tensor]) -> list[Tensor]:
        return [tower(x) for tower, x in zip(self.towers, pieces, strict=True)]


def split_sizes(total: int, parts: int) -> list[int]:
    """`total` split into `parts` contiguous sizes differing by at most one (feature groups)."""
    base, extra = divmod(total, parts)
    return [base + (1 if i < extra else 0) for i in range(parts)]


def feature_split(lay: SparseLayout) -> int | list[int]:
    """The ``torch.split`` argument that cuts the pooled embeddings into features: the one
    embedding dim (uniform configs: the graph stays exactly what it was) or every feature's dim."""
    return list(lay.feature_dims) if lay.table_dims else lay.embedding_dim
