"""The catalog behind `optimus-bench models`: one row of metadata per (family, scale).

Why no real build by default: listing xl must not allocate its tables or train anything. Rows
come from the meta-device analysis (exact parameter counts, estimated FLOPs and memory); the
dense-arch node count needs a Dynamo capture (seconds for large/xl), so it is opt-in
(`nodes=True`), done on meta tensors, and memoised per process.
"""

from __future__ import annotations

import argparse
import functools
import os
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Any

from models import analysis, capture, memory, presets, sparse
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
        "embedding_dim": lay.embedding_dim,
        "batch_size": cfg["batch_size"],
        "num_tasks": cfg["num_tasks"],
        "params": info.dense_params + lay.num_tables * lay.rows_per_table * lay.embedding_dim,
        "dense_params": info.dense_params,
        "embedding_bytes": lay.embedding_bytes,
        "dense_nodes": None,
        "flops_per_sample": info.flops_per_sample,
        "est_train_bytes": memory.estimate_bytes(cfg, lay, info),
    }


def row(family_name: str, scale: str, nodes: bool = False) -> dict[str, Any]:
    """Metadata of one preset, computed without allocating it (memoised per process)."""
    out = dict(_row(family_name, scale))
    if nodes:
        out["dense_nodes"] = dense_nodes(family_name, scale)
    return out


def rows(
    nodes: bool = False, families: Iterable[str] = FAMILIES, scales: Iterable[str] = presets.SCALES
) -> list[dict[str, Any]]:
    """One row per (family, scale); `nodes=True` fills dense_nodes (Dynamo capture, slower)."""
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
        tmp = path.with_suffix(path.suffix + ".tmp")
        tmp.write_text(new)
        os.replace(tmp, path)


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description="Print the model presets table.")
    parser.add_argument("--no-nodes", action="store_true", help="skip the Dynamo capture (fast)")
    parser.add_argument("--write-docs", action="store_true", help="update docs/models.md and presets.py")
    args = parser.parse_args(argv)
    table = format_table(rows(nodes=not args.no_nodes))
    print(table)
    if args.write_docs:
        root = Path(__file__).resolve().parents[1]
        write_docs(table, [root / "docs" / "models.md", root / "models" / "presets.py"])
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
