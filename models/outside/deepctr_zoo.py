"""DeepCTR-Torch's model zoo (``pip install --no-deps deepctr-torch``), built as its README shows.

WHY this zoo: it ships 20 CTR architectures (DeepFM, xDeepFM, AutoInt, DCN, DCN-Mix, FiBiNET,
Wide&Deep, PNN, NFM, AFM, ... and the multi-task MMoE, PLE, ESMM, SharedBottom) as ordinary
``nn.Module``s in one small pure-Python wheel; its only imports beyond torch are tqdm and
scikit-learn. FuxiCTR's wheel holds only base classes (its zoo lives in its repository).

Inputs follow the zoo's convention: one float tensor ``X[B, columns]``, categorical columns as
integer-valued floats. ``deepctr_torch/__init__`` starts a thread that asks PyPI for a newer
version; the import here swaps in an offline ``requests`` stub for it, so nothing reaches the
network.
"""

from __future__ import annotations

import contextlib
import importlib
import sys
import types
from collections.abc import Iterator
from typing import Any

import torch
from torch import nn

PREFIX = "deepctr"
SPARSE = 26  # Criteo's categorical columns
DENSE = 13  # Criteo's numeric columns
BATCH = 64
EMBED = 8


@contextlib.contextmanager
def _offline() -> Iterator[None]:
    stub = types.ModuleType("requests")
    stub.codes = types.SimpleNamespace(ok=200)  # type: ignore[attr-defined]
    stub.get = lambda *a, **k: types.SimpleNamespace(status_code=0, text="")  # type: ignore[attr-defined]
    saved = sys.modules.get("requests")
    sys.modules["requests"] = stub
    try:
        yield
    finally:
        if saved is None:
            sys.modules.pop("requests", None)
        else:
            sys.modules["requests"] = saved


def available() -> bool:
    try:
        with _offline():
            importlib.import_module("deepctr_torch")
    except ImportError:
        return False
    return True


def _zoo() -> Any:
    with _offline():
        return importlib.import_module("deepctr_torch")


def _columns(seed: int) -> tuple[list[Any], torch.Tensor]:
    inputs = importlib.import_module("deepctr_torch.inputs")
    gen = torch.Generator().manual_seed(seed)
    vocab = [10 + (37 * i) % 200 for i in range(SPARSE)]
    sparse = [inputs.SparseFeat(f"C{i}", vocab[i], embedding_dim=EMBED) for i in range(SPARSE)]
    dense = [inputs.DenseFeat(f"I{i}", 1) for i in range(DENSE)]
    cols = [torch.randint(0, v, (BATCH, 1), generator=gen).float() for v in vocab]
    cols += [torch.rand(BATCH, 1, generator=gen) for _ in range(DENSE)]
    return [*sparse, *dense], torch.cat(cols, 1)


def _build(cls_name: str, two_column_sets: bool, **kw: Any) -> Any:
    """A builder of ``cls_name`` (its columns passed once, or as linear and DNN columns)."""

    def build(seed: int) -> tuple[nn.Module, tuple[Any, ...]]:
        zoo = _zoo()
        columns, x = _columns(seed)
        torch.manual_seed(seed)
        cls = getattr(zoo.models, cls_name, None) or getattr(zoo.models.multitask, cls_name)
        args = (columns, columns) if two_column_sets else (columns,)
        return cls(*args, device="cpu", seed=seed, **kw).train(), (x,)

    return build


# Rankers take (linear columns, DNN columns); the multi-task models and PNN take the DNN columns.
# AFM is left out: it takes no dense columns (its docs build it on sparse ones only).
_RANKERS = (
    "DeepFM",
    "xDeepFM",
    "AutoInt",
    "DCN",
    "DCNMix",
    "FiBiNET",
    "WDL",
    "NFM",
    "IFM",
    "DIFM",
    "AFN",
    "ONN",
)
MODELS: dict[str, Any] = {
    **{name: _build(name, True) for name in _RANKERS},
    "PNN": _build("PNN", False),
    "MMOE": _build("MMOE", False, num_experts=4),
    "PLE": _build("PLE", False),
    "ESMM": _build("ESMM", False),
    "SharedBottom": _build("SharedBottom", False),
}
