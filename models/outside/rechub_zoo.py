"""torch-rechub's model zoo (``pip install --no-deps torch-rechub``), built as its tutorials show.

WHY this zoo: it implements the same architectures as DeepCTR-Torch (DeepFM, DCN, DCN-V2,
AutoInt, FiBiNET, Wide&Deep and the multi-task MMoE, PLE, ESMM, SharedBottom, plus AITM) in a
different way of writing: every MLP, experts included, is ``Linear -> BatchNorm1d -> activation ->
Dropout``, inputs arrive as a dict of one tensor per feature, and the multi-task gates are MLPs
with a softmax. A rule that only fits DeepCTR's way of writing a model shows here.

Inputs follow the zoo's convention: one dict ``{feature name: tensor[B]}``, categorical features
as integer ids, numeric ones as floats: 26 ``SparseFeature`` (vocabularies of 10-209, embedding
dim 8) and 13 ``DenseFeature`` (Criteo's layout), batch 64, seeded synthetic values. The import
reaches no network (the package has no version check); it imports pandas (``requirements/dev.txt``).
"""

from __future__ import annotations

import importlib
import types
from typing import Any

import torch
from torch import nn

PREFIX = "rechub"
SPARSE = 26  # Criteo's categorical columns
DENSE = 13  # Criteo's numeric columns
BATCH = 64
EMBED = 8
MLP = {"dims": [256, 128], "dropout": 0.2, "activation": "relu"}  # the zoo's Criteo examples
TASKS = ["classification", "classification"]
TOWERS = [{"dims": [8]}, {"dims": [8]}]  # the zoo's multi-task (census-income) examples


def available() -> bool:
    try:
        importlib.import_module("torch_rechub.models.ranking")
    except ImportError:
        return False
    return True


def _features(seed: int) -> tuple[list[Any], list[Any], dict[str, torch.Tensor]]:
    """``(sparse features, dense features, inputs)``: seeded ids and values, one tensor each."""
    features = importlib.import_module("torch_rechub.basic.features")
    gen = torch.Generator().manual_seed(seed)
    vocab = [10 + (37 * i) % 200 for i in range(SPARSE)]
    sparse = [features.SparseFeature(f"C{i}", vocab_size=vocab[i], embed_dim=EMBED) for i in range(SPARSE)]
    dense = [features.DenseFeature(f"I{i}") for i in range(DENSE)]
    x = {f"C{i}": torch.randint(0, v, (BATCH,), generator=gen) for i, v in enumerate(vocab)}
    x |= {f"I{i}": torch.rand(BATCH, generator=gen) for i in range(DENSE)}
    return sparse, dense, x


def _build(make: Any) -> Any:
    """A builder: ``make(module namespace, sparse, dense)`` constructs the model."""

    def build(seed: int) -> tuple[nn.Module, tuple[Any, ...]]:
        zoo = types.SimpleNamespace(
            ranking=importlib.import_module("torch_rechub.models.ranking"),
            multi_task=importlib.import_module("torch_rechub.models.multi_task"),
        )
        sparse, dense, x = _features(seed)
        torch.manual_seed(seed)  # the zoo's initializers draw from the global generator
        return make(zoo, sparse, dense).train(), (x,)

    return build


MODELS: dict[str, Any] = {
    "DeepFM": _build(lambda z, s, d: z.ranking.DeepFM(deep_features=d + s, fm_features=s, mlp_params=MLP)),
    "WideDeep": _build(lambda z, s, d: z.ranking.WideDeep(wide_features=d, deep_features=s, mlp_params=MLP)),
    "DCN": _build(lambda z, s, d: z.ranking.DCN(features=d + s, n_cross_layers=3, mlp_params=MLP)),
    "DCNv2": _build(
        lambda z, s, d: z.ranking.DCNv2(
            features=d + s,
            n_cross_layers=3,
            mlp_params=MLP,
            use_low_rank_mixture=True,
            low_rank=32,
            num_experts=4,
        )
    ),
    "AutoInt": _build(
        lambda z, s, d: z.ranking.AutoInt(
            sparse_features=s, dense_features=d, num_layers=3, num_heads=2, mlp_params=MLP
        )
    ),
    # FiBiNET's SENET and bilinear layers take the sparse fields only, as its example does
    "FiBiNet": _build(lambda z, s, d: z.ranking.FiBiNet(features=s, mlp_params=MLP, reduction_ratio=3)),
    "MMOE": _build(
        lambda z, s, d: z.multi_task.MMOE(
            d + s, TASKS, n_expert=8, expert_params={"dims": [16]}, tower_params_list=TOWERS
        )
    ),
    "PLE": _build(
        lambda z, s, d: z.multi_task.PLE(
            d + s,
            TASKS,
            n_level=1,
            n_expert_specific=2,
            n_expert_shared=1,
            expert_params={"dims": [16]},
            tower_params_list=TOWERS,
        )
    ),
    "AITM": _build(
        lambda z, s, d: z.multi_task.AITM(
            d + s, n_task=2, bottom_params={"dims": [32, 16]}, tower_params_list=TOWERS
        )
    ),
    "SharedBottom": _build(
        lambda z, s, d: z.multi_task.SharedBottom(
            d + s, TASKS, bottom_params={"dims": [117]}, tower_params_list=TOWERS
        )
    ),
    # ESMM's towers read user and item fields (sparse only, as its example builds them)
    "ESMM": _build(
        lambda z, s, d: z.multi_task.ESMM(
            s[: SPARSE // 2], s[SPARSE // 2 :], cvr_params={"dims": [16, 8]}, ctr_params={"dims": [16, 8]}
        )
    ),
}
