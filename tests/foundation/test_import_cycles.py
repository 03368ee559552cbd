"""No import cycle between the top-level packages, nor between the modules of ``optimus``,
``harness`` or ``models`` (that each package's layers import only downward: ``test_layers.py``).

WHY: a cycle makes import order matter (a module half-initialised when its partner reads it),
and it means two parts cannot be understood, or moved, one without the other. The graph is read
from source with ``ast``; which imports count (function-local ones do; ``TYPE_CHECKING`` ones and
``try/except ImportError`` ones do not) is stated in ``import_graph``'s docstring.
"""

from __future__ import annotations

from pathlib import Path

import pytest
from import_graph import cycles, module_graph, package_graph


def test_no_cycle_between_packages() -> None:
    assert cycles(package_graph(module_graph())) == []


@pytest.mark.parametrize("package", ["optimus", "harness", "models"])
def test_no_cycle_inside_a_package(package: str) -> None:
    assert cycles(module_graph([package])) == []


def _write(root: Path, files: dict[str, str]) -> None:
    for name, text in files.items():
        path = root / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)


def test_the_detector_finds_the_cycles_it_should(tmp_path: Path) -> None:
    """The rule itself, on a scratch package: a function-local import and an import of a
    submodule (which runs its package's ``__init__``) close cycles; a TYPE_CHECKING import and an
    optional-dependency import do not."""
    _write(
        tmp_path,
        {
            "pkg/__init__.py": "",
            "pkg/engine.py": "from .rules.base import Cost\n",
            "pkg/rules/__init__.py": "from .one import One\n",
            "pkg/rules/base.py": "Cost = 1\n",
            "pkg/rules/one.py": "def f():\n    from ..engine import x\n",
            "pkg/typed.py": "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from .hint import H\n",
            "pkg/hint.py": "from .typed import T\n",
            "pkg/soft.py": "try:\n    from .back import B\nexcept ImportError:\n    B = None\n",
            "pkg/back.py": "from . import soft\n",
            "other/__init__.py": "import pkg.engine\n",
        },
    )
    graph = module_graph(["pkg", "other"], tmp_path)
    assert cycles(graph) == [["pkg.engine", "pkg.rules", "pkg.rules.one"]]
    assert package_graph(graph) == {"pkg": set(), "other": {"pkg"}}
    _write(tmp_path, {"pkg/engine.py": "import other\n"})
    assert cycles(package_graph(module_graph(["pkg", "other"], tmp_path))) == [["other", "pkg"]]
