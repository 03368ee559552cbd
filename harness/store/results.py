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

Extra fields are allowed anywhere; renaming or removing one needs a new SCHEMA. The models that
say this, and validate it, are ``harness.store.cell_record``'s; ``docs/results.schema.json`` is
their JSON Schema (``python -m harness.store.results_schema`` writes it).
"""

from __future__ import annotations

import json
import os
import re
from pathlib import Path
from typing import Any

from harness.spec import CellKey
from harness.store.cell_record import (
    CELL_FIELDS,
    KIND,
    LATENCY_FIELDS,
    SCHEMA,
    CellRecord,
    NonFiniteError,
    ResultsError,
    validate,
)
from optimus.atomic import write_atomic

# The cell fields, the validation of a document and the error classes live with the typed cell record.
__all__ = ["CELL_FIELDS", "LATENCY_FIELDS", "NonFiniteError", "ResultsError", "load", "records", "validate"]


def new_results(env: dict[str, Any], config: dict[str, Any]) -> dict[str, Any]:
    return {"schema": SCHEMA, "kind": KIND, "env": env, "config": config, "cells": []}


def load(path: str | os.PathLike[str]) -> dict[str, Any]:
    """Read and validate a results file; ``HISTORY.jsonl:N`` is night N of a nightly history
    (``harness.store.history_store``; -1 is the last night)."""
    m = re.fullmatch(r"(.+\.jsonl):(-?\d+)", str(path))
    if m:
        from harness.store import history_store

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


def records(doc: dict[str, Any]) -> list[CellRecord]:
    """The cells of a validated document as typed records."""
    return [CellRecord.from_dict(c, f"cells[{i}]") for i, c in enumerate(doc["cells"])]


def cell_map(doc: dict[str, Any]) -> dict[CellKey, dict[str, Any]]:
    return {CellKey.of(c): c for c in doc["cells"]}
