"""The catalog behind `optimus-bench models`: one row of metadata per (family, scale).

Why no real build: listing xl must not allocate its tables or train anything. Rows come from the
meta-device analysis (exact parameter counts, estimated FLOPs and memory). The dense-arch node
count needs a Dynamo capture (10-35 s each for large/xl), so by default it is read from
models/dense_nodes.json, written by `python -m models.catalog --write-docs` with a fingerprint
of each preset's config and the torch version (a stale entry reads as None, never as a wrong
count); `nodes=True` captures afresh on meta tensors.
"""

from __future__ import annotations

import argparse
import functools
import hashlib
import json
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Any

import torch

from models import analysis, capture, presets, sparse
from models.registry import FAMILIES

COLUMNS: tuple[tuple[str, str], ...] = (
    ("family", "family"),
    ("scale", "scale"),
    ("num_features", "sparse feats"),
    ("num_dense_features", "dense feats"),
    ("num_tables", "tables"),
    ("rows_per_table", "rows/table"),
    ("embedding_dim", "emb dim"),
    ("batch_size", "batch"),
    ("num_tasks", "tasks"),
    ("params", "params"),
    ("embedding_bytes", "emb bytes"),
    ("dense_nodes", "dense nodes"),
    ("flops_per_sample", "FLOPs/sample"),
    ("est_train_bytes", "est. train mem"),
)


@functools.cache
def dense_nodes(family_name: str, scale: str) -> int:
    """Node count of the Dynamo capture of the preset's dense arch, captured on meta tensors."""
    cfg = presets.resolve(family_name, scale)
    lay = sparse.layout(cfg)
    dense = analysis.build_dense_on_meta(family_name, cfg, lay)
    return capture.count_dense_nodes(dense, analysis.meta_inputs(cfg, lay))


@functools.cache
def _row(family_name: str, scale: str) -> dict[str, Any]:
    cfg = presets.resolve(family_name, scale)
    lay = sparse.layout(cfg)
    info = analysis.analyse(family_name, cfg, lay)
    return {
        "family": family_name,
        "scale": scale,
        "num_features": lay.num_features,
        "num_dense_features": cfg["num_dense_features"],
        "num_tables": lay.num_tables,
        "rows_per_table": lay.rows_per_table,
        "embedding_dim": f"{min(lay.dims)}-{max(lay.dims)}" if lay.table_dims else lay.embedding_dim,
        "batch_size": cfg["batch_size"],
        "num_tasks": cfg["num_tasks"],
        "params": info.dense_params + lay.rows_per_table * sum(lay.dims),
        "dense_params": info.dense_params,
        "embedding_bytes": lay.embedding_bytes,
        "dense_nodes": None,
        "flops_per_sample": info.flops_per_sample,
        "est_train_bytes": analysis.estimate_bytes(cfg, lay, info),
    }


NODE_CACHE = Path(__file__).with_name("dense_nodes.json")


def config_key(family_name: str, scale: str) -> str:
    """Fingerprint of a preset's config and the torch version: a stored count is valid only for both."""
    cfg = presets.resolve(family_name, scale)
    blob = json.dumps({"family": family_name, "config": cfg, "torch": torch.__version__}, sort_keys=True)
    return hashlib.sha256(blob.encode()).hexdigest()[:16]


@functools.cache
def _stored_counts() -> dict[str, dict[str, Any]]:
    try:
        return dict(json.loads(NODE_CACHE.read_text()))
    except (OSError, ValueError):
        return {}


def stored_dense_nodes(family_name: str, scale: str) -> int | None:
    """The count stored in models/dense_nodes.json if it is for this config and torch, else None."""
    entry = _stored_counts().get(f"{family_name}/{scale}")
    if entry and entry.get("key") == config_key(family_name, scale):
        return int(entry["dense_nodes"])
    return None


def row(family_name: str, scale: str, nodes: bool | None = None) -> dict[str, Any]:
    """Metadata of one preset, computed without allocating it (memoised per process).

    `nodes=None`: dense_nodes from models/dense_nodes.json when it matches this config and torch
    version, else None; `True`: a fresh Dynamo capture (seconds for large/xl); `False`: None.
    """
    out = dict(_row(family_name, scale))
    if nodes is None:
        out["dense_nodes"] = stored_dense_nodes(family_name, scale)
    elif nodes:
        out["dense_nodes"] = dense_nodes(family_name, scale)
    return out


def store_dense_nodes(table_rows: Iterable[dict[str, Any]], path: Path = NODE_CACHE) -> None:
    """Write captured counts with their config fingerprints (atomic)."""
    data = {
        f"{r['family']}/{r['scale']}": {
            "key": config_key(r["family"], r["scale"]),
            "dense_nodes": r["dense_nodes"],
        }
        for r in table_rows
        if r["dense_nodes"] is not None
    }
    from optimus.atomic import write_atomic  # the one atomic writer; imported late (optimus is big)

    write_atomic(path, json.dumps(data, indent=1, sort_keys=True) + "\n")
    _stored_counts.cache_clear()


def rows(
    nodes: bool | None = None, families: Iterable[str] = FAMILIES, scales: Iterable[str] = presets.SCALES
) -> list[dict[str, Any]]:
    """One row per (family, scale); see `row` for `nodes` (default: stored counts, instant)."""
    scales = tuple(scales)
    return [row(f, s, nodes) for f in families for s in scales]


def _human(value: Any, key: str) -> str:
    if value is None:
        return "-"
    if key.endswith("bytes"):
        for unit, size in (("GiB", 1024**3), ("MiB", 1024**2), ("KiB", 1024)):
            if value >= size:
                return f"{value / size:.1f} {unit}"
        return f"{value} B"
    if key in ("params", "flops_per_sample") and isinstance(value, int):
        for unit, size in (("G", 10**9), ("M", 10**6), ("K", 10**3)):
            if value >= size:
                return f"{value / size:.2f}{unit}"
    return str(value)


def format_table(rows: Sequence[dict[str, Any]]) -> str:
    """A markdown table (also readable as plain text) of catalog rows."""
    header = "| " + " | ".join(title for _, title in COLUMNS) + " |"
    rule = "|" + "|".join(" --- " for _ in COLUMNS) + "|"
    lines = [header, rule]
    for r in rows:
        lines.append("| " + " | ".join(_human(r.get(key), key) for key, _ in COLUMNS) + " |")
    return "\n".join(lines)


def write_docs(table: str, paths: Iterable[Path]) -> None:
    """Replace the text between PRESET_TABLE_BEGIN / PRESET_TABLE_END markers (atomic write)."""
    for path in paths:
        text = path.read_text()
        begin, end = text.index("PRESET_TABLE_BEGIN\n"), text.index("PRESET_TABLE_END")
        new = text[: begin + len("PRESET_TABLE_BEGIN\n")] + table + "\n" + text[end:]
        from optimus.atomic import write_atomic

        write_atomic(path, new)


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description="Print the model presets table.")
    parser.add_argument("--capture", action="store_true", help="fresh Dynamo captures (minutes)")
    parser.add_argument(
        "--write-docs",
        action="store_true",
        help="capture, then update docs/models.md, the presets docstring and models/dense_nodes.json",
    )
    args = parser.parse_args(argv)
    table_rows = rows(nodes=True if (args.capture or args.write_docs) else None)
    table = format_table(table_rows)
    print(table)
    if args.write_docs:
        root = Path(__file__).resolve().parents[1]
        write_docs(table, [root / "docs" / "models.md", root / "models" / "presets.py"])
        store_dense_nodes(table_rows)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
