"""Each rank's share of a batch: the global batch split by sample, in rank order.

Why split one global batch instead of building per-rank data: the single-process reference
then runs exactly the same samples (the global batch), so rank r's outputs must equal rows
[r*B/N, (r+1)*B/N) of the reference's, and the updated parameters must equal the reference's
after the same steps (DDP averages dense gradients, torchrec's all-to-all scales the table
gradients the same way).
"""

from __future__ import annotations

from typing import Any


def local_batch(batch: Any, rank: int, world: int) -> Any:
    """Rank ``rank``'s contiguous slice of ``batch`` (a models.Batch with a KJT input)."""
    import torch
    from torchrec import KeyedJaggedTensor

    from models.types import Batch

    dense, kjt = batch.inputs
    total = int(dense.shape[0])
    if total % world:
        raise ValueError(f"batch size {total} is not divisible by {world} ranks")
    n = total // world
    lo, hi = rank * n, (rank + 1) * n
    keys = kjt.keys()
    lengths = kjt.lengths().view(len(keys), total)
    starts = torch.cat([torch.zeros(1, dtype=lengths.dtype), lengths.reshape(-1).cumsum(0)])
    values, weights = kjt.values(), kjt.weights_or_none()
    vals, wts, lens = [], [], []
    for k in range(len(keys)):
        a, z = int(starts[k * total + lo]), int(starts[k * total + hi])
        vals.append(values[a:z])
        if weights is not None:
            wts.append(weights[a:z])
        lens.append(lengths[k, lo:hi])
    local = KeyedJaggedTensor(
        keys=keys,
        values=torch.cat(vals),
        lengths=torch.cat(lens),
        weights=torch.cat(wts) if weights is not None else None,
    )
    return Batch(inputs=(dense[lo:hi], local), labels=batch.labels[lo:hi])
