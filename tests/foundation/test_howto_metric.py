"""docs/harness.md "Adding a metric", performed on a scratch copy of the repository.

Why: the doc says a metric is one registry entry plus the line that measures it; this test
applies exactly those two snippets (read out of the doc) where the doc says, runs a real cell
and checks that the figure is recorded, validated on load, judged by ``compare`` and shown by
``report``. A third file needed anywhere shows up here as a missing row or grid.
"""

from __future__ import annotations

import json
from pathlib import Path

import scratch_repo


def test_add_a_metric_as_the_doc_says(tmp_path: Path) -> None:
    repo = scratch_repo.copy_repo(tmp_path / "repo")
    scratch_repo.append(
        repo / "harness/metric_registry.py", scratch_repo.snippet("docs/harness.md", "metric-registry")
    )
    scratch_repo.insert_after(
        repo / "harness/run/cell.py",
        'cell["latency_ms"] = timing.summarize(samples)',
        scratch_repo.snippet("docs/harness.md", "metric-cell"),
    )
    out = repo / "results" / "howto.json"
    (ran,) = scratch_repo.cli(repo, [*scratch_repo.HARNESS_RUN, "--modes", "eager", "--out", str(out)])
    assert ran["rc"] == 0, ran
    doc = json.loads(out.read_text())
    (cell,) = doc["cells"]
    assert cell["status"] == "ok", cell["error"]
    samples = cell["latency_ms"]["samples"]
    assert min(samples) <= cell["p90_ms"] <= max(samples)

    # the same run with only p90 doubled: compare must judge the new metric a regression (exit 1)
    cell["p90_ms"] *= 2
    slow = repo / "results" / "slow.json"
    slow.write_text(json.dumps(doc))
    same, gated, reported = scratch_repo.cli(
        repo, ["compare", str(out), str(out)], ["compare", str(out), str(slow)], ["report", str(out)]
    )
    assert same["rc"] == 0 and "towers/small/eager/infer | p90_ms" in str(same["stdout"]), same
    assert gated["rc"] == 1, gated
    flagged = [line for line in str(gated["stdout"]).splitlines() if "**regression**" in line]
    assert [line.split(" | ")[1] for line in flagged] == ["p90_ms"], gated
    assert reported["rc"] == 0, reported
    assert "### 90th percentile step latency, ms: infer" in (repo / "results" / "howto.md").read_text()
