"""docs/models.md "Adding a family", performed on a scratch copy of the whole repository, then
run through the harness.

Why beside tests/models/test_add_family.py (which builds the family in a copy of ``models/``):
the doc says nothing outside ``models/`` changes, so the harness must pick the new family up by
itself. The new family is towers with another tower width (its file is towers.py with one
preset value changed: the doc's "one file"), plus its name in ``registry.NAMES`` (the doc's
"one line"); the harness runs it through the provider that needs no torchrec.
"""

from __future__ import annotations

import json
from pathlib import Path

import scratch_repo


def test_add_a_family_as_the_doc_says(tmp_path: Path) -> None:
    repo = scratch_repo.copy_repo(tmp_path / "repo")
    towers = (repo / "models/towers.py").read_text()
    tiny = '"tiny": dict(num_sparse_features=4, tower_layers=2, tower_dim=8,'
    assert tiny in towers, "towers.py's tiny preset changed: update this test's one-value edit"
    (repo / "models/wide.py").write_text(towers.replace(tiny, tiny.replace("tower_dim=8", "tower_dim=12")))
    scratch_repo.insert_after(repo / "models/registry.py", '"mmoe",', '"wide",')

    out = repo / "results" / "wide.json"
    listed, ran = scratch_repo.cli(
        repo,
        ["models", "--scales", "tiny"],
        ["run", "--provider", "models.dense_only:build", "--models", "wide,towers", "--scale", "tiny",
         "--modes", "eager", "--phases", "infer", "--warmup", "1", "--min-iters", "3", "--max-iters", "5",
         "--budget-s", "0.1", "--no-progress", "--out", str(out)],
    )  # fmt: skip
    assert listed["rc"] == 0, listed
    assert any(
        line.split("|")[1].strip() == "wide" for line in str(listed["stdout"]).splitlines() if "|" in line
    )
    assert ran["rc"] == 0, ran
    cells = {c["model"]: c for c in json.loads(out.read_text())["cells"]}
    assert {m: c["status"] for m, c in cells.items()} == {"wide": "ok", "towers": "ok"}
    # the new family is its own model, not towers under another name
    assert cells["wide"]["meta"]["dense_params"] > cells["towers"]["meta"]["dense_params"]
