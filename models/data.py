"""Synthetic batches: KJTs with Zipf ids and per-feature pooling, dense features, task labels.

The labels are a learnable click-through task: a fixed hidden teacher, drawn from the seed, scores
each sample from its dense features and from the ids of every sparse feature (each (feature, id)
has a hidden weight per task, averaged over the sample's ids), and a label is a Bernoulli draw of
the sigmoid of that score. So a model that trains really learns (its held-out AUC rises well above
0.5 within a few hundred steps at `tiny`), which `optimus-bench run --quality` relies on to tell a
mode that trains like eager from one that drifts.

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
        score = dense @ teacher + sparse_teacher_score(values, lengths, n_feat, t, seed)
        probs = torch.sigmoid(score + bias)
        labels = torch.bernoulli(probs, generator=gen)
        batches.append(Batch(inputs=(dense.to(device), kjt.to(device)), labels=labels.to(device)))
    return batches


# The hidden weight of (feature, id, task) is a hash of the four, not a stored table: a table of
# rows x features x tasks floats would take hundreds of MiB at `xl` for nothing but labels.
_HASH_MUL = 0x9E3779B1  # Knuth's multiplicative hash constant (2^32 / golden ratio)
_MASK31 = (1 << 31) - 1


def _mix(x: Tensor) -> Tensor:
    """A 31-bit integer hash (xorshift-multiply rounds); int64 throughout, no overflow."""
    for _ in range(3):
        x = ((x ^ (x >> 15)) * _HASH_MUL) & _MASK31
    return x


def sparse_teacher_score(
    values: Tensor, lengths: Tensor, num_features: int, num_tasks: int, seed: int
) -> Tensor:
    """[B, T] the sparse half of the teacher's score: per feature, the mean hidden weight of the
    sample's ids (0 for a sample with none), summed over features and scaled by
    1/sqrt(features) so the score's spread does not grow with the feature count. A hidden weight is
    uniform on [-sqrt(3) * 1.5, sqrt(3) * 1.5] (standard deviation 1.5, fixed per seed)."""
    b = lengths.numel() // num_features
    segment = torch.repeat_interleave(torch.arange(lengths.numel()), lengths)  # (feature, sample) of each id
    feature = segment // b
    tasks = torch.arange(num_tasks)
    key = ((seed & 0xFFFF) * 7919 + feature * 104729 + values.long()) & _MASK31
    u = _mix(_mix(key)[:, None] * 31 + tasks[None, :] + 1).double() / _MASK31  # [ids, T] in [0, 1]
    weights = (u * 2.0 - 1.0) * (math.sqrt(3.0) * 1.5)
    sums = torch.zeros(lengths.numel(), num_tasks, dtype=torch.float64).index_add_(0, segment, weights)
    means = sums / lengths.clamp(min=1).double()[:, None]
    return (means.view(num_features, b, num_tasks).sum(0) / math.sqrt(num_features)).float()


def _zipf_ids(per_feature: Tensor, cdf: Tensor, perms: list[Tensor], gen: torch.Generator) -> Tensor:
    """Ids feature-major (KJT order): rank ~ Zipf via inverse CDF, then the feature's permutation."""
    total = int(per_feature.sum())
    u = torch.rand(total, generator=gen, dtype=torch.float64)
    ranks = torch.searchsorted(cdf, u).clamp_(max=cdf.numel() - 1)
    chunks = torch.split(ranks, per_feature.tolist())
    return torch.cat([perm[chunk] for perm, chunk in zip(perms, chunks, strict=True)]).long()
