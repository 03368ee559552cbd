"""The results file: versioned JSON schema, validation on load, atomic writes.

Why so strict: results files outlive the code that wrote them (nightly baselines, committed
reproduction runs). A truncated file, a file from another schema version or a hand edit
that drops a field must fail loudly with the path of the problem, not produce a quiet
"no regression". JSON only (never pickle), and every write is temp-file + fsync + rename,
so a run killed mid-write leaves the previous complete file behind.

Schema 1 (``SCHEMA``)::

    {"schema": 1, "kind": "optimus-bench-results",
     "env": {...},            # harness.env.collect_env()
     "config": {...},         # harness.spec.RunConfig.as_dict() plus "peer_options"
     "cells": [ {model, scale, mode, phase, status, error, latency_ms: {median, iqr, q1,
                 q3, n, samples}, peak_mem_bytes, compile_s, optimus_s, nodes_before,
                 nodes_after, max_abs_err, ...}, ... ]}

Extra fields are allowed anywhere; renaming or removing one needs a new SCHEMA.
"""

from __future__ import annotations

import json
import math
import os
import re
from pathlib import Path
from typing import Any

from harness.spec import MODES, PHASES, STATUSES, CellKey
from optimus.atomic import write_atomic  # the one atomic writer (re-exported here)

SCHEMA = 1
KIND = "optimus-bench-results"

_NUM = (int, float)
# field -> (allowed types, may be None)
CELL_FIELDS: dict[str, tuple[tuple[type, ...], bool]] = {
    "model": ((str,), False),
    "scale": ((str,), False),
    "mode": ((str,), False),
    "phase": ((str,), False),
    "status": ((str,), False),
    "error": ((str,), True),
    "latency_ms": ((dict,), True),
    "peak_mem_bytes": (_NUM, True),
    "compile_s": (_NUM, True),
    "optimus_s": (_NUM, True),
    "nodes_before": ((int,), True),
    "nodes_after": ((int,), True),
    "max_abs_err": (_NUM, True),
}
LATENCY_FIELDS = ("median", "iqr", "samples")


class ResultsError(ValueError):
    """A results file that cannot be trusted; the message names the file and the field."""


class NonFiniteError(ResultsError):
    """A figure in a results file is NaN or infinite: the run recorded garbage, not a measurement.

    Its own class so the gate can answer it as lost data (exit INCOMPLETE), not as bad input."""


def _non_finite(value: Any, where: str) -> str | None:
    """The path of the first NaN/inf number inside ``value`` (dicts and lists walked), or None."""
    if isinstance(value, float) and not math.isfinite(value):
        return where
    if isinstance(value, dict):
        for k, v in value.items():
            found = _non_finite(v, f"{where}.{k}")
            if found:
                return found
    elif isinstance(value, list):
        for i, v in enumerate(value):
            found = _non_finite(v, f"{where}[{i}]")
            if found:
                return found
    return None


def new_results(env: dict[str, Any], config: dict[str, Any]) -> dict[str, Any]:
    return {"schema": SCHEMA, "kind": KIND, "env": env, "config": config, "cells": []}


def _fail(where: str, msg: str) -> ResultsError:
    return ResultsError(f"{where}: {msg}")


def validate_cell(cell: Any, where: str) -> None:
    if not isinstance(cell, dict):
        raise _fail(where, f"must be an object, got {type(cell).__name__}")
    bad = _non_finite(cell, where)
    if bad:
        raise NonFiniteError(f"{bad}: must be a finite number, got a non-finite value (NaN or inf)")
    for name, (types, nullable) in CELL_FIELDS.items():
        if name not in cell:
            raise _fail(where, f"missing field {name!r}")
        v = cell[name]
        if v is None:
            if not nullable:
                raise _fail(f"{where}.{name}", "must not be null")
            continue
        if isinstance(v, bool) or not isinstance(v, types):
            raise _fail(f"{where}.{name}", f"has type {type(v).__name__}, expected {types[0].__name__}")
        if isinstance(v, float) and not math.isfinite(v):
            raise _fail(f"{where}.{name}", f"must be finite, got {v}")
    if cell["mode"] not in MODES:
        raise _fail(f"{where}.mode", f"unknown {cell['mode']!r}; allowed values: {', '.join(MODES)}")
    if cell["phase"] not in PHASES:
        raise _fail(f"{where}.phase", f"unknown {cell['phase']!r}; allowed values: {', '.join(PHASES)}")
    if cell["status"] not in STATUSES:
        raise _fail(f"{where}.status", f"unknown {cell['status']!r}; allowed values: {', '.join(STATUSES)}")
    if cell["status"] != "ok" and not cell["error"]:
        raise _fail(f"{where}.error", f"status {cell['status']!r} needs an error message")
    lat = cell["latency_ms"]
    if cell["status"] == "ok" and lat is None:
        raise _fail(f"{where}.latency_ms", "an ok cell needs latency samples")
    if lat is not None:
        for name in LATENCY_FIELDS:
            if name not in lat:
                raise _fail(f"{where}.latency_ms", f"missing field {name!r}")
        samples = lat["samples"]
        if not isinstance(samples, list) or not all(
            isinstance(s, _NUM) and not isinstance(s, bool) and math.isfinite(s) and s >= 0 for s in samples
        ):
            raise _fail(f"{where}.latency_ms.samples", "must be a list of finite numbers >= 0 (milliseconds)")
        if not samples:
            raise _fail(f"{where}.latency_ms.samples", "is empty")


def validate(doc: Any, source: str = "results") -> dict[str, Any]:
    """Check a parsed results document; return it, or raise ResultsError naming the problem."""
    if not isinstance(doc, dict):
        raise _fail(source, f"top level must be a JSON object, got {type(doc).__name__}")
    if doc.get("kind") != KIND:
        raise _fail(
            source, f"not an optimus-bench results file (kind={doc.get('kind')!r}, expected {KIND!r})"
        )
    version = doc.get("schema")
    if version != SCHEMA:
        raise _fail(
            source,
            f"schema version {version!r} is not supported; this harness reads schema {SCHEMA} "
            "(re-run the benchmark or use the harness version that wrote it)",
        )
    for key in ("env", "config"):
        if not isinstance(doc.get(key), dict):
            raise _fail(source, f"field {key!r} must be an object")
    for key in ("git", "versions"):  # read as objects by report, nightly and the history store
        v = doc["env"].get(key)
        if v is not None and not isinstance(v, dict):
            raise _fail(f"{source}: env.{key}", f"must be an object or null, got {type(v).__name__}")
    cells = doc.get("cells")
    if not isinstance(cells, list):
        raise _fail(source, "field 'cells' must be a list")
    seen: set[CellKey] = set()
    for i, cell in enumerate(cells):
        validate_cell(cell, f"{source}: cells[{i}]")
        ck = CellKey.of(cell)
        if ck in seen:
            raise _fail(f"{source}: cells[{i}]", f"duplicate cell {ck.label()}")
        seen.add(ck)
    return doc


def load(path: str | os.PathLike[str]) -> dict[str, Any]:
    """Read and validate a results file; ``HISTORY.jsonl:N`` is night N of a nightly history
    (``harness.history_store``; -1 is the last night)."""
    m = re.fullmatch(r"(.+\.jsonl):(-?\d+)", str(path))
    if m:
        from harness import history_store

        try:
            return history_store.night_results(m.group(1), int(m.group(2)))
        except history_store.HistoryError as e:
            raise ResultsError(str(e)) from None
    p = Path(path)
    try:
        text = p.read_text(encoding="utf-8")
    except FileNotFoundError:
        raise ResultsError(f"{p}: no such results file") from None
    except IsADirectoryError:
        raise ResultsError(f"{p}: is a directory, not a results file") from None
    except UnicodeDecodeError as e:
        raise ResultsError(f"{p}: not a results file (not UTF-8 text: {e.reason})") from None
    except OSError as e:
        raise ResultsError(f"{p}: cannot read ({e.strerror or e})") from None
    try:
        doc = json.loads(text)
    except json.JSONDecodeError as e:
        raise ResultsError(f"{p}: corrupt results file (not valid JSON: {e})") from None
    return validate(doc, str(p))


def save_atomic(path: str | os.PathLike[str], doc: dict[str, Any]) -> None:
    """Validate, then write ``doc`` atomically (see ``write_atomic``)."""
    validate(doc, str(path))
    write_atomic(path, json.dumps(doc, indent=1, allow_nan=False) + "\n")


def upsert_cell(doc: dict[str, Any], cell: dict[str, Any]) -> None:
    """Replace the cell with the same key, or append it."""
    key = CellKey.of(cell)
    cells = doc["cells"]
    for i, c in enumerate(cells):
        if CellKey.of(c) == key:
            cells[i] = cell
            return
    cells.append(cell)


def cell_map(doc: dict[str, Any]) -> dict[CellKey, dict[str, Any]]:
    return {CellKey.of(c): c for c in doc["cells"]}
