"""torchrec's own DLRM and DLRM_DCN (torchrec.models.dlrm) as a harness provider.

    optimus-bench run --provider harness.providers.torchrec_dlrm:build --models dlrm_dcn --scale tiny

Why: the harness must measure models it did not write, through the same contract as
`models.build` (harness/provider.py). torchrec's classes are used as they are: the provider only
names the split the harness needs, the same one as this repository's families (`RecModel`).
`module.sparse` is the model's EmbeddingBagCollection (run eagerly, sharded by `--nproc`),
`module.dense` takes its pooled values [B, F*D], reshapes them to [B, F, D] as torchrec's
`SparseArch` does, and runs torchrec's own `dense_arch -> inter_arch -> over_arch` exactly as
`DLRM.forward` does; the modes prepare `module.dense`.

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
from models.types import Built, RecModel

FAMILIES: tuple[str, ...] = ("dlrm_dcn", "dlrm")
SCALES: tuple[str, ...] = tuple(s for s in presets.SCALES if s not in presets.HETERO_SCALES)
DCN_LAYERS = 3
DCN_RANK = 8


class DLRMDenseHalf(nn.Module):
    """torchrec's DLRM forward after the EBC: (dense_features, pooled [B, F*D]) -> logits."""

    def __init__(self, dlrm: DLRM) -> None:
        super().__init__()
        self.num_features = dlrm.sparse_arch.F
        self.embedding_dim = dlrm.sparse_arch.D
        self.dense_arch = dlrm.dense_arch
        self.inter_arch = dlrm.inter_arch
        self.over_arch = dlrm.over_arch

    def forward(self, dense_features: Tensor, pooled: Tensor) -> Tensor:
        sparse_features = pooled.reshape(-1, self.num_features, self.embedding_dim)  # SparseArch's last step
        embedded_dense = self.dense_arch(dense_features)
        concatenated = self.inter_arch(dense_features=embedded_dense, sparse_features=sparse_features)
        return self.over_arch(concatenated)


class SplitDLRM(RecModel):
    """`module(dense_features, kjt)`: torchrec's EBC, then the dense half, on the pooled values.

    The EBC's pooled values are in its config order, which is `SparseArch`'s feature order, so this
    computes what `DLRM.forward` computes; and being a `RecModel`, it runs wherever this
    repository's families run, the sharded cells included (they shard `module.sparse`)."""

    def __init__(self, dlrm: DLRM) -> None:
        super().__init__(dlrm.sparse_arch.embedding_bag_collection, DLRMDenseHalf(dlrm))


def assemble(
    ebc: nn.Module,
    *,
    dense_in_features: int,
    bottom_mlp: list[int],
    top_mlp: list[int],
    device: torch.device,
    dcn: tuple[int, int] | None,
) -> SplitDLRM:
    """torchrec's `DLRM_DCN` (`dcn` = (cross layers, low rank)) or `DLRM` (`dcn` None) over
    `ebc`, split for the harness. `bottom_mlp` ends at the embedding dim (torchrec's rule)."""
    sizes: dict[str, Any] = dict(
        embedding_bag_collection=ebc,
        dense_in_features=dense_in_features,
        dense_arch_layer_sizes=bottom_mlp,
        over_arch_layer_sizes=top_mlp,
        dense_device=device,
    )
    if dcn is not None:
        model: DLRM = DLRM_DCN(**sizes, dcn_num_layers=dcn[0], dcn_low_rank_dim=dcn[1])
    else:
        model = DLRM(**sizes)
    return SplitDLRM(model.to(device))  # torchrec builds its interaction/cross layers on the default device


def build(family_name: str, scale: str = "tiny", device: str | torch.device = "cpu", seed: int = 0) -> Built:
    """torchrec's `DLRM_DCN` (or `DLRM`) at the `dlrm` preset's sizes, with seeded batches."""
    if family_name not in FAMILIES:
        raise ValueError(f"unknown family {family_name!r}; allowed families: {list(FAMILIES)}")
    if scale not in SCALES:
        raise ValueError(f"unknown scale {scale!r}; allowed scales: {list(SCALES)}")
    cfg = presets.resolve("dlrm", scale)
    lay = sparse.layout(cfg)
    dev = torch.device(device)
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        module = assemble(
            sparse.build_ebc(lay, dev),
            dense_in_features=int(cfg["num_dense_features"]),
            bottom_mlp=[*cfg["bottom_mlp"], lay.embedding_dim],
            top_mlp=[*cfg["top_mlp"], int(cfg["num_tasks"])],
            device=dev,
            dcn=(DCN_LAYERS, DCN_RANK) if family_name == "dlrm_dcn" else None,
        )
    built = Built(module=module, batches=data.make_batches(cfg, lay, seed, dev))
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
