"""Dense building blocks shared by the families: MLPs and per-feature towers.

Why per-feature blocks: production rankers process each feature (or feature group) with its own
small module, which is exactly the many-small-independent-ops shape that Optimus batches
horizontally. Writing the block once keeps the four families consistent and the node counts
predictable (about 7 FX nodes per Linear->LayerNorm->act layer, parameters included).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import torch
from torch import Tensor, nn

from models.sparse import SparseLayout
from models.widths import widths


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


def feature_adapters(
    cfg: Mapping[str, Any], lay: SparseLayout, act: bool
) -> tuple[int | list[int], PerFeatureTowers | None, int]:
    """The per-feature ``Linear -> LayerNorm [-> SiLU]`` adapters in front of an interaction
    (``adapter_dim`` 0: none): (the split of the pooled embeddings, the adapters or None, the
    width of the input they make with the dense features). DCN and MMoE build them alike."""
    n, adapter = lay.num_features, int(cfg["adapter_dim"])
    adapter_widths = widths(cfg, n, "adapters", adapter) if adapter else ()  # hetero: drawn
    adapters = (
        PerFeatureTowers(lay.feature_dims, adapter_widths, 1, norm=True, act=act, gate=False)
        if adapter
        else None
    )
    width = (sum(adapter_widths) if adapter else lay.pooled_dim) + int(cfg["num_dense_features"])
    return feature_split(lay), adapters, width


def adapted_input(
    adapters: nn.Module | None, split: int | list[int], dense_features: Tensor, pooled: Tensor
) -> Tensor:
    """The interaction's input: the adapted features (or the pooled embeddings) and the dense ones."""
    if adapters is None:
        return torch.cat([pooled, dense_features], dim=1)
    return torch.cat([*adapters(torch.split(pooled, split, dim=1)), dense_features], dim=1)
