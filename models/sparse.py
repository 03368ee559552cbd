"""The sparse arch: feature/table layout and the torchrec EmbeddingBagCollection built from it.

Why separate from the families: every family uses the same sparse arch, and the data generator
and the memory estimate need the layout (which feature reads which table, how many rows) without
building anything.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import torch
from torchrec import EmbeddingBagCollection, EmbeddingBagConfig, PoolingType


@dataclass(frozen=True)
class SparseLayout:
    """Features in KJT/pooled order; `feature_table[i]` is the table feature i reads."""

    feature_names: tuple[str, ...]
    table_names: tuple[str, ...]
    feature_table: tuple[int, ...]
    rows_per_table: int
    embedding_dim: int

    @property
    def num_features(self) -> int:
        return len(self.feature_names)

    @property
    def num_tables(self) -> int:
        return len(self.table_names)

    @property
    def pooled_dim(self) -> int:
        """Width of `ebc(kjt).values()`: the second input of the dense arch."""
        return self.num_features * self.embedding_dim

    @property
    def embedding_bytes(self) -> int:
        return self.num_tables * self.rows_per_table * self.embedding_dim * 4  # fp32


def layout(cfg: Mapping[str, Any]) -> SparseLayout:
    """Features f0..fN-1; consecutive runs of `features_per_table` features share a table."""
    n, per = int(cfg["num_sparse_features"]), int(cfg["features_per_table"])
    num_tables = (n + per - 1) // per
    return SparseLayout(
        feature_names=tuple(f"f{i}" for i in range(n)),
        table_names=tuple(f"t{j}" for j in range(num_tables)),
        feature_table=tuple(i // per for i in range(n)),
        rows_per_table=int(cfg["rows_per_table"]),
        embedding_dim=int(cfg["embedding_dim"]),
    )


def build_ebc(lay: SparseLayout, device: torch.device) -> EmbeddingBagCollection:
    """One sum-pooled table per group of features, so pooled order == KJT key order."""
    tables = [
        EmbeddingBagConfig(
            name=name,
            embedding_dim=lay.embedding_dim,
            num_embeddings=lay.rows_per_table,
            feature_names=[f for f, t in zip(lay.feature_names, lay.feature_table, strict=True) if t == j],
            pooling=PoolingType.SUM,
        )
        for j, name in enumerate(lay.table_names)
    ]
    return EmbeddingBagCollection(tables=tables, device=device)
