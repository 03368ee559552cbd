"""torchrec's own DLRM and DLRM_DCN (torchrec.models.dlrm) as a harness provider.

    optimus-bench run --provider harness.providers.torchrec_dlrm:build --models dlrm_dcn --scale tiny

Why: the harness must measure models it did not write, through the same contract as
`models.build` (harness/provider.py). torchrec's classes are used as they are: the provider only
names the split the harness needs. `module.sparse` is torchrec's `SparseArch` (the EBC, run
eagerly), `module.dense` runs torchrec's own `dense_arch -> inter_arch -> over_arch` exactly as
`DLRM.forward` does, on the [B, F, D] sparse embeddings; the modes prepare `module.dense`.

Sizes come from this repository's `dlrm` presets (sparse/dense feature counts, table rows,
embedding dim, bottom/top MLP widths, batch, tasks) and so do the batches (models/data.py: Zipf
ids, per-feature pooling); the DCN variant adds `DCN_LAYERS` low-rank cross layers of rank
`DCN_RANK`. Only uniform-width scales: torchrec's DLRM wants one embedding dim for every table.
"""

from __future__ import annotations

from typing import Any

import torch
from torch import Tensor, nn
from torchrec.models.dlrm import DLRM, DLRM_DCN

from models import data, presets, sparse
from models.types import Batch, Built

FAMILIES: tuple[str, ...] = ("dlrm_dcn", "dlrm")
SCALES: tuple[str, ...] = tuple(s for s in presets.SCALES if s not in presets.HETERO_SCALES)
DCN_LAYERS = 3
DCN_RANK = 8


class DLRMDenseHalf(nn.Module):
    """torchrec's DLRM forward after the sparse arch: (dense_features, sparse [B, F, D]) -> logits."""

    def __init__(self, dlrm: DLRM) -> None:
        super().__init__()
        self.dense_arch = dlrm.dense_arch
        self.inter_arch = dlrm.inter_arch
        self.over_arch = dlrm.over_arch

    def forward(self, dense_features: Tensor, sparse_features: Tensor) -> Tensor:
        embedded_dense = self.dense_arch(dense_features)
        concatenated = self.inter_arch(dense_features=embedded_dense, sparse_features=sparse_features)
        return self.over_arch(concatenated)


class SplitDLRM(nn.Module):
    """`module(dense_features, kjt)`: torchrec's sparse arch, then the dense half."""

    def __init__(self, dlrm: DLRM) -> None:
        super().__init__()
        self.sparse = dlrm.sparse_arch
        self.dense = DLRMDenseHalf(dlrm)

    def forward(self, dense_features: Tensor, kjt: Any) -> Tensor:
        return self.dense(dense_features, self.sparse(kjt))


class TorchrecBuilt(Built):
    def dense_inputs(self, batch: Batch) -> tuple[Tensor, Tensor]:
        dense_features, kjt = batch.inputs
        with torch.no_grad():
            embedded = self.module.sparse(kjt)
        return dense_features, embedded.detach()


def build(family_name: str, scale: str = "tiny", device: str | torch.device = "cpu", seed: int = 0) -> Built:
    """torchrec's `DLRM_DCN` (or `DLRM`) at the `dlrm` preset's sizes, with seeded batches."""
    if family_name not in FAMILIES:
        raise ValueError(f"unknown family {family_name!r}; allowed families: {list(FAMILIES)}")
    if scale not in SCALES:
        raise ValueError(f"unknown scale {scale!r}; allowed scales: {list(SCALES)}")
    cfg = presets.resolve("dlrm", scale)
    lay = sparse.layout(cfg)
    dev = torch.device(device)
    d = lay.embedding_dim
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        ebc = sparse.build_ebc(lay, dev)
        sizes: dict[str, Any] = dict(
            embedding_bag_collection=ebc,
            dense_in_features=int(cfg["num_dense_features"]),
            dense_arch_layer_sizes=[*cfg["bottom_mlp"], d],
            over_arch_layer_sizes=[*cfg["top_mlp"], int(cfg["num_tasks"])],
            dense_device=dev,
        )
        if family_name == "dlrm_dcn":
            model: DLRM = DLRM_DCN(**sizes, dcn_num_layers=DCN_LAYERS, dcn_low_rank_dim=DCN_RANK)
        else:
            model = DLRM(**sizes)
        model = model.to(dev)  # torchrec builds its interaction/cross layers on the default device
    built = TorchrecBuilt(module=SplitDLRM(model), batches=data.make_batches(cfg, lay, seed, dev))  # type: ignore[arg-type]
    built.meta = {
        "family": family_name,
        "scale": scale,
        "seed": seed,
        "provider": "torchrec.models.dlrm",
        "batch_size": cfg["batch_size"],
        "num_tasks": cfg["num_tasks"],
        "num_features": lay.num_features,
        "params": sum(p.numel() for p in built.module.parameters()),
        "dense_params": sum(p.numel() for p in built.module.dense.parameters()),
    }
    return built
