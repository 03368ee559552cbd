"""Results files: round trip, atomic writes, and clear rejection of corrupt or foreign files."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from harness.store import cell_record, results
from tests.harness import synthetic


def _doc() -> dict:
    return synthetic.doc([synthetic.cell("mlp", "compile", "infer", 2.0, seed=1)])


def test_round_trip(tmp_path: Path) -> None:
    doc = _doc()
    p = tmp_path / "r.json"
    results.save_atomic(p, doc)
    assert results.load(p) == doc
    assert not [f for f in tmp_path.iterdir() if f.name != "r.json"], "no temp files left behind"


def test_corrupt_file_is_rejected_with_clear_message(tmp_path: Path) -> None:
    p = tmp_path / "r.json"
    results.save_atomic(p, _doc())
    p.write_text(p.read_text()[:-40])  # truncated, as by a crash mid-write without atomicity
    with pytest.raises(results.ResultsError, match=r"r\.json: corrupt results file \(not valid JSON"):
        results.load(p)


def test_wrong_version_is_rejected(tmp_path: Path) -> None:
    doc = _doc()
    doc["schema"] = cell_record.SCHEMA + 1
    p = tmp_path / "r.json"
    p.write_text(json.dumps(doc))
    with pytest.raises(
        results.ResultsError, match=rf"schema version {cell_record.SCHEMA + 1} is not supported"
    ):
        results.load(p)


@pytest.mark.parametrize(
    ("mutate", "message"),
    [
        (lambda d: d.pop("kind"), "not an optimus-bench results file"),
        (lambda d: d["cells"][0].pop("status"), r"cells\[0\]: missing field 'status'"),
        (
            lambda d: d["cells"][0].update(mode="jit"),
            r"cells\[0\]\.mode: unknown 'jit'; allowed values: eager",
        ),
        (lambda d: d["cells"][0].update(status="broken"), r"cells\[0\]\.status: unknown 'broken'"),
        (lambda d: d["cells"][0].update(status="failed", error=None), "needs an error message"),
        (lambda d: d["cells"][0]["latency_ms"].update(samples=[]), "samples: is empty"),
        (
            lambda d: d["cells"][0]["latency_ms"].update(samples=["1"]),
            "samples: must be a list of finite numbers",
        ),
        (lambda d: d["cells"][0].update(compile_s="3"), r"cells\[0\]\.compile_s: has type str"),
        (lambda d: d["cells"].append(dict(d["cells"][0])), "duplicate cell mlp/tiny/compile/infer"),
        (lambda d: d.update(cells={}), "field 'cells' must be a list"),
    ],
)
def test_invalid_documents_name_the_problem(mutate, message: str) -> None:
    doc = _doc()
    mutate(doc)
    with pytest.raises(results.ResultsError, match=message):
        results.validate(doc, "x.json")


def test_failed_save_keeps_previous_file(tmp_path: Path) -> None:
    p = tmp_path / "r.json"
    good = _doc()
    results.save_atomic(p, good)
    bad = _doc()
    bad["cells"][0]["status"] = "nope"
    with pytest.raises(results.ResultsError):
        results.save_atomic(p, bad)
    assert results.load(p) == good


def test_missing_file(tmp_path: Path) -> None:
    with pytest.raises(results.ResultsError, match="no such results file"):
        results.load(tmp_path / "absent.json")
