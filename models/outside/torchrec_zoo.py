"""torchrec's own models (``torchrec.models``), called as torchrec's docs show: dense features plus
a ``KeyedJaggedTensor`` of sparse ids, on a small ``EmbeddingBagCollection``.

WHY: these are the models our users start from, and they reach ``optimize`` with a KJT input
(not the pooled embeddings our harness feeds the dense arch), so they test the capture paths too.
"""

from __future__ import annotations

import importlib
from typing import Any

import torch
from torch import nn

PREFIX = "torchrec"
TABLES = 8
DIM = 8
DENSE = 13
BATCH = 32
ROWS = 100


def available() -> bool:
    try:
        importlib.import_module("torchrec.models.dlrm")
    except (ImportError, OSError):
        return False
    return True


def _ebc(seed: int) -> Any:
    from torchrec.modules.embedding_configs import EmbeddingBagConfig
    from torchrec.modules.embedding_modules import EmbeddingBagCollection

    torch.manual_seed(seed)
    tables = [
        EmbeddingBagConfig(name=f"t{i}", embedding_dim=DIM, num_embeddings=ROWS, feature_names=[f"f{i}"])
        for i in range(TABLES)
    ]
    return EmbeddingBagCollection(tables=tables, device=torch.device("cpu"))


def kjt(seed: int, batch: int = BATCH) -> Any:
    """Seeded ids, one to three per sample and feature."""
    from torchrec.sparse.jagged_tensor import KeyedJaggedTensor

    gen = torch.Generator().manual_seed(seed)
    lengths = torch.randint(1, 4, (TABLES * batch,), generator=gen)
    values = torch.randint(0, ROWS, (int(lengths.sum()),), generator=gen)
    return KeyedJaggedTensor.from_lengths_sync(
        keys=[f"f{i}" for i in range(TABLES)], values=values, lengths=lengths
    )


def _inputs(seed: int) -> tuple[Any, ...]:
    gen = torch.Generator().manual_seed(seed + 1)
    return torch.rand(BATCH, DENSE, generator=gen), kjt(seed)


def _dlrm(seed: int) -> tuple[nn.Module, tuple[Any, ...]]:
    from torchrec.models.dlrm import DLRM

    return DLRM(_ebc(seed), DENSE, [32, DIM], [32, 16, 1]).train(), _inputs(seed)


def _dlrm_dcn(seed: int) -> tuple[nn.Module, tuple[Any, ...]]:
    from torchrec.models.dlrm import DLRM_DCN

    return DLRM_DCN(
        _ebc(seed), DENSE, [32, DIM], [32, 16, 1], dcn_num_layers=3, dcn_low_rank_dim=8
    ).train(), _inputs(seed)


def _dlrm_projection(seed: int) -> tuple[nn.Module, tuple[Any, ...]]:
    from torchrec.models.dlrm import DLRM_Projection

    model = DLRM_Projection(_ebc(seed), DENSE, [32, DIM], [32, 16, 1], [DIM * 3, 4 * DIM], [DIM * 3, 4 * DIM])
    return model.train(), _inputs(seed)


def _deepfm(seed: int) -> tuple[nn.Module, tuple[Any, ...]]:
    from torchrec.models.deepfm import SimpleDeepFMNN

    return SimpleDeepFMNN(DENSE, _ebc(seed), hidden_layer_size=32, deep_fm_dimension=8).train(), _inputs(seed)


MODELS: dict[str, Any] = {
    "DLRM": _dlrm,
    "DLRM_DCN": _dlrm_dcn,
    "DLRM_Projection": _dlrm_projection,
    "SimpleDeepFMNN": _deepfm,
}
