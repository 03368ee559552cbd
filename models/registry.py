"""The family registry: name -> the module that builds that family's dense arch.

Why a table: a new family is one file with `FIELDS` and `build_dense(cfg, layout)`, plus one
line here (TorchBench style); everything else (sparse arch, data, metadata) is shared.
"""

from __future__ import annotations

from collections.abc import Mapping
from types import ModuleType
from typing import Any, Protocol

from torch import nn

from models import dcn, dlrm, mmoe, towers
from models.fields import Field
from models.sparse import SparseLayout


class Family(Protocol):
    FIELDS: dict[str, Field]

    def build_dense(self, cfg: Mapping[str, Any], lay: SparseLayout) -> nn.Module: ...


FAMILY_MODULES: dict[str, ModuleType] = {"dlrm": dlrm, "dcn": dcn, "towers": towers, "mmoe": mmoe}
FAMILIES: tuple[str, ...] = tuple(FAMILY_MODULES)


def family(name: str) -> ModuleType:
    if name not in FAMILY_MODULES:
        raise ValueError(f"unknown family {name!r}; allowed families: {list(FAMILIES)}")
    return FAMILY_MODULES[name]
