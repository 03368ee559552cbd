"""A provider of the dense archs alone: `models.build`'s contract without torchrec or fbgemm.

    optimus-bench run --provider models.dense_only:build --device cuda ...

Why: the dense arch (`Built.module.dense`) is what every mode prepares and what Optimus
rewrites; the sparse arch only turns KJT batches into the pooled embeddings it reads. Where
torchrec cannot be installed (the project's GPU machine has torch and Triton, nothing else), this
builds the same dense arch (same config, same parameter shapes as `models.build`) and feeds it
seeded random pooled embeddings of the right width instead of EBC lookups. Parameter values and
data differ from `models.build` (it draws the EBC's weights first from the same seed), so
figures are comparable across modes and devices of this provider, not with full-model cells.
`meta["provider"] == "dense_only"` marks its cells.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any

import torch
from torch import Tensor, nn

from models import analysis, builder, capture, sparse
from models.presets import SCALES
from models.registry import FAMILIES, family
from models.types import Batch, Built

__all__ = ["FAMILIES", "SCALES", "DenseOnlyModel", "build"]


class DenseOnlyModel(nn.Module):
    """`module(dense_features, pooled)`: the dense arch alone; `.dense` is what modes prepare."""

    def __init__(self, dense: nn.Module) -> None:
        super().__init__()
        self.dense = dense

    def forward(self, dense_features: Tensor, pooled: Tensor) -> Tensor:
        return self.dense(dense_features, pooled)


class DenseOnlyBuilt(Built):
    """Batches hold (dense_features, pooled) already, so `dense_inputs` is the batch's inputs."""

    def dense_inputs(self, batch: Batch) -> tuple[Tensor, Tensor]:
        dense_features, pooled = batch.inputs
        return dense_features, pooled.detach()


def make_batches(
    cfg: Mapping[str, Any], lay: sparse.SparseLayout, seed: int, device: torch.device
) -> list[Batch]:
    """`num_batches` seeded batches: dense features, pooled embeddings (sum of ~pooling_mean
    N(0, 1/dim)-ish rows, so the scale matches an EBC's), and labels from a random teacher."""
    gen = torch.Generator().manual_seed(seed * 1_000_003 + 29)
    b, t, n_dense = int(cfg["batch_size"]), int(cfg["num_tasks"]), int(cfg["num_dense_features"])
    pooled_scale = math.sqrt(max(float(cfg["pooling_mean"]), 1.0) / max(lay.embedding_dim, 1))
    teacher = torch.randn(n_dense, t, generator=gen) / math.sqrt(n_dense)
    bias = torch.linspace(-2.0, 0.0, t)
    batches = []
    for _ in range(int(cfg["num_batches"])):
        dense = torch.randn(b, n_dense, generator=gen)
        pooled = torch.randn(b, lay.pooled_dim, generator=gen) * pooled_scale
        labels = torch.bernoulli(torch.sigmoid(dense @ teacher + bias), generator=gen)
        batches.append(Batch(inputs=(dense.to(device), pooled.to(device)), labels=labels.to(device)))
    return batches


def build(
    family_name: str,
    scale: str = "tiny",
    device: str | torch.device = "cpu",
    seed: int = 0,
    *,
    overrides: Mapping[str, Any] | None = None,
    count_nodes: bool = True,
) -> Built:
    """Like `models.build` (same arguments, checks and meta keys), minus the sparse arch."""
    cfg, dev, lay = builder.resolve(family_name, scale, device, seed, overrides)
    dense_info = analysis.analyse(family_name, cfg, lay)
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        with dev:
            dense = family(family_name).build_dense(cfg, lay)
    module = DenseOnlyModel(dense)
    batches = make_batches(cfg, lay, seed, dev)
    built = DenseOnlyBuilt(module=module, batches=batches)  # type: ignore[arg-type]
    nodes = capture.count_dense_nodes(dense, built.dense_inputs(batches[0])) if count_nodes else None
    tables_bytes = analysis.STATE_COPIES * lay.embedding_bytes  # no tables here
    built.meta = {
        **builder.describe(family_name, scale, seed, cfg, lay, dense_info, nodes),
        "provider": "dense_only",
        "params": dense_info.dense_params,
        "embedding_bytes": 0,
        "est_train_bytes": analysis.estimate_bytes(cfg, lay, dense_info) - tables_bytes,
    }
    return built
