"""docs/results.schema.json is the models' JSON Schema, and says what the loader accepts."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from harness.store import cell_record, results_schema
from tests.harness import synthetic


def test_committed_schema_matches_the_models() -> None:
    committed = results_schema.SCHEMA_FILE.read_text(encoding="utf-8")
    assert committed == results_schema.render(), (
        "docs/results.schema.json is stale: run python -m harness.store.results_schema"
    )


def test_check_command(tmp_path: Path) -> None:
    out = tmp_path / "s.json"
    assert results_schema.main(["--check", "--out", str(out)]) == 1
    assert results_schema.main(["--out", str(out)]) == 0
    assert results_schema.main(["--check", "--out", str(out)]) == 0
    assert json.loads(out.read_text())["$schema"] == results_schema.DIALECT


def test_schema_names_the_file_format() -> None:
    schema = results_schema.results_json_schema()
    assert schema["required"][:2] == ["schema", "kind"]
    assert schema["properties"]["schema"]["const"] == cell_record.SCHEMA == 1
    assert schema["properties"]["kind"]["const"] == cell_record.KIND
    cell = schema["$defs"]["Cell"]
    assert set(cell_record.CELL_FIELDS) <= set(cell["required"])
    assert cell["properties"]["phase"]["enum"] == ["infer", "train"]
    latency = schema["$defs"]["Latency"]
    assert latency["required"] == ["median", "iqr", "samples"]
    assert latency["properties"]["median"]["type"] == "number"


def test_a_registered_metric_is_in_the_model_and_the_schema() -> None:
    from harness import metric_registry

    metric_registry.register(metric_registry.Metric("p90_ms", "ms", rel=0.10, rel_key="p90"))
    try:
        assert "p90_ms" in results_schema.results_json_schema()["$defs"]["Cell"]["properties"]
        doc = synthetic.doc([synthetic.cell("towers", "compile", "infer", 5.0, seed=1)])
        cell_record.validate(doc)  # older files without it still load
        doc["cells"][0]["p90_ms"] = "5.5"
        with pytest.raises(cell_record.ResultsError) as e:
            cell_record.validate(doc, "x.json")
        assert str(e.value) == "x.json: cells[0].p90_ms: has type str, must be a number"
    finally:
        metric_registry.unregister("p90_ms")
    assert "p90_ms" not in results_schema.results_json_schema()["$defs"]["Cell"]["properties"]


def test_every_committed_results_file_and_history_loads() -> None:
    """The models accept every file the harness wrote before them (the format did not change)."""
    import warnings

    from harness.env import REPO_ROOT
    from harness.store import history_store, results

    loaded = 0
    for path in sorted((REPO_ROOT / "results").rglob("*.json")):
        doc = json.loads(path.read_text(encoding="utf-8"))
        if isinstance(doc, dict) and doc.get("kind") == cell_record.KIND:
            assert results.load(path) == doc
            loaded += 1
    assert loaded >= 20
    histories = sorted((REPO_ROOT / "results").rglob("*.jsonl"))
    assert histories
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        for path in histories:
            assert history_store.read(path)
