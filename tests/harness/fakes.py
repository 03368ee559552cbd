"""Stand-in model provider for the harness tests (``tests.harness.fakes:build``).

Why: the harness must be testable on its own merits, without the models package and
without torchrec's import cost, and it must be fed models that crash, hang or compile to
different results on purpose. The interface is the one of ``models.build``.
"""

from __future__ import annotations

import os
import time
from dataclasses import dataclass, field
from typing import Any

import torch
from torch import nn

FAMILIES = ("mlp", "towers", "crash", "hang", "error", "wrong")
SCALES = ("tiny", "small")
LOG_ENV = "FAKES_BUILD_LOG"  # if set, every build appends "family parent-pid" to this file


class Dense(nn.Module):
    """A stand-in dense arch, ``dense(dense_features, pooled)`` like ``models.build``'s: bottom
    Linear, per-feature ReLU towers, top Linear, and a switch that makes it compute something
    else under torch.compile. Kept local, not the shared models/synthetic_towers.py: the harness
    tests need that contract and that switch, and run without the models package."""

    def __init__(self, num_features: int, dim: int, towers: int, tasks: int, wrong: bool) -> None:
        super().__init__()
        self.towers = nn.ModuleList(
            nn.Sequential(nn.Linear(dim, 16), nn.ReLU(), nn.Linear(16, 8)) for _ in range(towers)
        )
        self.bottom = nn.Linear(num_features, 8)
        self.top = nn.Linear(8 * (towers + 1), tasks)
        self.dim = dim
        self.wrong = wrong

    def forward(self, dense_features: torch.Tensor, pooled: torch.Tensor) -> torch.Tensor:
        parts = pooled.split(self.dim, dim=1)
        h = torch.cat(
            [self.bottom(dense_features), *(t(p) for t, p in zip(self.towers, parts, strict=False))], dim=1
        )
        out = self.top(h)
        if self.wrong and torch.compiler.is_compiling():
            out = out + 1.0  # deliberately different under torch.compile
        return out


class Sparse(nn.Module):
    def __init__(self, tables: int, dim: int, rows: int) -> None:
        super().__init__()
        self.bags = nn.ModuleList(nn.EmbeddingBag(rows, dim, mode="sum") for _ in range(tables))

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        return torch.cat([bag(ids[:, i, :]) for i, bag in enumerate(self.bags)], dim=1)


class Model(nn.Module):
    def __init__(self, dense: Dense, sparse: Sparse) -> None:
        super().__init__()
        self.dense = dense
        self.sparse = sparse

    def forward(self, dense_features: torch.Tensor, ids: torch.Tensor) -> torch.Tensor:
        return self.dense(dense_features, self.sparse(ids))


@dataclass
class Batch:
    inputs: tuple[torch.Tensor, torch.Tensor]
    labels: torch.Tensor


@dataclass
class Built:
    module: Model
    batches: list[Batch]
    meta: dict[str, Any] = field(default_factory=dict)

    def loss(self, logits: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
        return nn.functional.binary_cross_entropy_with_logits(logits, labels)

    def dense_inputs(self, batch: Batch) -> tuple[torch.Tensor, torch.Tensor]:
        dense_features, ids = batch.inputs
        return dense_features, self.module.sparse(ids)


def build(family: str, scale: str = "tiny", device: str = "cpu", seed: int = 0) -> Built:
    if family not in FAMILIES:
        raise ValueError(f"family: unknown {family!r}; allowed values: {', '.join(FAMILIES)}")
    if os.environ.get(LOG_ENV):
        with open(os.environ[LOG_ENV], "a") as f:
            f.write(f"{family} {os.getppid()}\n")
    if family == "crash":
        os.abort()  # dies by SIGABRT, like a segfault in a kernel
    if family == "hang":
        time.sleep(3600)
    if family == "error":
        raise RuntimeError("deliberate error while building the model")
    torch.manual_seed(seed)
    towers = 4 if family == "towers" else 2
    batch, nf, dim, tasks, rows, bag = (32, 5, 8, 2, 50, 3) if scale == "tiny" else (256, 13, 16, 2, 1000, 5)
    model = Model(Dense(nf, dim, towers, tasks, wrong=family == "wrong"), Sparse(towers, dim, rows)).to(
        device
    )
    g = torch.Generator().manual_seed(seed + 1)
    batches = [
        Batch(
            (
                torch.randn(batch, nf, generator=g).to(device),
                torch.randint(0, rows, (batch, towers, bag), generator=g).to(device),
            ),
            torch.randint(0, 2, (batch, tasks), generator=g).float().to(device),
        )
        for _ in range(3)
    ]
    meta = {
        "family": family,
        "scale": scale,
        "seed": seed,
        "batch_size": batch,
        "params": sum(p.numel() for p in model.parameters()),
    }
    return Built(model, batches, meta)
