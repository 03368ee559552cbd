"""Synthetic batches: KJTs with Zipf ids and per-feature pooling, dense features, task labels.

Why this shape of data: industrial traffic has a few hot ids per table (power law), features with
very different numbers of ids per sample (pooling factors), and lengths that change from batch to
batch. The EBC sees all of that; the dense arch only sees fixed [B, sum dims] pooled tensors, so
varying lengths never recompile it. All batches are generated up front, from one seeded
generator, so data generation never shows up in timings and a seed always gives the same data.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any

import torch
from torch import Tensor

from models.sparse import SparseLayout
from models.torchrec_deps import torchrec
from models.types import Batch


def zipf_cdf(rows: int, alpha: float) -> Tensor:
    """CDF over ranks 0..rows-1 with P(rank k) proportional to 1/(k+1)^alpha (alpha=0: uniform)."""
    weights = torch.arange(1, rows + 1, dtype=torch.float64).pow(-alpha)
    cdf = torch.cumsum(weights, 0)
    return cdf / cdf[-1]


def feature_pooling_means(cfg: Mapping[str, Any], num_features: int, gen: torch.Generator) -> Tensor:
    """Per-feature mean ids per sample: pooling_mean * lognormal(0, pooling_spread), capped."""
    sigma = float(cfg["pooling_spread"])
    # E[lognormal(-sigma^2/2, sigma)] == 1, so the mean over features stays pooling_mean.
    noise = torch.randn(num_features, generator=gen, dtype=torch.float64) * sigma - sigma * sigma / 2
    means = float(cfg["pooling_mean"]) * torch.exp(noise)
    return means.clamp(max=float(cfg["max_pooling"]))


def make_batches(cfg: Mapping[str, Any], lay: SparseLayout, seed: int, device: torch.device) -> list[Batch]:
    """`num_batches` batches on `device`, deterministic in (cfg, seed)."""
    kjt_type = torchrec().KeyedJaggedTensor
    gen = torch.Generator().manual_seed(seed * 1_000_003 + 17)
    n_feat, rows = lay.num_features, lay.rows_per_table
    cdf = zipf_cdf(rows, float(cfg["zipf_alpha"]))
    # Each feature has its own hot ids: a fixed permutation of ranks per feature.
    perms = [torch.randperm(rows, generator=gen) for _ in range(n_feat)]
    means = feature_pooling_means(cfg, n_feat, gen)
    b, t, n_dense = int(cfg["batch_size"]), int(cfg["num_tasks"]), int(cfg["num_dense_features"])
    cap = int(cfg["max_pooling"])
    # A fixed random "teacher" makes labels depend on the dense features, so training learns.
    teacher = torch.randn(n_dense, t, generator=gen) / math.sqrt(n_dense)
    bias = torch.linspace(-2.0, 0.0, t)  # click-through-like base rates from ~12% to 50%
    batches = []
    for _ in range(int(cfg["num_batches"])):
        lengths = torch.poisson(means.repeat_interleave(b).float(), generator=gen).clamp_(max=cap).long()
        values = _zipf_ids(lengths.view(n_feat, b).sum(1), cdf, perms, gen)
        kjt = kjt_type.from_lengths_sync(keys=list(lay.feature_names), values=values, lengths=lengths.int())
        dense = torch.randn(b, n_dense, generator=gen)
        probs = torch.sigmoid(dense @ teacher + bias)
        labels = torch.bernoulli(probs, generator=gen)
        batches.append(Batch(inputs=(dense.to(device), kjt.to(device)), labels=labels.to(device)))
    return batches


def _zipf_ids(per_feature: Tensor, cdf: Tensor, perms: list[Tensor], gen: torch.Generator) -> Tensor:
    """Ids feature-major (KJT order): rank ~ Zipf via inverse CDF, then the feature's permutation."""
    total = int(per_feature.sum())
    u = torch.rand(total, generator=gen, dtype=torch.float64)
    ranks = torch.searchsorted(cdf, u).clamp_(max=cdf.numel() - 1)
    chunks = torch.split(ranks, per_feature.tolist())
    return torch.cat([perm[chunk] for perm, chunk in zip(perms, chunks, strict=True)]).long()
