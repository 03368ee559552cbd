"""Analyse a config without allocating: dense params, activation bytes and FLOPs on the meta device.

Why the meta device: validation must reject a config that would not fit in memory *before*
anything is allocated, and the catalog lists every preset (xl included) in seconds. Building the
dense arch on `meta` gives exact parameter counts; one meta forward under a dispatch mode gives
the bytes of every intermediate and, with FlopCounterMode, the matmul FLOPs.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import torch
from torch import Tensor, nn
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_leaves
from torch.utils.flop_counter import FlopCounterMode

from models.registry import family
from models.sparse import SparseLayout


@dataclass(frozen=True)
class DenseAnalysis:
    dense_params: int
    activation_bytes: int  # sum of all intermediate outputs of one forward at batch_size
    flops_per_sample: int  # dense matmul FLOPs (forward) + embedding pooling adds


class _OutputBytes(TorchDispatchMode):
    """Sums the bytes of every op output: an upper bound on what autograd keeps for backward."""

    def __init__(self) -> None:
        super().__init__()
        self.total = 0

    def __torch_dispatch__(self, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
        out = func(*args, **(kwargs or {}))
        for leaf in tree_leaves(out):
            if isinstance(leaf, Tensor):
                self.total += leaf.numel() * leaf.element_size()
        return out


def build_dense_on_meta(family_name: str, cfg: Mapping[str, Any], lay: SparseLayout) -> nn.Module:
    with torch.device("meta"):
        return family(family_name).build_dense(cfg, lay)


def meta_inputs(cfg: Mapping[str, Any], lay: SparseLayout) -> tuple[Tensor, Tensor]:
    b = int(cfg["batch_size"])
    return (
        torch.empty(b, int(cfg["num_dense_features"]), device="meta"),
        torch.empty(b, lay.pooled_dim, device="meta"),
    )


def analyse(family_name: str, cfg: Mapping[str, Any], lay: SparseLayout) -> DenseAnalysis:
    dense = build_dense_on_meta(family_name, cfg, lay)
    inputs = meta_inputs(cfg, lay)
    counter = FlopCounterMode(display=False)
    sizes = _OutputBytes()
    with torch.no_grad(), counter, sizes:
        dense(*inputs)
    b = int(cfg["batch_size"])
    if lay.table_dims:
        pooling_adds = int(float(cfg["pooling_mean"]) * lay.pooled_dim)
    else:
        pooling_adds = int(lay.num_features * float(cfg["pooling_mean"]) * lay.embedding_dim)
    return DenseAnalysis(
        dense_params=sum(p.numel() for p in dense.parameters()),
        activation_bytes=sizes.total,
        flops_per_sample=counter.get_total_flops() // b + pooling_adds,
    )


# -- the training-memory estimate -------------------------------------------------------------
# Memory estimate of a training run, checked against the config's budget before allocation.
#
# Why conservative: the estimate must reject configs that would swap or be OOM-killed in CI. It
# counts fp32 weights, gradients and two optimizer states (Adam) for every parameter, embedding
# tables included (the EBC's gradients are dense), intermediates twice (kept for backward, plus
# their gradients) and all pre-generated batches.
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
