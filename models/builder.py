"""`models.build`: check the config, then allocate the model, generate batches, fill metadata.

Why this order: everything that can reject a config (field checks, the meta-device memory
estimate) runs before a single real tensor is allocated. Initialisation runs under a forked,
seeded RNG, so a seed gives the same weights and data and the caller's RNG state is untouched.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import torch

from models import analysis, capture, data, presets, sparse
from models.registry import family
from models.types import Built, RecModel


def build(
    family_name: str,
    scale: str = "tiny",
    device: str | torch.device = "cpu",
    seed: int = 0,
    *,
    overrides: Mapping[str, Any] | None = None,
    count_nodes: bool = True,
) -> Built:
    """Build `family_name` at `scale`; `overrides` replaces preset fields (checked like presets).
    `count_nodes=False` skips the Dynamo capture that fills `meta["dense_nodes"]` (set to None),
    which takes seconds for large/xl graphs.
    """
    cfg, dev, lay = resolve(family_name, scale, device, seed, overrides)
    analysis.check_fits(family_name, cfg, lay, None)  # tables alone: before building even on meta
    dense_info = analysis.analyse(family_name, cfg, lay)
    analysis.check_fits(family_name, cfg, lay, dense_info)
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        ebc = sparse.build_ebc(lay, dev)
        with dev:
            dense = family(family_name).build_dense(cfg, lay)
    module = RecModel(ebc, dense)
    batches = data.make_batches(cfg, lay, seed, dev)
    built = Built(module=module, batches=batches)
    nodes = capture.count_dense_nodes(dense, built.dense_inputs(batches[0])) if count_nodes else None
    built.meta = {
        **describe(family_name, scale, seed, cfg, lay, dense_info, nodes),
        "params": sum(p.numel() for p in module.parameters()),
        "embedding_bytes": lay.embedding_bytes,
        "est_train_bytes": analysis.estimate_bytes(cfg, lay, dense_info),
    }
    return built


def resolve(
    family_name: str, scale: str, device: str | torch.device, seed: int, overrides: Mapping[str, Any] | None
) -> tuple[dict[str, Any], torch.device, sparse.SparseLayout]:
    """The checked config, the device and the sparse layout: what every builder of a family's
    model starts from (``models.build``, and ``models.dense_only.build`` without the tables)."""
    if isinstance(seed, bool) or not isinstance(seed, int) or seed < 0:
        raise ValueError(f"seed={seed!r} is not allowed; allowed: an int >= 0")
    cfg = presets.resolve(family_name, scale, overrides)
    return cfg, torch.device(device), sparse.layout(cfg)


def describe(
    family_name: str,
    scale: str,
    seed: int,
    cfg: dict[str, Any],
    lay: sparse.SparseLayout,
    dense_info: analysis.DenseAnalysis,
    nodes: int | None,
) -> dict[str, Any]:
    """The metadata keys every builder fills the same way (the rest depend on the tables)."""
    return {
        "family": family_name,
        "scale": scale,
        "seed": seed,
        "batch_size": cfg["batch_size"],
        "num_tasks": cfg["num_tasks"],
        "num_features": lay.num_features,
        "num_dense_features": cfg["num_dense_features"],
        "num_tables": lay.num_tables,
        "embedding_dim": lay.embedding_dim,
        "dense_params": dense_info.dense_params,
        "dense_nodes": nodes,
        "flops_per_sample": dense_info.flops_per_sample,
        "config": cfg,
    }
