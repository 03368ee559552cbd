"""The typed record of one cell and the results document, as pydantic models validated on load.

Why models: results files outlive the code that wrote them, and a hand-written check per field
let a string ``latency_ms.median`` through to the gate, which then ended in a ``TypeError``. The
models say once what schema 1 holds; pydantic (strict: no ``"3"`` read as 3, no ``true`` as 1,
no NaN) checks every field, and the JSON Schema of the file is generated from the same models
(``harness.store.results_schema``, committed as ``docs/results.schema.json``).

Metrics are registered at run time (``harness.metric_registry``), so the cell model is built from
the registry: every judged metric is a field (a number or null; latency-like metrics an object like
``latency_ms``), absent in older files. Modes are registered at run time too, so ``mode`` is
checked against the mode registry when a file is read.

Every problem is one line naming the file, the cell and the field (``describe``); a NaN or inf
anywhere in a cell is a ``NonFiniteError`` (lost data, not bad input). The file stays plain JSON:
validation never rewrites it, and ``CellRecord.to_dict`` gives back the dict it was read from.
"""

from __future__ import annotations

import math
from functools import cache
from typing import Annotated, Any, ClassVar

from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    PrivateAttr,
    ValidationError,
    create_model,
    field_validator,
    model_validator,
)
from pydantic_core import ErrorDetails

from harness import metric_registry
from harness.modes import mode_registry
from harness.spec import PHASES, STATUSES, CellKey

SCHEMA = 1
KIND = "optimus-bench-results"

# strict: a figure is a JSON number, never a string or a boolean; NaN/inf are refused (and
# reported as lost data); fields the models do not name are kept (files may gain fields).
STRICT = ConfigDict(strict=True, extra="allow", allow_inf_nan=False, frozen=True)

Milliseconds = Annotated[float, Field(ge=0)]


class ResultsError(ValueError):
    """A results file that cannot be trusted; the message names the file and the field."""


class NonFiniteError(ResultsError):
    """A figure in a results file is NaN or infinite: the run recorded garbage, not a measurement.

    Its own class so the gate can answer it as lost data (exit INCOMPLETE), not as bad input."""


class WholeProblem(ValueError):
    """A validator's message that says everything itself (which file kind, which version): it is
    printed after the object's path, without the field's name in front."""


class _FieldAt(ValueError):
    """A check of the whole object whose problem is one field's: the error names that field."""

    def __init__(self, field: str, message: str) -> None:
        super().__init__(message)
        self.field = field


class Latency(BaseModel):
    """A latency figure: the summary and the raw samples (ms) the gate's Mann-Whitney U test
    reads."""

    model_config = STRICT

    median: float
    iqr: float
    samples: list[Milliseconds] = Field(min_length=1, description="raw step latencies, ms")
    q1: float | None = None
    q3: float | None = None
    n: int | None = None


# A diverged training's losses are NaN, written as null (``harness.run.cell.finite``): a quality
# cell records what it saw and says ``quality_mismatch``; it must never fail the results file.
CurvePoint = Annotated[list[float | None], Field(min_length=2, max_length=2)]


class QualitySeed(BaseModel):
    """One seed of a training-quality cell (``harness.measure.quality.SeedFigures``)."""

    model_config = STRICT

    seed: int
    auc: float | None = Field(description="held-out AUC of the mode's model (mean over tasks)")
    logloss: float | None = Field(
        description="held-out logloss of the mode's model (null: not finite, diverged)"
    )
    eager_auc: float | None = Field(description="held-out AUC of the eager copy")
    eager_logloss: float | None
    drift: float | None = Field(description="largest |parameter - eager's| after training (null: not finite)")
    drift_rel: float | None = Field(description="drift over the largest distance an eager parameter moved")
    curve: list[CurvePoint] = Field(description="[step, mean training loss of the window ending there], ...")
    eager_curve: list[CurvePoint]


class Quality(BaseModel):
    """What a training-quality cell (``run --quality STEPS``, ``harness.run.quality``) found: means
    over seeds, the worst difference from eager, eager's seed-to-seed spread, the verdict."""

    model_config = STRICT

    steps: int = Field(ge=1, description="optimizer steps per seed")
    every: int = Field(ge=1, description="steps per loss-curve point")
    verdict: str = Field(json_schema_extra={"enum": ["ok", "quality_mismatch"]})
    reasons: list[str]
    auc: float | None
    eager_auc: float | None
    eager_auc_start: float | None = Field(default=None, description="eager's held-out AUC before training")
    logloss: float | None = Field(description="null: not finite (a seed diverged)")
    eager_logloss: float | None
    auc_diff: float | None = Field(description="largest |AUC - eager's| over seeds")
    logloss_rel_diff: float | None = Field(description="largest |logloss - eager's| / eager's over seeds")
    spread_auc: float | None = Field(description="eager's AUC, max - min over seeds (null: one seed)")
    spread_logloss: float | None
    drift: float | None
    seeds: list[QualitySeed] = Field(min_length=1)


def _one_of(allowed: tuple[str, ...], value: str) -> str:
    if value not in allowed:
        raise ValueError(f"unknown {value!r}; allowed values: {', '.join(allowed)}")
    return value


class CellRecord(BaseModel):
    """One cell: one model at one scale, in one mode and phase. Every registered metric is a
    field too (built from the metric registry); fields not named here are allowed."""

    model_config = STRICT

    model: str = Field(description="model family (or the provider's model name)")
    scale: str = Field(description="scale preset: tiny, small, medium, large, xl, ...")
    mode: str = Field(description="a mode registered in harness/modes/mode_registry.py")
    phase: str = Field(json_schema_extra={"enum": list(PHASES)})
    status: str = Field(json_schema_extra={"enum": list(STATUSES)})
    error: str | None = Field(description="why the cell is not ok; null when it is")
    latency_ms: Latency | None = Field(description="step latency, ms; null when not measured")
    peak_mem_bytes: float | None = Field(description="peak memory of one step, bytes")
    compile_s: float | None = Field(description="compile time with caches off, s")
    optimus_s: float | None = Field(description="seconds Optimus itself took")
    nodes_before: int | None = Field(description="FX nodes of the dense arch before Optimus")
    nodes_after: int | None = Field(description="FX nodes after Optimus")
    max_abs_err: float | None = Field(description="largest output difference from eager")
    quality: Quality | None = Field(
        default=None, description="a training-quality run's figures (run --quality)"
    )

    _raw: dict[str, Any] = PrivateAttr(default_factory=dict)

    @field_validator("mode")
    @classmethod
    def _known_mode(cls, v: str) -> str:
        return _one_of(mode_registry.names(), v)

    @field_validator("phase")
    @classmethod
    def _known_phase(cls, v: str) -> str:
        return _one_of(PHASES, v)

    @field_validator("status")
    @classmethod
    def _known_status(cls, v: str) -> str:
        return _one_of(STATUSES, v)

    @model_validator(mode="after")
    def _status_has_its_fields(self) -> CellRecord:
        if self.status != "ok" and not self.error:
            raise _FieldAt("error", f"status {self.status!r} needs an error message")
        if self.status == "ok" and self.latency_ms is None:
            raise _FieldAt("latency_ms", "an ok cell needs latency samples")
        if self.status == "quality_mismatch" and self.quality is None:
            raise _FieldAt("quality", "a quality_mismatch cell needs its quality figures")
        return self

    @staticmethod
    def from_dict(cell: Any, where: str = "cell") -> CellRecord:
        """Validate ``cell`` (a parsed JSON object) or raise ResultsError naming the bad field."""
        try:
            record = cell_model().model_validate(cell)
        except ValidationError as e:
            raise error_of(e, where) from None
        check_finite(record, where)
        record._raw = cell
        return record

    @property
    def key(self) -> CellKey:
        return CellKey(self.model, self.scale, self.mode, self.phase)

    @property
    def latency(self) -> Latency | None:
        return self.latency_ms

    @property
    def metrics(self) -> dict[str, Any]:
        """Every registered metric the cell records, as stored."""
        return {m.name: self._raw[m.name] for m in metric_registry.metrics() if m.name in self._raw}

    def to_dict(self) -> dict[str, Any]:
        return dict(self._raw)

    def value(self, metric: str) -> Any:
        """The figure of a registered metric (latency: the median), None when not recorded."""
        return metric_registry.get(metric).value(self._raw)


CELL_FIELDS: tuple[str, ...] = tuple(n for n, f in CellRecord.model_fields.items() if f.is_required())
"""The fields every cell of schema 1 holds (each may be null unless the model says otherwise)."""
LATENCY_FIELDS: tuple[str, ...] = tuple(n for n, f in Latency.model_fields.items() if f.is_required())


def _metric_field(m: metric_registry.Metric) -> Any:
    if m.judge == "samples":
        return (Latency | None, Field(default=None, description=f"{m.name} ({m.unit})"))
    return (float | None, Field(default=None, description=f"{m.name} ({m.unit})"))


@cache
def _cell_model(metrics: tuple[metric_registry.Metric, ...]) -> type[CellRecord]:
    fields = {m.name: _metric_field(m) for m in metrics if m.name not in CellRecord.model_fields}
    return create_model("Cell", __base__=CellRecord, __doc__=CellRecord.__doc__, **fields)


def cell_model() -> type[CellRecord]:
    """The cell model of the metrics registered now (built once per registry state)."""
    return _cell_model(metric_registry.judged())


class Env(BaseModel):
    """Where the run was measured: commit, versions, CPU and GPU (harness/env.py). ``git`` and
    ``versions`` are objects because report, nightly and the history store read them so."""

    model_config = STRICT

    git: dict[str, Any] | None = None
    versions: dict[str, Any] | None = None


def _kind_and_version(schema: dict[str, Any]) -> None:
    schema["required"] = ["schema", "kind", *schema.get("required", [])]
    for name, const, json_type in (("schema", SCHEMA, "integer"), ("kind", KIND, "string")):
        schema["properties"][name].pop("default", None)
        schema["properties"][name].update(const=const, type=json_type)


class ResultsDocument(BaseModel):
    """An optimus-bench results file (schema 1): where and how the run was made, and its cells,
    at most one per (model, scale, mode, phase)."""

    model_config = ConfigDict(
        strict=True, extra="allow", allow_inf_nan=False, frozen=True, json_schema_extra=_kind_and_version
    )
    KIND_NAME: ClassVar[str] = "optimus-bench results file"

    # Missing, wrong kind or wrong version each get their own message (``_refuse_other_files``).
    schema_version: Any = Field(default=None, alias="schema", validate_default=True)
    kind: Any = Field(default=None, validate_default=True)
    env: Env
    config: dict[str, Any] = Field(description="the run's options (RunConfig) and the peer's options")
    cells: list[CellRecord]

    @field_validator("kind")
    @classmethod
    def _our_kind(cls, v: Any) -> Any:
        if v != KIND:
            raise WholeProblem(f"not an optimus-bench results file (kind={v!r}, expected {KIND!r})")
        return v

    @field_validator("schema_version")
    @classmethod
    def _our_version(cls, v: Any) -> Any:
        if v != SCHEMA or isinstance(v, bool):
            raise WholeProblem(
                f"schema version {v!r} is not supported; this harness reads schema {SCHEMA} "
                "(re-run the benchmark or use the harness version that wrote it)"
            )
        return v

    @model_validator(mode="after")
    def _one_cell_per_key(self) -> ResultsDocument:
        seen: set[CellKey] = set()
        for i, cell in enumerate(self.cells):
            if cell.key in seen:
                raise _FieldAt(f"cells[{i}]", f"duplicate cell {cell.key.label()}")
            seen.add(cell.key)
        return self


@cache
def _document_model(cell: type[CellRecord]) -> type[ResultsDocument]:
    return create_model(
        "ResultsDocument",
        __base__=ResultsDocument,
        __doc__=ResultsDocument.__doc__,
        cells=(list[cell], ...),  # type: ignore[valid-type]  # the cell model of the registry
    )


def document_model() -> type[ResultsDocument]:
    """The results-document model of the metrics registered now."""
    return _document_model(cell_model())


# ----------------------------------------------------------------------------- one-line errors

_EXPECTED = {
    "float_type": "a number",
    "int_type": "an integer",
    "string_type": "a string",
    "bool_type": "true or false",
    "dict_type": "an object",
    "model_type": "an object",
    "model_attributes_type": "an object",
    "list_type": "a list",
    "tuple_type": "a list",
}


def _json_type(v: Any) -> str:
    return "null" if v is None else type(v).__name__


def _path(loc: tuple[int | str, ...]) -> str:
    out = ""
    for part in loc:
        out += f"[{part}]" if isinstance(part, int) else (f".{part}" if out else str(part))
    return out


def _short(v: Any) -> str:
    text = repr(v)
    return text if len(text) <= 60 else text[:57] + "..."


def describe(err: ErrorDetails, source: str) -> str:
    """One line for one pydantic error: the file (``source``), the path of the field, the problem."""
    loc, kind, value = tuple(err["loc"]), err["type"], err.get("input")
    cause = (err.get("ctx") or {}).get("error")
    if isinstance(cause, _FieldAt):
        return f"{source}: {_path((*loc, cause.field))}: {cause}"
    if isinstance(cause, WholeProblem):
        return f"{source}: {_path(loc[:-1]) + ': ' if len(loc) > 1 else ''}{cause}"
    if "samples" in loc[:-1] and isinstance(loc[-1], int):  # one bad sample: name the list
        return (
            f"{source}: {_path(loc[:-1])}: must be a list of finite numbers >= 0 (milliseconds); "
            f"item {loc[-1]} is {_short(value)}"
        )
    where = f"{source}: {_path(loc)}" if loc else source
    if kind == "missing":
        return f"{source}{': ' + _path(loc[:-1]) if len(loc) > 1 else ''}: missing field {loc[-1]!r}"
    if kind == "too_short" and loc and loc[-1] == "samples":
        return f"{where}: is empty"
    if kind in _EXPECTED:
        if not loc:
            return f"{source}: top level must be a JSON object, got {_json_type(value)}"
        if value is None:
            return f"{where}: must not be null"
        if len(loc) == 1:
            return f"{source}: field {loc[0]!r} must be {_EXPECTED[kind]}, got {_json_type(value)}"
        return f"{where}: has type {_json_type(value)}, must be {_EXPECTED[kind]}"
    if isinstance(cause, ValueError):
        return f"{where}: {cause}"
    return f"{where}: {err['msg']} (got {_short(value)})"


def error_of(e: ValidationError, source: str) -> ResultsError:
    """The one error to report: a foreign file first, then NaN/inf (lost data), then the first."""
    errors = e.errors()
    whole = [x for x in errors if isinstance((x.get("ctx") or {}).get("error"), WholeProblem)]
    whole.sort(key=lambda x: x["loc"][-1] != "kind")  # another kind of file says so before its version
    first = (whole or errors)[0]
    non_finite_err = next((x for x in errors if x["type"] == "finite_number"), None)
    if not whole and non_finite_err is not None:
        return NonFiniteError(
            f"{source}: {_path(tuple(non_finite_err['loc']))}: must be a finite number, "
            "got a non-finite value (NaN or inf)"
        )
    return ResultsError(describe(first, source))


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


def check_finite(record: BaseModel, where: str) -> None:
    """NaN/inf in the fields no model names (``meta``, ``parity``, ``limit``, ...): the typed
    fields refuse them already, these are walked."""
    for name, value in (record.model_extra or {}).items():
        bad = non_finite(value, f"{where}.{name}")
        if bad:
            raise NonFiniteError(f"{bad}: must be a finite number, got a non-finite value (NaN or inf)")
    for name in type(record).model_fields:
        sub = getattr(record, name)
        if isinstance(sub, BaseModel):
            check_finite(sub, f"{where}.{name}")


def empty(key: CellKey) -> dict[str, Any]:
    """A failed cell with every schema field and every metric present and null (the cell
    subprocess fills it in)."""
    cell: dict[str, Any] = {name: None for name in CELL_FIELDS}
    cell.update({m.name: None for m in metric_registry.judged()})
    cell.update(
        {"model": key.model, "scale": key.scale, "mode": key.mode, "phase": key.phase, "status": "failed"}
    )
    return cell


def validate_cell(cell: Any, where: str) -> None:
    """Raise ResultsError naming the field when ``cell`` is not a valid cell (``CellRecord``)."""
    CellRecord.from_dict(cell, where)


def parse(doc: Any, source: str = "results") -> ResultsDocument:
    """The document as a model, or ResultsError naming the file, the cell and the field."""
    try:
        model = document_model().model_validate(doc)
    except ValidationError as e:
        raise error_of(e, source) from None
    for i, cell in enumerate(model.cells):
        check_finite(cell, f"{source}: cells[{i}]")
        cell._raw = doc["cells"][i]
    return model


def validate(doc: Any, source: str = "results") -> dict[str, Any]:
    """Check a parsed results document; return it unchanged, or raise ResultsError naming the
    problem."""
    parse(doc, source)
    return doc
