"""The sparse arch: feature/table layout and the torchrec EmbeddingBagCollection built from it.

Why separate from the families: every family uses the same sparse arch, and the data generator
and the memory estimate need the layout (which feature reads which table, how many rows) without
building anything.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import torch

from models import widths
from models.torchrec_deps import torchrec

if TYPE_CHECKING:
    from torchrec import EmbeddingBagCollection


@dataclass(frozen=True)
class SparseLayout:
    """Features in KJT/pooled order; `feature_table[i]` is the table feature i reads."""

    feature_names: tuple[str, ...]
    table_names: tuple[str, ...]
    feature_table: tuple[int, ...]
    rows_per_table: int
    embedding_dim: int
    table_dims: tuple[int, ...] = ()  # per-table dims (hetero configs); empty: all embedding_dim

    @property
    def dims(self) -> tuple[int, ...]:
        """Embedding dim of every table."""
        return self.table_dims or (self.embedding_dim,) * self.num_tables

    @property
    def feature_dims(self) -> tuple[int, ...]:
        """Width of every feature's pooled embedding, in pooled order."""
        dims = self.dims
        return tuple(dims[t] for t in self.feature_table)

    @property
    def num_features(self) -> int:
        return len(self.feature_names)

    @property
    def num_tables(self) -> int:
        return len(self.table_names)

    @property
    def pooled_dim(self) -> int:
        """Width of `ebc(kjt).values()`: the second input of the dense arch."""
        if not self.table_dims:
            return self.num_features * self.embedding_dim
        return sum(self.feature_dims)

    @property
    def embedding_bytes(self) -> int:
        return self.rows_per_table * sum(self.dims) * 4  # fp32


def layout(cfg: Mapping[str, Any]) -> SparseLayout:
    """Features f0..fN-1; consecutive runs of `features_per_table` features share a table.
    With `hetero_seed`, every table has its own dim drawn from `widths.EMBEDDING_DIMS`."""
    n, per = int(cfg["num_sparse_features"]), int(cfg["features_per_table"])
    num_tables = (n + per - 1) // per
    seed = widths.hetero_seed(cfg)
    table_dims = () if seed is None else widths.draw(num_tables, seed, "tables", widths.EMBEDDING_DIMS)
    return SparseLayout(
        feature_names=tuple(f"f{i}" for i in range(n)),
        table_names=tuple(f"t{j}" for j in range(num_tables)),
        feature_table=tuple(i // per for i in range(n)),
        rows_per_table=int(cfg["rows_per_table"]),
        embedding_dim=int(cfg["embedding_dim"]),
        table_dims=table_dims,
    )


def build_ebc(lay: SparseLayout, device: torch.device) -> EmbeddingBagCollection:
    """One sum-pooled table per group of features, so pooled order == KJT key order."""
    tr = torchrec()
    tables = [
        tr.EmbeddingBagConfig(
            name=name,
            embedding_dim=dim,
            num_embeddings=lay.rows_per_table,
            feature_names=[f for f, t in zip(lay.feature_names, lay.feature_table, strict=True) if t == j],
            pooling=tr.PoolingType.SUM,
        )
        for j, (name, dim) in enumerate(zip(lay.table_names, lay.dims, strict=True))
    ]
    return tr.EmbeddingBagCollection(tables=tables, device=device)
