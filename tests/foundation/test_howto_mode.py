"""docs/harness.md "Adding a mode", performed on a scratch copy of the repository.

Why: the how-to is what a newcomer follows first; this test applies exactly the snippet the doc
shows (read out of the doc) at the place the doc names, then runs the real commands in the copy.
If the doc's code stops working, or the registry stops being the one place a mode is defined,
the new mode is missing from the run, compare or report below and the test fails.
"""

from __future__ import annotations

import json
from pathlib import Path

import scratch_repo


def test_add_a_mode_as_the_doc_says(tmp_path: Path) -> None:
    repo = scratch_repo.copy_repo(tmp_path / "repo")
    scratch_repo.append(
        repo / "harness/modes/mode_registry.py", scratch_repo.snippet("docs/harness.md", "mode-registry")
    )

    out = str(repo / "results" / "howto.json")
    helped, ran, compared, reported = scratch_repo.cli(
        repo,
        ["run", "--help"],  # shows the default --modes: every registered mode
        [*scratch_repo.HARNESS_RUN, "--modes", "eager,eager+noop", "--out", out],
        ["compare", out, out],
        ["report", out],
    )
    assert helped["rc"] == 0 and ",eager+noop)" in "".join(str(helped["stdout"]).split()), helped
    assert ran["rc"] == 0, ran
    cells = json.loads(Path(out).read_text())["cells"]
    assert sorted((c["mode"], c["status"]) for c in cells) == [("eager", "ok"), ("eager+noop", "ok")]
    assert compared["rc"] == 0, compared
    assert "towers/small/eager+noop/infer | latency_ms" in str(compared["stdout"])
    assert reported["rc"] == 0, reported
    assert "| model | scale | eager | eager+noop |" in (repo / "results" / "howto.md").read_text()
    assert (repo / "results" / "howto_latency.png").stat().st_size > 0
