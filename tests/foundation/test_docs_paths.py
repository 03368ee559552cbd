"""Every repository path the architecture document, the README and the "Adding a ..." sections
name exists.

Why: a how-to that names a file which moved is the first thing a newcomer trips over. Paths with a placeholder (``models/<name>.py``), paths
under ``results/`` (what runs write) and the files an addition creates are not checked.
"""

from __future__ import annotations

import functools
import re
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
WHOLE = ("README.md", "docs/architecture.md")
HOWTO = {  # doc -> headings of its how-to sections
    "docs/harness.md": ("## Adding a mode", "## Adding a metric", "## Your own model"),
    "docs/optimus.md": ("## Adding a rule",),
    "docs/models.md": ("## Adding a family",),
}
CREATED = {
    "optimus/rules/batch/batch_exp.py"
}  # the worked example's new file (tests/foundation/test_howto_rule.py)
TOP = ("optimus/", "models/", "harness/", "benchmarks/", "tests/", "docs/", "scripts/", "requirements/", ".ci/", ".github/")  # fmt: skip


@functools.cache
def _tracked() -> frozenset[str]:
    """Tracked files and every folder above one."""
    out = subprocess.run(["git", "ls-files"], cwd=ROOT, capture_output=True, text=True, check=True).stdout
    files = set(out.split())
    return frozenset(files | {str(parent) for f in files for parent in Path(f).parents})


def _section(text: str, heading: str) -> str:
    start = text.index(heading)
    nxt = text.find("\n## ", start + len(heading))
    return text[start : nxt if nxt >= 0 else len(text)]


def named_paths(text: str) -> set[str]:
    """Repository paths in backticks (``a/b.py``, ``a/b.py:NAME``, ``a/``)."""
    found = set()
    for m in re.finditer(r"`([A-Za-z0-9_./<>:-]+)`", text):
        p = m.group(1).split(":")[0].rstrip("/")
        if p.startswith(TOP) or p + "/" in TOP:
            found.add(p)
    return {p for p in found if "<" not in p}


def _cases() -> list[tuple[str, str]]:
    cases = []
    for doc in WHOLE:
        cases += [(doc, p) for p in named_paths((ROOT / doc).read_text())]
    for doc, headings in HOWTO.items():
        text = (ROOT / doc).read_text()
        for h in headings:
            assert h in text, f"{doc}: no section {h!r}"
            cases += [(doc, p) for p in named_paths(_section(text, h))]
    return sorted(set(cases))


def test_the_docs_name_paths_at_all() -> None:
    assert len(_cases()) > 40  # the checks below check something


@pytest.mark.parametrize(("doc", "path"), _cases())
def test_named_path_exists(doc: str, path: str) -> None:
    if path in CREATED:
        assert not (ROOT / path).exists(), f"{path} is the example's new file; it must not exist already"
        return
    assert path in _tracked(), f"{doc} names {path}, which is not a tracked file or folder"
