"""Each package's layers import only downward, and the harness reads only optimus's public names.

WHY: a layer that imports one above it can no longer be read, tested or moved without it, and the
next change closes a cycle. The layers are declared here, top to bottom; an import from a module
to a module of a higher layer fails the test. Imports inside a layer are free (the cycle test
covers them). The rule for which imports count is ``import_graph``'s (``TYPE_CHECKING`` imports,
annotations only, do not).
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest
from import_graph import ROOT, module_graph

# top to bottom; a module belongs to the longest prefix that names it
LAYERS: dict[str, list[list[str]]] = {
    "optimus": [
        ["optimus", "optimus.api", "optimus.backend", "optimus.dry_run"],  # entry points
        ["optimus.config"],
        ["optimus.capture"],
        ["optimus.params"],
        ["optimus.rules"],
        ["optimus.engine"],
        ["optimus.memory"],
        ["optimus.semantics"],
        ["optimus.kernels", "optimus.cost"],
        ["optimus.report", "optimus.atomic", "optimus._moved"],  # leaves every layer may read
    ],
    # docs/harness.md, "Code map": the commands drive the nightly job, which gates with compare,
    # which reads reports' figures, ... down to the shared modules at the top of ``harness/`` and
    # the mode registry that every layer names.
    "harness": [
        ["harness", "harness.cli"],
        ["harness.nightly"],
        ["harness.gate"],
        ["harness.report"],
        ["harness.diagnose"],
        ["harness.run"],
        ["harness.measure"],
        ["harness.store"],
        [
            "harness.spec",
            "harness.metric_registry",
            "harness.exit_codes",
            "harness.outputs",
            "harness.env",
            "harness.env_check",
            "harness.stats",
            "harness.provider",
        ],
        ["harness.modes"],
        ["harness.providers"],
    ],
}


def _rank(module: str, layers: list[list[str]]) -> int:
    best, length = -1, -1
    for i, names in enumerate(layers):
        for name in names:
            if (module == name or module.startswith(name + ".")) and len(name) > length:
                best, length = i, len(name)
    if best < 0:
        raise AssertionError(f"{module} is in no declared layer: add it to LAYERS")
    return best


def upward_imports(package: str, layers: list[list[str]], root: Path | None = None) -> list[str]:
    graph = module_graph([package]) if root is None else module_graph([package], root)
    found = []
    for module, targets in sorted(graph.items()):
        for target in sorted(targets):
            if target.startswith(package) and _rank(target, layers) < _rank(module, layers):
                found.append(f"{module} -> {target}")
    return found


@pytest.mark.parametrize("package", sorted(LAYERS))
def test_layers_import_only_downward(package: str) -> None:
    assert upward_imports(package, LAYERS[package]) == []


def test_every_module_is_in_a_layer() -> None:
    for package, layers in LAYERS.items():
        for module in module_graph([package]):
            _rank(module, layers)


def test_the_check_finds_an_upward_import(tmp_path: Path) -> None:
    """On a scratch package: an engine module importing the entry point is reported; an entry
    point importing the engine, and a TYPE_CHECKING import upward, are not."""
    files = {
        "pkg/__init__.py": "from pkg import api\n",
        "pkg/api.py": "from pkg.engine import run\n",
        "pkg/engine/__init__.py": "",
        "pkg/engine/run.py": "def f():\n    from pkg import api\n",
        "pkg/engine/typed.py": "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from pkg import api\n",
    }
    for name, text in files.items():
        path = tmp_path / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
    layers = [["pkg", "pkg.api"], ["pkg.engine"]]
    assert upward_imports("pkg", layers, tmp_path) == ["pkg.engine.run -> pkg.api"]


def private_optimus_imports(root: Path = ROOT) -> list[str]:
    """Imports in ``harness/`` of a name or module of ``optimus`` that starts with ``_``."""
    found = []
    for path in sorted((root / "harness").rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ImportFrom) and (node.module or "").split(".")[0] == "optimus":
                names = [*node.module.split("."), *(a.name for a in node.names)]  # type: ignore[union-attr]
            elif isinstance(node, ast.Import):
                names = [
                    p for a in node.names if a.name.split(".")[0] == "optimus" for p in a.name.split(".")
                ]
            else:
                continue
            if any(n.startswith("_") for n in names):
                found.append(f"{path.relative_to(root)}:{node.lineno}")
    return found


def test_harness_uses_no_private_name_of_optimus() -> None:
    """The harness is optimus's first user: it reads the public surface (``optimus.dry_run``,
    ``optimus.RelayoutParams``, ...), so a refactor of optimus's insides cannot break it."""
    assert private_optimus_imports() == []


def test_the_private_name_check_finds_one(tmp_path: Path) -> None:
    (tmp_path / "harness").mkdir()
    (tmp_path / "harness/a.py").write_text("from optimus.api import optimize\nfrom optimus.x import _y\n")
    (tmp_path / "harness/b.py").write_text("def f():\n    import optimus._moved\n")
    assert private_optimus_imports(tmp_path) == ["harness/a.py:2", "harness/b.py:2"]
