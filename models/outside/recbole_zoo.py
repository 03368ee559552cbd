"""RecBole's context-aware models (``pip install --no-deps recbole``), with the zoo's own defaults.

WHY this zoo: a third way of writing the same architectures (DeepFM, Wide&Deep, DCN, DCN-V2,
AutoInt, xDeepFM, NFM, PNN): one offset ``FMEmbedding`` table for every categorical field, numeric
fields embedded as ``value * embedding(bucket)``, RecBole's ``MLPLayers`` (``Dropout -> Linear ->
activation``), and a first-order linear part of its own. Three zoos writing one architecture is
what keeps a rule from fitting one zoo's style.

How a model is built. A RecBole model takes ``(config, dataset)``. The zoo's ``Config`` cannot be
built on NumPy 2 (RecBole 1.2.1 assigns ``np.float = np.float_``, removed in NumPy 2), and its
dataset is read from files. So the config here is the zoo's own YAML defaults (``overall.yaml``,
the dataset defaults and the model's file, read from the installed package) with the fields
below, and the dataset is described by the five things a context-aware model reads from it:
``fields()``, ``field2type``, ``field2source``, ``field2seqlen`` and ``num()``. Its inputs are
the dict a RecBole ``Interaction`` indexes: one tensor per field, categorical ids ``[B]`` and
numeric fields ``[B, 2]`` (value and bucket 1, what RecBole stores for a float field it does not
discretize). 26 categorical fields (vocabularies of 10-209) and 13 numeric ones, Criteo's layout,
batch 64, seeded synthetic values.

Imports: ``recbole.utils`` imports ``torch.utils.tensorboard`` at module level for a training
logger the models never use; where TensorBoard is not installed, the import sees a stub whose
``SummaryWriter`` raises. Nothing reaches the network.
"""

from __future__ import annotations

import contextlib
import importlib
import importlib.util
import sys
import types
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import torch
from torch import nn

PREFIX = "recbole"
SPARSE = 26  # Criteo's categorical columns
DENSE = 13  # Criteo's numeric columns
BATCH = 64
MODEL_NAMES = ("DeepFM", "WideDeep", "DCN", "DCNV2", "AutoInt", "xDeepFM", "NFM", "PNN")


class _NoSummaryWriter:
    def __init__(self, *args: Any, **kwargs: Any) -> None:
        raise RuntimeError("TensorBoard is not installed: the outside corpus builds RecBole's models only")


@contextlib.contextmanager
def _without_tensorboard() -> Iterator[None]:
    """Let ``recbole.utils`` import where TensorBoard is absent (its models never write a summary)."""
    name = "torch.utils.tensorboard"
    if importlib.util.find_spec("tensorboard") is not None or name in sys.modules:
        yield
        return
    stub = types.ModuleType(name)
    stub.SummaryWriter = _NoSummaryWriter  # type: ignore[attr-defined]
    sys.modules[name] = stub
    try:
        yield
    finally:
        if sys.modules.get(name) is stub:
            sys.modules.pop(name)


def _zoo() -> Any:
    with _without_tensorboard():
        return importlib.import_module("recbole.model.context_aware_recommender")


def available() -> bool:
    try:
        _zoo()
    except ImportError:
        return False
    return True


class _Config(dict[str, Any]):
    """RecBole's ``Config`` lookup: a key it does not hold reads ``None``."""

    def __getitem__(self, key: str) -> Any:
        return self.get(key)


def _config(model: str) -> _Config:
    import yaml

    props = Path(importlib.import_module("recbole").__file__ or "").parent / "properties"
    config = _Config()
    for path in (
        props / "overall.yaml",
        props / "dataset" / "sample.yaml",
        props / "model" / f"{model}.yaml",
    ):
        config.update(yaml.safe_load(path.read_text()) or {})
    config.update(
        model=model,
        device=torch.device("cpu"),
        numerical_features=[f"I{i}" for i in range(DENSE)],
    )
    return config


class _Fields:
    """What a RecBole context-aware model reads from its ``Dataset``: every field, its type,
    source, length and size (``Dataset.num``: tokens for a categorical field, buckets for a
    numeric one that is embedded)."""

    def __init__(self, vocab: list[int]) -> None:
        enum = importlib.import_module("recbole.utils.enum_type")
        self.field2type: dict[str, Any] = {}
        self.field2source: dict[str, Any] = {}
        self.field2seqlen: dict[str, int] = {}
        self._num: dict[str, int] = {}
        for i, v in enumerate(vocab):
            self._add(f"C{i}", enum.FeatureType.TOKEN, enum.FeatureSource.INTERACTION, v)
        for i in range(DENSE):
            self._add(f"I{i}", enum.FeatureType.FLOAT, enum.FeatureSource.INTERACTION, 2)

    def _add(self, name: str, ftype: Any, source: Any, num: int) -> None:
        self.field2type[name], self.field2source[name] = ftype, source
        self.field2seqlen[name], self._num[name] = 1, num

    def num(self, field: str) -> int:
        return self._num[field]

    def fields(self, ftype: Any = None, source: Any = None) -> list[str]:
        return [
            f
            for f in self.field2type
            if (ftype is None or self.field2type[f] in set(ftype))
            and (source is None or self.field2source[f] in set(source))
        ]


def _inputs(seed: int) -> tuple[list[int], dict[str, torch.Tensor]]:
    gen = torch.Generator().manual_seed(seed)
    vocab = [10 + (37 * i) % 200 for i in range(SPARSE)]
    x = {f"C{i}": torch.randint(0, v, (BATCH,), generator=gen) for i, v in enumerate(vocab)}
    x |= {
        f"I{i}": torch.stack([torch.rand(BATCH, generator=gen), torch.ones(BATCH)], 1) for i in range(DENSE)
    }
    return vocab, x


def _build(model: str) -> Any:
    def build(seed: int) -> tuple[nn.Module, tuple[Any, ...]]:
        cls = getattr(_zoo(), model)
        vocab, x = _inputs(seed)
        torch.manual_seed(seed)  # the zoo's initializers draw from the global generator
        return cls(_config(model), _Fields(vocab)).train(), (x,)

    return build


MODELS: dict[str, Any] = {name: _build(name) for name in MODEL_NAMES}
