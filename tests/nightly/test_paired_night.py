"""The paired part of a night: its config section, the anchor it pairs with, and how a pair's
figures join tonight's cells (the measurement itself: tests/harness/run/test_paired.py and the
nightly end-to-end test)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from harness.nightly import job, paired_night
from harness.nightly.paired_night import PairedConfig
from harness.spec import CellKey

ROOT = Path(__file__).resolve().parents[2]


def night(sha: str, status: str = "pass", paired_base: str | None = None) -> dict[str, object]:
    return {"sha": sha, "status": status, "paired_base": paired_base, "results": f"runs/{sha}.json"}


def test_the_anchor_stays_for_anchor_nights_passing_nights_then_moves() -> None:
    runs = [night("a"), night("b", paired_base="a"), night("c", paired_base="a")]
    history = {"runs": runs}
    assert job.paired_anchor(history, runs[-1], 7) == "a"  # two passing nights since a
    assert job.paired_anchor(history, runs[-1], 2) == "c"  # the anchor has served its nights
    assert job.paired_anchor(history, runs[0], 7) == "a"  # a base without an anchor: itself


def test_a_creep_adds_up_against_the_anchor() -> None:
    """2% a night: each night against the one before stays at 1.02; against the anchor it grows."""
    levels = [1.02**i for i in range(5)]
    runs = [night("n0")]
    ratios = []
    for i in range(1, 5):
        anchor = job.paired_anchor({"runs": runs}, runs[-1], 7)
        ratios.append(levels[i] / levels[int(anchor[1:])])
        runs.append(night(f"n{i}", paired_base=anchor))
    assert ratios == pytest.approx([1.02, 1.0404, 1.061208, 1.08243216])


def test_a_night_that_regressed_is_not_counted_and_a_missing_anchor_falls_back() -> None:
    runs = [night("a"), night("b", status="regression", paired_base="a"), night("c", paired_base="a")]
    assert job.paired_anchor({"runs": runs}, runs[-1], 2) == "a"  # only c passed since a
    assert job.paired_anchor({"runs": runs[2:]}, runs[-1], 7) == "c"  # a is not in the history


def test_the_repository_config_has_a_paired_section() -> None:
    cfg = job.load_config(ROOT / "benchmarks" / "nightly_thresholds.json")
    assert cfg.paired.enabled and cfg.paired.measure.processes >= 2 and cfg.paired.measure.compiles >= 3


@pytest.mark.parametrize(
    ("section", "needle"),
    [({"rounds": 0}, "rounds"), ({"colour": 1}, "unknown field"), ({"threshold": -1}, "threshold"),
     ({"enabled": "yes"}, "enabled"), ({"max_processes": 1}, "max_processes")],
)  # fmt: skip
def test_bad_paired_sections_are_one_line(tmp_path: Path, section: dict[str, object], needle: str) -> None:
    doc = json.loads((ROOT / "benchmarks" / "nightly_thresholds.json").read_text())
    doc["paired"] = section
    path = tmp_path / "cfg.json"
    path.write_text(json.dumps(doc))
    with pytest.raises(ValueError, match=needle) as e:
        job.load_config(path)
    assert "\n" not in str(e.value)
    assert PairedConfig().threshold == 0.02


def test_merge_gives_cells_their_pair_and_a_failed_pair_fails_the_cell() -> None:
    key = {"model": "towers", "scale": "tiny", "mode": "compile", "phase": "infer"}
    other = {**key, "phase": "train"}
    tonight = {"cells": [{**key, "status": "ok", "error": None}, {**other, "status": "ok", "error": None}]}
    pairs = {"cells": [
        {**key, "status": "ok", "base_sha": "a", "new_sha": "b", "paired_ratio": 1.1, "paired_ci95": [1.05, 1.2],
         "paired": {"verdict": "slower"}},
        {**other, "status": "failed", "error": "new worker 0 hung", "base_sha": "a", "new_sha": "b",
         "paired_ratio": None, "paired_ci95": None},
    ]}  # fmt: skip
    paired_night.merge(tonight, pairs)
    first, second = tonight["cells"]
    assert first["paired_ratio"] == 1.1 and first["paired"]["verdict"] == "slower" and first["status"] == "ok"
    assert second["status"] == "failed" and "new worker 0 hung" in second["error"]
    cmd = paired_night.bisect_command("a" * 40, "b" * 40, CellKey.of(first), 0.02)
    assert (
        cmd == f"optimus-bench bisect {'a' * 12} {'b' * 12} --cell towers/tiny/compile/infer --threshold 0.02"
    )
