"""MLPerf Training's DLRMv2 (DLRM with DCNv2 cross layers) as a harness provider: the reference
recommendation model, beside this repository's synthetic families.

    optimus-bench run --provider harness.providers.mlperf_dlrmv2:build --models mlperf_dlrmv2 --scale cpu

Why: every recommendation-systems engineer knows this model's figures, so a result on it reads
without explaining the model. Source: the MLPerf reference implementation,
mlcommons/training `recommendation_v2/torchrec_dlrm` (README.MD, "Running the MLPerf DLRM v2
benchmark": `dlrm_main.py --embedding_dim 128 --dense_arch_layer_sizes 512,256,128
--over_arch_layer_sizes 1024,1024,512,256,1 --interaction_type=dcn --dcn_num_layers=3
--dcn_low_rank_dim=512 --num_embeddings_per_feature ... --multi_hot_sizes ...`), which builds
torchrec's `DLRM_DCN`, as this provider does (through `torchrec_dlrm.assemble`, the same split
and dense half as `harness.providers.torchrec_dlrm`).

Tables: the 26 Criteo 1TB categorical features, one table each, dim 128, with MLPerf's row counts
(`TABLE_ROWS`, 204M rows, 97.4 GiB of fp32 in all). The scales differ only in the row cap:

* `cpu`: every table clipped to `ROW_CAPS["cpu"]` rows (the reference DLRM's `--max-ind-range`
  does the same: rows = min(rows, cap), ids taken below the cap). 18 of the 26 tables keep their
  real size; the five 40M-row tables and the 3.1M, 590K and 405K ones are clipped, 0.44 GiB in
  all, so a cell, its eager reference copy and a 2-rank sharded cell fit a 24 GiB machine with
  room to spare. Row counts barely move the step time
  (its dense arch, 16M parameters, is the same at every cap); what a step costs on a 2-core
  machine: results/mlperf-dlrmv2/README.md.
* `full`: the real row counts (a machine with about 100 GiB per model copy, and more for a
  cell's reference copy: build refuses with one line on a machine with less memory).

The cap is in every cell's meta (`row_cap`, 0: none), with the table bytes.

Data: torchrec's own random recommendation dataset, `RandomRecDataset` (torchrec.datasets.random),
with `ids_per_features` = `min_ids_per_features` = MLPerf's multi-hot sizes: every sample has exactly that many ids per feature, uniform over the
table's rows, as MLPerf's synthetic multi-hot dataset (`--multi_hot_distribution_type uniform`)
has. This repository's generator (models/data.py) is not used: its pooling is Poisson around
a per-feature mean with Zipf ids, so it cannot give the fixed pooling MLPerf specifies. 13 dense
features (Criteo's integer features), one click label.
"""

from __future__ import annotations

import os

import torch
from torchrec import EmbeddingBagCollection, EmbeddingBagConfig, PoolingType
from torchrec.datasets.criteo import DEFAULT_CAT_NAMES, DEFAULT_INT_NAMES
from torchrec.datasets.random import RandomRecDataset

from harness.providers.torchrec_dlrm import assemble
from models.types import Batch, Built

FAMILIES: tuple[str, ...] = ("mlperf_dlrmv2",)
SCALES: tuple[str, ...] = ("cpu", "full")

# MLPerf DLRMv2, recommendation_v2/torchrec_dlrm (see the module docstring).
TABLE_ROWS: tuple[int, ...] = (
    40000000, 39060, 17295, 7424, 20265, 3, 7122, 1543, 63, 40000000, 3067956, 405282, 10,
    2209, 11938, 155, 4, 976, 14, 40000000, 40000000, 40000000, 590152, 12973, 108, 36,
)  # fmt: skip
MULTI_HOT_SIZES: tuple[int, ...] = (
    3, 2, 1, 2, 6, 1, 1, 1, 1, 7, 3, 8, 1, 6, 9, 5, 1, 1, 1, 12, 100, 27, 10, 3, 1, 1,
)  # fmt: skip
EMBEDDING_DIM = 128
DENSE_FEATURES = len(DEFAULT_INT_NAMES)  # 13
BOTTOM_MLP: tuple[int, ...] = (512, 256, 128)  # ends at the embedding dim
TOP_MLP: tuple[int, ...] = (1024, 1024, 512, 256, 1)
DCN_LAYERS = 3
DCN_RANK = 512

ROW_CAPS: dict[str, int | None] = {"cpu": 100_000, "full": None}
# `cpu`: the batch the "well under a second" step is stated at. `full`: MLPerf's per-GPU
# batch (global 65,536 over 8 GPUs in the reference's README).
BATCH_SIZES: dict[str, int] = {"cpu": 256, "full": 8192}
NUM_BATCHES = 4
BYTES_PER_ROW = EMBEDDING_DIM * 4  # fp32


def table_rows(row_cap: int | None) -> list[int]:
    """MLPerf's row counts, each clipped to `row_cap` (None: as they are)."""
    return [r if row_cap is None else min(r, row_cap) for r in TABLE_ROWS]


def check_memory(table_bytes: int, scale: str) -> None:
    """Refuse, in one line, tables that alone exceed this machine's memory (rather than an
    allocation failure, or the kernel's OOM killer, minutes into building them)."""
    try:
        total = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    except (ValueError, OSError):  # not reported here: let the build try
        return
    if table_bytes > total:
        raise MemoryError(
            f"mlperf_dlrmv2 scale {scale!r}: the tables need {table_bytes / 2**30:.1f} GiB and this machine has "
            f"{total / 2**30:.1f} GiB; use --scale cpu (rows capped at {ROW_CAPS['cpu']:,})"
        )


def make_batches(rows: list[int], batch_size: int, seed: int, device: torch.device) -> list[Batch]:
    """`NUM_BATCHES` batches of torchrec's `RandomRecDataset` with MLPerf's fixed multi-hot pooling,
    as the harness's `Batch` (labels float [B, 1], as the one-logit BCE loss wants them)."""
    dataset = RandomRecDataset(
        keys=list(DEFAULT_CAT_NAMES),
        batch_size=batch_size,
        hash_sizes=rows,
        ids_per_features=list(MULTI_HOT_SIZES),
        min_ids_per_features=list(MULTI_HOT_SIZES),
        num_dense=DENSE_FEATURES,
        manual_seed=seed,
        num_generated_batches=NUM_BATCHES,
        num_batches=NUM_BATCHES,
    )
    return [
        Batch(
            inputs=(b.dense_features.to(device), b.sparse_features.to(device)),
            labels=b.labels.float().unsqueeze(1).to(device),
        )
        for b in dataset
    ]


def build(
    family_name: str,
    scale: str = "cpu",
    device: str | torch.device = "cpu",
    seed: int = 0,
    *,
    row_cap: int | None = None,
    batch_size: int | None = None,
) -> Built:
    """MLPerf DLRMv2 at `scale` (`row_cap`, `batch_size`: override the scale's, for tests that
    keep the architecture on smaller tables), with seeded weights and batches."""
    if family_name not in FAMILIES:
        raise ValueError(f"unknown family {family_name!r}; allowed families: {list(FAMILIES)}")
    if scale not in SCALES:
        raise ValueError(f"unknown scale {scale!r}; allowed scales: {list(SCALES)}")
    cap = ROW_CAPS[scale] if row_cap is None else row_cap
    batch = BATCH_SIZES[scale] if batch_size is None else batch_size
    rows = table_rows(cap)
    check_memory(sum(rows) * BYTES_PER_ROW, scale)
    dev = torch.device(device)
    tables = [
        EmbeddingBagConfig(
            name=f"t_{feature}",
            embedding_dim=EMBEDDING_DIM,
            num_embeddings=n,
            feature_names=[feature],
            pooling=PoolingType.SUM,
        )
        for feature, n in zip(DEFAULT_CAT_NAMES, rows, strict=True)
    ]
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        module = assemble(
            EmbeddingBagCollection(tables=tables, device=dev),
            dense_in_features=DENSE_FEATURES,
            bottom_mlp=list(BOTTOM_MLP),
            top_mlp=list(TOP_MLP),
            device=dev,
            dcn=(DCN_LAYERS, DCN_RANK),
        )
    built = Built(module=module, batches=make_batches(rows, batch, seed, dev))
    built.meta = {
        "family": family_name,
        "scale": scale,
        "seed": seed,
        "provider": "torchrec.models.dlrm.DLRM_DCN (MLPerf DLRMv2)",
        "data": "torchrec.datasets.random.RandomRecDataset (MLPerf multi-hot sizes)",
        "row_cap": cap or 0,
        "table_rows": sum(rows),
        "table_bytes": sum(rows) * BYTES_PER_ROW,
        "batch_size": batch,
        "num_tasks": 1,
        "num_features": len(rows),
        "embedding_dim": EMBEDDING_DIM,
        "ids_per_sample": sum(MULTI_HOT_SIZES),
        "params": sum(p.numel() for p in module.parameters()),
        "dense_params": sum(p.numel() for p in module.dense.parameters()),
    }
    return built
