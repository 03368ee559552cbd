"""The typed record of one cell, validated when a results file is loaded.

Why typed: a cell used to be a dict assembled by four modules and read by ten, so a missing or
mistyped field surfaced as a KeyError far from the file that held it. ``CellRecord.from_dict``
checks every field of schema 1 (``harness.store.results``) and every metric of
``harness.metric_registry`` and raises one line naming the file, the cell and the field. The
results file stays plain JSON: ``to_dict`` gives back the same dict (unknown fields kept in
``extra``), so files written before this record load unchanged.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

from harness import metric_registry
from harness.modes import mode_registry
from harness.spec import PHASES, STATUSES, CellKey

_NUM = (int, float)
# field -> (allowed types, may be None); every one must be present (schema 1)
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


def _fail(where: str, msg: str) -> ResultsError:
    return ResultsError(f"{where}: {msg}")


def non_finite(value: Any, where: str) -> str | None:
    """The path of the first NaN/inf number inside ``value`` (dicts and lists walked), or None."""
    if isinstance(value, float) and not math.isfinite(value):
        return where
    if isinstance(value, dict):
        for k, v in value.items():
            found = non_finite(v, f"{where}.{k}")
            if found:
                return found
    elif isinstance(value, list):
        for i, v in enumerate(value):
            found = non_finite(v, f"{where}[{i}]")
            if found:
                return found
    return None


@dataclass(frozen=True)
class Latency:
    median: float
    iqr: float
    samples: tuple[float, ...]


@dataclass(frozen=True)
class CellRecord:
    """One cell of a results file; ``metrics`` holds every registered metric it records."""

    key: CellKey
    status: str
    error: str | None
    latency: Latency | None
    metrics: dict[str, Any] = field(default_factory=dict)
    raw: dict[str, Any] = field(default_factory=dict, repr=False)  # the dict it was read from

    @staticmethod
    def from_dict(cell: Any, where: str = "cell") -> CellRecord:
        """Validate ``cell`` (a parsed JSON object) or raise ResultsError naming the bad field."""
        _check(cell, where)
        lat = cell["latency_ms"]
        latency = None if lat is None else Latency(lat["median"], lat["iqr"], tuple(lat["samples"]))
        metrics = {m.name: cell.get(m.name) for m in metric_registry.metrics() if m.name in cell}
        return CellRecord(CellKey.of(cell), cell["status"], cell["error"], latency, metrics, cell)

    def to_dict(self) -> dict[str, Any]:
        return dict(self.raw)

    def value(self, metric: str) -> Any:
        """The figure of a registered metric (latency: the median), None when not recorded."""
        return metric_registry.get(metric).value(self.raw)


def empty(key: CellKey) -> dict[str, Any]:
    """A failed cell with every schema field and every metric present and null (the cell
    subprocess fills it in)."""
    cell: dict[str, Any] = {name: None for name in CELL_FIELDS}
    cell.update({m.name: None for m in metric_registry.judged()})
    cell.update(
        {"model": key.model, "scale": key.scale, "mode": key.mode, "phase": key.phase, "status": "failed"}
    )
    return cell


def _check(cell: Any, where: str) -> None:
    if not isinstance(cell, dict):
        raise _fail(where, f"must be an object, got {type(cell).__name__}")
    bad = non_finite(cell, where)
    if bad:
        raise NonFiniteError(f"{bad}: must be a finite number, got a non-finite value (NaN or inf)")
    for name, (types, nullable) in CELL_FIELDS.items():
        if name not in cell:
            raise _fail(where, f"missing field {name!r}")
        _check_type(cell[name], types, nullable, f"{where}.{name}")
    for m in metric_registry.judged():  # metrics added after schema 1 may be absent (older files)
        if m.name not in CELL_FIELDS and m.name in cell:
            _check_type(cell[m.name], _NUM, True, f"{where}.{m.name}")
    _check_choice(cell, "mode", mode_registry.names(), where)
    _check_choice(cell, "phase", PHASES, where)
    _check_choice(cell, "status", STATUSES, where)
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


def _check_type(v: Any, types: tuple[type, ...], nullable: bool, where: str) -> None:
    if v is None:
        if not nullable:
            raise _fail(where, "must not be null")
        return
    if isinstance(v, bool) or not isinstance(v, types):
        raise _fail(where, f"has type {type(v).__name__}, expected {types[0].__name__}")


def _check_choice(cell: dict[str, Any], name: str, allowed: tuple[str, ...], where: str) -> None:
    if cell[name] not in allowed:
        raise _fail(f"{where}.{name}", f"unknown {cell[name]!r}; allowed values: {', '.join(allowed)}")


SCHEMA = 1
KIND = "optimus-bench-results"


def validate_cell(cell: Any, where: str) -> None:
    """Raise ResultsError naming the field when ``cell`` is not a valid cell (``CellRecord``)."""
    CellRecord.from_dict(cell, where)


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
