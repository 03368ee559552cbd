"""The family registry: name -> the module that is that family.

Why a table: a family is one file, `models/<name>.py`, holding everything that is its own
(`FIELDS`, `PRESETS`, an optional `check_config(cfg)` and `build_dense(cfg, layout)`), plus one
line in `NAMES` below (TorchBench style); everything else (common fields, shared sizes per scale,
sparse arch, data, metadata) is shared. A family module missing one of its parts (or a scale in
`PRESETS`, checked by models/presets.py) fails at `import models` with a line naming the module
and the part, not later inside a build.
"""

from __future__ import annotations

import importlib
from collections.abc import Mapping
from types import ModuleType
from typing import Any, Protocol

from torch import nn

from models.fields import Field
from models.sparse import SparseLayout

NAMES: tuple[str, ...] = (
    "dlrm",
    "dcn",
    "towers",
    "mmoe",
)


class Family(Protocol):
    """What a family module holds (`check_config` is optional)."""

    FIELDS: dict[str, Field]
    PRESETS: dict[str, dict[str, Any]]

    def build_dense(self, cfg: Mapping[str, Any], lay: SparseLayout) -> nn.Module: ...


def _load(name: str) -> ModuleType:
    module = importlib.import_module(f"models.{name}")
    for part in ("FIELDS", "PRESETS", "build_dense"):
        if not hasattr(module, part):
            raise ImportError(f"models/{name}.py: a family module needs {part} (see docs/models.md)")
    return module


FAMILY_MODULES: dict[str, ModuleType] = {name: _load(name) for name in NAMES}
FAMILIES: tuple[str, ...] = NAMES


def family(name: str) -> ModuleType:
    if name not in FAMILY_MODULES:
        raise ValueError(f"unknown family {name!r}; allowed families: {list(FAMILIES)}")
    return FAMILY_MODULES[name]
