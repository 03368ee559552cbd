"""Memory estimate of a training run, checked against the config's budget before allocation.

Why conservative: the estimate must reject configs that would swap or be OOM-killed in CI. It
counts fp32 weights, gradients and two optimizer states (Adam) for every parameter, embedding
tables included (the EBC's gradients are dense), intermediates twice (kept for backward, plus
their gradients) and all pre-generated batches.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from models.analysis import DenseAnalysis
from models.sparse import SparseLayout

GIB = 1024**3
STATE_COPIES = 4  # weight, grad, 2 Adam moments


def batches_bytes(cfg: Mapping[str, Any], lay: SparseLayout) -> int:
    b = int(cfg["batch_size"])
    ids = lay.num_features * b * float(cfg["pooling_mean"]) * 8  # int64 values
    lengths = lay.num_features * b * 4
    dense = b * (int(cfg["num_dense_features"]) + int(cfg["num_tasks"])) * 4
    return int(int(cfg["num_batches"]) * (ids + lengths + dense))


def estimate_bytes(cfg: Mapping[str, Any], lay: SparseLayout, dense: DenseAnalysis | None) -> int:
    """Training footprint; `dense=None` counts only the sparse part (a cheap first check)."""
    total = STATE_COPIES * lay.embedding_bytes + batches_bytes(cfg, lay)
    total += 2 * int(cfg["batch_size"]) * lay.pooled_dim * 4  # pooled output and its grad
    if dense is not None:
        total += STATE_COPIES * 4 * dense.dense_params + 2 * dense.activation_bytes
    return total


def check_fits(
    family_name: str, cfg: Mapping[str, Any], lay: SparseLayout, dense: DenseAnalysis | None
) -> None:
    need = estimate_bytes(cfg, lay, dense)
    budget = float(cfg["memory_budget_gib"]) * GIB
    if need > budget:
        raise ValueError(
            f"{family_name}: config needs about {need / GIB:.2f} GiB to train (embedding tables "
            f"{lay.embedding_bytes / GIB:.2f} GiB x{STATE_COPIES} for weights, grads and optimizer "
            f"state), over memory_budget_gib={cfg['memory_budget_gib']}; reduce rows_per_table, "
            f"embedding_dim, num_sparse_features, batch_size or num_batches, or raise memory_budget_gib"
        )
