"""Adding the floor to a run made before runs recorded it (harness/diagnose/floor_of_run.py): on
the committed tiny reference run, with its floor taken out, the backfill gives every cell the
floor the run itself recorded; bad input is one line and exit 2."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from harness import exit_codes
from harness.diagnose import floor_of_run
from harness.store import results

ROOT = Path(__file__).resolve().parents[3]
REFERENCE = ROOT / "results" / "tiny" / "reproduce-tiny.json"
FLOOR_FIELDS = ("floor", "floor_ms", "of_floor")


def _without_floor(tmp_path: Path, models: tuple[str, ...]) -> tuple[Path, dict]:
    doc = json.loads(REFERENCE.read_text())
    doc["cells"] = [c for c in doc["cells"] if c["model"] in models]
    recorded = {(c["model"], c["mode"], c["phase"]): c.get("floor_ms") for c in doc["cells"]}
    for c in doc["cells"]:
        for k in FLOOR_FIELDS:
            c.pop(k, None)
    doc["env"].pop("peaks")
    path = tmp_path / "old.json"
    path.write_text(json.dumps(doc))
    return path, recorded


def test_the_backfilled_floor_is_the_one_the_run_recorded(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    old, recorded = _without_floor(tmp_path, ("towers", "dlrm"))
    out = tmp_path / "new.json"
    rc = floor_of_run.main([str(old), "--peaks-from", str(REFERENCE), "--out", str(out)])
    assert rc == exit_codes.OK
    doc = results.load(out)
    assert doc["env"]["peaks"] == json.loads(REFERENCE.read_text())["env"]["peaks"]
    assert "floor_added" in doc["env"]
    ok = [c for c in doc["cells"] if c["status"] == "ok"]
    assert ok and len(ok) == sum(1 for v in recorded.values() if v is not None)
    for c in ok:
        want = recorded[(c["model"], c["mode"], c["phase"])]
        assert c["floor_ms"] == pytest.approx(want, rel=1e-6), c["model"]
        assert c["of_floor"] == pytest.approx(c["floor_ms"] / c["latency_ms"]["median"])
    assert "floor added to" in capsys.readouterr().out
    assert "floor_ms" not in json.loads(old.read_text())["cells"][0]  # the input is left as it was


def test_peaks_from_a_run_without_peaks_is_one_line_exit_2(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    old, _ = _without_floor(tmp_path, ("towers",))
    rc = floor_of_run.main([str(old), "--peaks-from", str(old), "--out", str(tmp_path / "x.json")])
    assert rc == exit_codes.BAD_INPUT
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "has no env.peaks" in err[0]
    assert not (tmp_path / "x.json").exists()
    rc = floor_of_run.main([str(tmp_path / "missing.json"), "--peaks-from", str(REFERENCE), "--out", str(tmp_path / "x.json")])  # fmt: skip
    assert rc == exit_codes.BAD_INPUT and "no such results file" in capsys.readouterr().err
