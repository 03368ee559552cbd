"""The repository's import graph, read from source with ``ast`` (nothing is imported).

Which imports count (the rule the cycle test enforces):

- every ``import`` / ``from ... import`` statement, at module level **and inside functions**:
  a function-local import is a real dependency that runs at call time, and hiding a cycle in a
  function is still a cycle;
- except imports under ``if TYPE_CHECKING:`` (they never run; annotations only), and imports
  inside a ``try:`` whose handler catches ``ImportError`` / ``ModuleNotFoundError`` (lazy imports
  of an optional dependency, which the importer survives without).

Importing ``a.b.c`` also runs the package ``a.b`` (its ``__init__``), so the edge goes to every
package on the way that is not already an ancestor of the importer. ``from pkg import name`` is
an edge to ``pkg.name`` when that is a module of the repository, else to ``pkg``.
"""

from __future__ import annotations

import ast
from collections.abc import Iterable, Iterator
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
PACKAGES = ("optimus", "models", "harness", "benchmarks")


def module_files(packages: Iterable[str] = PACKAGES, root: Path = ROOT) -> dict[str, Path]:
    """Dotted module name -> file, for every ``.py`` under the given packages."""
    out: dict[str, Path] = {}
    for pkg in packages:
        for path in sorted((root / pkg).rglob("*.py")):
            parts = list(path.relative_to(root).with_suffix("").parts)
            if parts[-1] == "__init__":
                parts.pop()
            out[".".join(parts)] = path
    return out


def _is_type_checking(test: ast.expr) -> bool:
    return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or (
        isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING"
    )


def _catches_import_error(handlers: list[ast.ExceptHandler]) -> bool:
    names: list[str] = []
    for h in handlers:
        kinds = h.type.elts if isinstance(h.type, ast.Tuple) else [h.type]
        names.extend(k.id for k in kinds if isinstance(k, ast.Name))
    return bool({"ImportError", "ModuleNotFoundError"} & set(names))


def _imports(tree: ast.AST) -> Iterator[ast.Import | ast.ImportFrom]:
    """Import statements that count (see the module docstring), in any nesting."""
    stack: list[ast.AST] = [tree]
    while stack:
        node = stack.pop()
        if isinstance(node, ast.If) and _is_type_checking(node.test):
            stack.extend(node.orelse)
            continue
        if isinstance(node, ast.Try) and _catches_import_error(node.handlers):
            stack.extend([*node.handlers, *node.orelse, *node.finalbody])
            continue
        if isinstance(node, ast.Import | ast.ImportFrom):
            yield node
        stack.extend(ast.iter_child_nodes(node))


def _resolve(module: str, is_package: bool, stmt: ast.ImportFrom) -> str:
    if not stmt.level:
        return stmt.module or ""
    base = module.split(".")
    if not is_package:
        base = base[:-1]
    base = base[: len(base) - (stmt.level - 1)]
    return ".".join([*base, stmt.module] if stmt.module else base)


def _with_parents(target: str, importer: str, known: dict[str, Path]) -> set[str]:
    parts = target.split(".")
    out = set()
    for i in range(1, len(parts) + 1):
        name = ".".join(parts[:i])
        if name in known and not (importer == name or importer.startswith(name + ".")):
            out.add(name)
    return out


def module_graph(packages: Iterable[str] = PACKAGES, root: Path = ROOT) -> dict[str, set[str]]:
    """Module -> the repository modules it imports (per the rule in the module docstring)."""
    known = module_files(packages, root)
    graph: dict[str, set[str]] = {m: set() for m in known}
    for module, path in known.items():
        is_package = path.name == "__init__.py"
        for stmt in _imports(ast.parse(path.read_text(), str(path))):
            targets: list[str] = []
            if isinstance(stmt, ast.Import):
                targets = [a.name for a in stmt.names]
            else:
                base = _resolve(module, is_package, stmt)
                targets = [f"{base}.{a.name}" if f"{base}.{a.name}" in known else base for a in stmt.names]
            for target in targets:
                graph[module] |= _with_parents(target, module, known)
    return graph


def package_graph(modules: dict[str, set[str]]) -> dict[str, set[str]]:
    """Top-level package -> the other top-level packages it imports."""
    out: dict[str, set[str]] = {}
    for src, dsts in modules.items():
        top = src.split(".")[0]
        out.setdefault(top, set()).update(d.split(".")[0] for d in dsts if d.split(".")[0] != top)
    return out


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components with more than one node (each holds a cycle), sorted;
    Tarjan's algorithm, iterative."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    on_stack: set[str] = set()
    stack: list[str] = []
    found: list[list[str]] = []
    counter = 0
    for start in sorted(graph):
        if start in index:
            continue
        work: list[tuple[str, Iterator[str]]] = [(start, iter(sorted(graph[start])))]
        index[start] = low[start] = counter
        counter += 1
        stack.append(start)
        on_stack.add(start)
        while work:
            node, children = work[-1]
            child = next(children, None)
            if child is not None:
                if child not in graph:
                    continue
                if child not in index:
                    index[child] = low[child] = counter
                    counter += 1
                    stack.append(child)
                    on_stack.add(child)
                    work.append((child, iter(sorted(graph[child]))))
                elif child in on_stack:
                    low[node] = min(low[node], index[child])
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[node])
            if low[node] == index[node]:
                component = []
                while True:
                    member = stack.pop()
                    on_stack.discard(member)
                    component.append(member)
                    if member == node:
                        break
                if len(component) > 1:
                    found.append(sorted(component))
    return sorted(found)
