"""The catalog behind `optimus-bench models`: rows agree with real builds; the table prints them."""

from __future__ import annotations

import models
from models import catalog


def test_rows_agree_with_a_real_build(tiny: models.Built) -> None:
    (row,) = catalog.rows(nodes=True, families=[tiny.meta["family"]], scales=["tiny"])
    for key in ("params", "embedding_bytes", "dense_nodes", "flops_per_sample", "num_tables", "batch_size"):
        assert row[key] == tiny.meta[key], key
    assert row["num_features"] == tiny.meta["num_features"]


def test_rows_cover_every_family_and_scale_without_nodes() -> None:
    got = catalog.rows(nodes=False, scales=["tiny", "small"])
    assert [(r["family"], r["scale"]) for r in got] == [
        (f, s) for f in models.FAMILIES for s in ("tiny", "small")
    ]
    assert all(r["dense_nodes"] is None for r in got)
    small = [r for r in got if r["scale"] == "small"]
    assert all(r["params"] > 100 * t["params"] for r, t in zip(small, got[::2], strict=True))


def test_format_table_has_a_line_per_row() -> None:
    got = catalog.rows(nodes=True, families=["towers"], scales=["tiny"]) + catalog.rows(
        nodes=False, families=["dcn"], scales=["small"]
    )
    lines = catalog.format_table(got).splitlines()
    assert len(lines) == 2 + len(got)
    assert lines[0].startswith("| family | scale |") and "dense nodes" in lines[0]
    assert lines[2].startswith("| towers | tiny |") and f"| {got[0]['dense_nodes']} |" in lines[2]
    assert lines[3].startswith("| dcn | small |") and "| - |" in lines[3]  # nodes not computed
    assert "MiB" in lines[3]


def test_write_docs_replaces_only_the_marked_table(tmp_path) -> None:  # type: ignore[no-untyped-def]
    doc = tmp_path / "doc.md"
    doc.write_text("intro\nPRESET_TABLE_BEGIN\nold | table\nPRESET_TABLE_END\noutro\n")
    catalog.write_docs("| new |", [doc])
    assert doc.read_text() == "intro\nPRESET_TABLE_BEGIN\n| new |\nPRESET_TABLE_END\noutro\n"


def test_stored_counts_are_used_only_for_their_config_and_torch(tmp_path, monkeypatch) -> None:  # type: ignore[no-untyped-def]
    path = tmp_path / "dense_nodes.json"
    monkeypatch.setattr(catalog, "NODE_CACHE", path)
    catalog._stored_counts.cache_clear()
    try:
        catalog.store_dense_nodes([{"family": "mmoe", "scale": "tiny", "dense_nodes": 12345}], path)
        assert catalog.row("mmoe", "tiny")["dense_nodes"] == 12345  # default: the stored count
        assert catalog.row("mmoe", "tiny", nodes=False)["dense_nodes"] is None
        assert catalog.row("dcn", "tiny")["dense_nodes"] is None  # nothing stored for dcn
        monkeypatch.setattr(catalog.torch, "__version__", "0.0.0-other")
        assert catalog.row("mmoe", "tiny")["dense_nodes"] is None  # stale: another torch
    finally:
        catalog._stored_counts.cache_clear()
