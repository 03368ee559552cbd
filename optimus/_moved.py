"""Old module paths, kept working for one release with a ``DeprecationWarning``.

WHY: the package was laid out in layers (``capture/``, ``params/``, ``rules/``, ``engine/``,
``memory/``, ``semantics/``, ``cost/``); code written against the old flat paths that the docs
named (``optimus.layout_relayout.RelayoutParams``, ``optimus.builder.Builder``, ...) keeps
importing, and is told the new import. Names a user writes are at the package's top
(``optimus.RelayoutParams``); the rest name their new module. Remove in the next release.
"""

from __future__ import annotations

import importlib
import importlib.abc
import importlib.machinery
import sys
import types
import warnings
from typing import Any

# old module -> (new module, {name: the import to write instead})
MODULES: dict[str, tuple[str, dict[str, str]]] = {
    "optimus.layout_relayout": (
        "optimus.params.relayout",
        {
            "RelayoutParams": "optimus.RelayoutParams",
            "retained_gradient_buffers": "optimus.retained_gradient_buffers",
        },
    ),
    "optimus.layout": (
        "optimus.engine.param_layout",
        {"RuntimeStack": "optimus.RuntimeStack", "ParamLayout": "optimus.ParamLayout"},
    ),
    "optimus.cost_measured": ("optimus.cost.measured", {"MeasuredCostModel": "optimus.MeasuredCostModel"}),
    "optimus.stop_reason": (
        "optimus.report",
        {"StopReason": "optimus.StopReason", "StopKind": "optimus.StopKind"},
    ),
    "optimus.specialized": ("optimus.capture.specialized", {}),
    "optimus.builder": ("optimus.engine.builder", {}),
    "optimus.meta": ("optimus.semantics.meta", {}),
    "optimus.checkpoint_rng": ("optimus.capture.checkpoint_rng", {}),
    "optimus.relayout_contract": ("optimus.params.contract", {}),
    "optimus.rules.base": ("optimus.engine.rule", {}),
}
# names of an old module that became a package of the same name: package -> {name: (module, hint)}
PACKAGE_NAMES: dict[str, dict[str, tuple[str, str]]] = {
    "optimus.cost": {
        "AnalyticCostModel": ("optimus.cost.analytic", "optimus.AnalyticCostModel"),
        "CostModel": ("optimus.cost.analytic", "optimus.CostModel"),
        "DeviceConstants": ("optimus.cost.analytic", "optimus.DeviceConstants"),
        "CPU": ("optimus.cost.analytic", "optimus.CPU"),
        "CUDA": ("optimus.cost.analytic", "optimus.CUDA"),
        "for_inductor": ("optimus.cost.analytic", "optimus.cost.analytic.for_inductor"),
    },
    "optimus.memory": {"estimate": ("optimus.memory.live", "optimus.memory.live.estimate")},
    "optimus.capture": {
        "static_shape_guards_skipped": (
            "optimus.capture.export",
            "optimus.capture.export.static_shape_guards_skipped",
        ),
    },
}


def _warn(old: str, new: str) -> None:
    warnings.warn(f"{old} moved: import {new} instead", DeprecationWarning, stacklevel=3)


def package_attribute(package: str, name: str) -> Any:
    """A package's ``__getattr__``: a name its old flat module had, with a warning."""
    where = PACKAGE_NAMES.get(package, {}).get(name)
    if where is None:
        raise AttributeError(f"module {package!r} has no attribute {name!r}")
    _warn(f"{package}.{name}", where[1])
    return getattr(importlib.import_module(where[0]), name)


class _Forward(types.ModuleType):
    def __getattr__(self, name: str) -> Any:
        new, hints = MODULES[self.__name__]
        target = importlib.import_module(new)
        if not hasattr(target, name):
            raise AttributeError(f"module {self.__name__!r} has no attribute {name!r}")
        _warn(f"{self.__name__}.{name}", hints.get(name, f"{new}.{name}"))
        return getattr(target, name)


class _Loader(importlib.abc.Loader):
    def create_module(self, spec: importlib.machinery.ModuleSpec) -> types.ModuleType:
        return _Forward(spec.name)

    def exec_module(self, module: types.ModuleType) -> None:
        _warn(module.__name__, MODULES[module.__name__][0])


class _Finder(importlib.abc.MetaPathFinder):
    def find_spec(
        self, fullname: str, path: Any, target: Any = None
    ) -> importlib.machinery.ModuleSpec | None:
        if fullname not in MODULES:
            return None
        return importlib.machinery.ModuleSpec(fullname, _Loader())


def install() -> None:
    if not any(isinstance(f, _Finder) for f in sys.meta_path):
        sys.meta_path.append(_Finder())
