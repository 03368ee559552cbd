"""What `models.build` returns: the model, its pre-generated batches and its metadata.

Why dataclasses: the harness, asv and tests all read the same few fields; keeping them typed and
in one place is the contract (docs/architecture.md, "Models").
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import torch
import torch.nn.functional as F
from torch import Tensor, nn

if TYPE_CHECKING:  # torchrec is imported only where the sparse arch is built (models/torchrec_deps.py)
    from torchrec import KeyedJaggedTensor


@dataclass
class Batch:
    """One batch: `inputs == (dense_features [B, F], kjt)`, `labels` float {0, 1} of shape [B, T]."""

    inputs: tuple[Tensor, KeyedJaggedTensor]  # dense-only builds: (dense, pooled)
    labels: Tensor


class RecModel(nn.Module):
    """sparse (torchrec EBC, runs eagerly) -> pooled [B, sum dims] -> dense (plain torch, compiled)."""

    def __init__(self, sparse: nn.Module, dense: nn.Module) -> None:
        super().__init__()
        self.sparse = sparse
        self.dense = dense

    def forward(self, dense_features: Tensor, kjt: KeyedJaggedTensor) -> Tensor:
        return self.dense(dense_features, self.sparse(kjt).values())


@dataclass
class Built:
    """A built model: `module`, `batches` and `meta` (see models/__init__.py for the keys)."""

    module: RecModel
    batches: list[Batch]
    meta: dict[str, Any] = field(default_factory=dict)

    @staticmethod
    def loss(logits: Tensor, labels: Tensor) -> Tensor:
        """BCE-with-logits averaged over tasks (and samples): the multi-task training loss."""
        return F.binary_cross_entropy_with_logits(logits, labels)

    def dense_inputs(self, batch: Batch) -> tuple[Tensor, Tensor]:
        """The inputs of `module.dense` for `batch`: (dense_features, pooled), pooled detached.

        The EBC runs here once, eagerly and without autograd, so timing the dense arch alone
        does not time the sparse lookups; call `requires_grad_()` on pooled if a test needs it.
        """
        dense_features, kjt = batch.inputs
        with torch.no_grad():
            pooled = self.module.sparse(kjt).values()
        return dense_features, pooled.detach()
