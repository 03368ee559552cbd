"""Config fields: their kinds, allowed values and the checks that run before anything is allocated.

Why a table: every preset and every override passes through the same checks, and an error names
the field and what it may hold, so a typo or a negative size fails in microseconds with a clear
message instead of deep inside torchrec or after gigabytes were allocated.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class Field:
    """One config field: `kind` is int, float, bool, str or "widths" (tuple of positive ints)."""

    kind: str
    doc: str
    low: float | None = None  # inclusive lower bound for numbers, min length for widths
    high: float | None = None  # inclusive upper bound for numbers
    choices: tuple[str, ...] = ()
    optional: bool = False  # may be absent from a config (presets that do not use it leave it out)

    def allowed(self) -> str:
        if self.kind == "widths":
            low = int(self.low or 0)
            return "a tuple of positive ints" + (f" (at least {low})" if low else " (may be empty)")
        if self.kind == "str":
            return f"one of {list(self.choices)}"
        if self.kind == "bool":
            return "True or False"
        lo = "-inf" if self.low is None else self.low
        hi = "inf" if self.high is None else self.high
        return f"{self.kind} in [{lo}, {hi}]"


# Fields every family has: sizes of the sparse arch, the data and the run.
COMMON: dict[str, Field] = {
    "num_sparse_features": Field("int", "sparse (KJT) features", 1, 100_000),
    "num_dense_features": Field("int", "dense (float) features", 1, 100_000),
    "features_per_table": Field("int", "sparse features sharing one embedding table", 1, 1024),
    "rows_per_table": Field("int", "rows of each embedding table", 1, None),
    "embedding_dim": Field("int", "width of every embedding table", 1, 4096),
    "batch_size": Field("int", "samples per batch", 1, 1_000_000),
    "num_batches": Field("int", "batches generated up front", 1, 10_000),
    "num_tasks": Field("int", "outputs (logits) per sample", 1, 1024),
    "pooling_mean": Field("float", "mean ids per sample per feature (mean over features)", 0.0, 10_000),
    "pooling_spread": Field("float", "log-normal sigma of the per-feature mean pooling", 0.0, 5.0),
    "max_pooling": Field("int", "cap on ids per sample per feature", 1, 100_000),
    "zipf_alpha": Field("float", "Zipf exponent of id popularity (0 = uniform)", 0.0, 5.0),
    "memory_budget_gib": Field(
        "float", "RAM the model, optimizer state and batches must fit in", 0.001, None
    ),
    # optional: absent in the uniform presets, so their configs (and fingerprints) are unchanged
    "hetero_seed": Field(
        "int",
        "seed of the heterogeneous widths: per-table embedding dims, per-tower/expert widths "
        "(absent: uniform; see models/widths.py)",
        0,
        2**31 - 1,
        optional=True,
    ),
}


def check(family: str, cfg: Mapping[str, Any], fields: Mapping[str, Field]) -> None:
    """Raise ValueError naming the first field that is missing, unknown or out of range."""
    unknown = sorted(set(cfg) - set(fields))
    if unknown:
        raise ValueError(f"{family}: unknown config field(s) {unknown}; allowed fields: {sorted(fields)}")
    for name, spec in fields.items():
        if name not in cfg:
            if spec.optional:
                continue
            raise ValueError(f"{family}: config field {name!r} is missing ({spec.doc})")
        _check_value(family, name, cfg[name], spec)


def _check_value(family: str, name: str, value: Any, spec: Field) -> None:
    def bad(why: str) -> ValueError:
        return ValueError(f"{family}: config field {name!r}={value!r} {why}; allowed: {spec.allowed()}")

    if spec.kind == "bool":
        if not isinstance(value, bool):
            raise bad("is not a bool")
        return
    if spec.kind == "str":
        if value not in spec.choices:
            raise bad("is not an allowed value")
        return
    if spec.kind == "widths":
        if not isinstance(value, tuple | list) or len(value) < int(spec.low or 0):
            raise bad("is not a long enough tuple")
        for w in value:
            if isinstance(w, bool) or not isinstance(w, int) or w < 1:
                raise bad("holds a width that is not a positive int")
        return
    if spec.kind == "int" and (isinstance(value, bool) or not isinstance(value, int)):
        raise bad("is not an int")
    if spec.kind == "float" and (isinstance(value, bool) or not isinstance(value, int | float)):
        raise bad("is not a number")
    if spec.low is not None and value < spec.low:
        raise bad("is too small")
    if spec.high is not None and value > spec.high:
        raise bad("is too large")
