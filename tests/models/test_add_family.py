"""docs/models.md "Adding a family", performed on a scratch copy of `models/`: one new file plus
one line in models/registry.py is a working family, and a family file missing a part fails at
`import models` with a line naming the file."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import textwrap
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def scratch_with_family(tmp_path: Path, family_source: str) -> Path:
    """A copy of models/ with models/wide.py = ``family_source`` and "wide" added to the registry."""
    shutil.copytree(ROOT / "models", tmp_path / "models", ignore=shutil.ignore_patterns("__pycache__"))
    (tmp_path / "models" / "wide.py").write_text(family_source)
    registry = tmp_path / "models" / "registry.py"
    text = registry.read_text()
    assert '    "mmoe",\n)' in text, "registry.NAMES no longer ends with mmoe: update this test and the docs"
    registry.write_text(text.replace('    "mmoe",\n)', '    "mmoe",\n    "wide",\n)'))
    return tmp_path


def run_in(root: Path, code: str) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "PYTHONPATH": str(root)}
    return subprocess.run(
        [sys.executable, "-c", textwrap.dedent(code)], cwd=root, env=env, capture_output=True, text=True,
        timeout=300,
    )  # fmt: skip


def test_one_file_and_one_registry_line_make_a_family(tmp_path: Path) -> None:
    towers = (ROOT / "models" / "towers.py").read_text()
    root = scratch_with_family(tmp_path, towers.replace("tower_dim=16", "tower_dim=24"))
    r = run_in(
        root,
        """
        import os, models
        assert models.__file__.startswith(os.getcwd()), models.__file__  # the scratch copy
        assert models.FAMILIES[-1] == "wide", models.FAMILIES
        b = models.build("wide", "small", seed=0, count_nodes=False)
        logits = b.module(*b.batches[0].inputs)
        b.loss(logits, b.batches[0].labels).backward()
        t = models.build("towers", "small", seed=0, count_nodes=False)
        print(b.meta["config"]["tower_dim"], t.meta["config"]["tower_dim"], tuple(logits.shape))
        """,
    )
    assert r.returncode == 0, r.stderr[-3000:]
    assert r.stdout.split() == ["24", "16", "(128,", "2)"]


def test_a_family_file_missing_a_scale_fails_at_import(tmp_path: Path) -> None:
    towers = (ROOT / "models" / "towers.py").read_text()
    start = towers.index('    "xl": dict(')
    end = towers.index("}  # fmt: skip", start)
    root = scratch_with_family(tmp_path, towers[:start] + towers[end:])
    r = run_in(root, "import models")
    assert r.returncode != 0
    assert "models/wide.py: PRESETS lacks scales ['xl']" in r.stderr.strip().splitlines()[-1]
