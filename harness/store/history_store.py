"""The nightly history: an append-only, schema-versioned JSON-lines file, one night per line.

Why JSON lines: a night is appended, never rewritten, so a crash can only tear the last
line, and a reader can tell a torn line from a whole one. Each line is a whole results
document (the schema of ``harness.store.results``, raw samples included) plus the night's record,
so ``compare``, asv (``OPTIMUS_ASV_CELLS``) and the change-point detector read figures from
the same bytes: ``results.load("history.jsonl:-1")`` is the last night.

Line format (``SCHEMA`` 1)::

    {"schema": 1, "kind": "optimus-bench-night", "machine": {...}, "night": {sha, date,
     status, branch, dirty, flagged: [[cell, metric], ...]}, "results": {results document}}

A line is validated by ``HistoryEntry`` (its results document by ``cell_record``'s models), so a
damaged line is one error naming the file, the line and the field.

Guarantees, each tested (tests/nightly/test_history_store.py):

* Atomic append: one ``write`` of the whole line with ``O_APPEND``, then ``fsync``.
* A torn last line (a crash mid-write) is detected on read and dropped with a warning; on the
  next append it is moved, byte for byte, to ``<file>.torn-<time>`` (nothing is lost) before
  the new line is written, so it never glues onto a whole line.
* Two nightlies at once: every append holds an exclusive ``fcntl.flock`` on ``<file>.lock``
  for the check-repair-append sequence; readers hold a shared one.
* Machines apart: ``machine`` is the CPU, core count, device, GPU, torch and Python of the
  night. ``select`` returns only the nights of one machine and names the others; a series
  never mixes them silently.
* Another schema (a line written by a newer harness) is refused with the file, line and
  version named; nothing is modified.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import time
import warnings
from collections.abc import Iterator
from dataclasses import dataclass
from functools import cache
from pathlib import Path
from typing import Annotated, Any

from pydantic import BaseModel, ConfigDict, Field, ValidationError, create_model, field_validator

from harness.store import cell_record

SCHEMA = 1
KIND = "optimus-bench-night"
MACHINE_FIELDS = ("cpu", "cpu_count", "device", "gpu", "torch", "python")


class Machine(BaseModel):
    """What must match for two nights to be one series (``machine_key``); compared, never computed on."""

    model_config = cell_record.STRICT

    cpu: str | None = None
    cpu_count: int | None = None
    device: str | None = None
    gpu: str | None = None
    torch: str | None = None
    python: str | None = None


class NightRecord(BaseModel):
    """The night's own record: the commit, when, the verdict, and the cells flagged for a rerun."""

    model_config = cell_record.STRICT

    sha: str | None = None
    date: str | None = None
    status: str | None = None
    branch: str | None = None
    dirty: bool | None = None
    flagged: list[Annotated[list[str], Field(min_length=2, max_length=2)]] = Field(
        default_factory=list, description="[cell, metric] pairs"
    )


def _kind_and_version(schema: dict[str, Any]) -> None:
    schema["required"] = ["schema", "kind", *schema.get("required", [])]
    for name, const, json_type in (("schema", SCHEMA, "integer"), ("kind", KIND, "string")):
        schema["properties"][name].pop("default", None)
        schema["properties"][name].update(const=const, type=json_type)


class HistoryEntry(BaseModel):
    """One line of the history: one night, with its whole results document."""

    model_config = ConfigDict(
        strict=True, extra="allow", allow_inf_nan=False, frozen=True, json_schema_extra=_kind_and_version
    )

    schema_version: Any = Field(default=None, alias="schema", validate_default=True)
    kind: Any = Field(default=None, validate_default=True)
    machine: Machine
    night: NightRecord
    results: cell_record.ResultsDocument

    @field_validator("kind")
    @classmethod
    def _our_kind(cls, v: Any) -> Any:
        if v != KIND:
            raise cell_record.WholeProblem(f"not an optimus-bench night (kind={v!r})")
        return v

    @field_validator("schema_version")
    @classmethod
    def _our_version(cls, v: Any) -> Any:
        if v != SCHEMA or isinstance(v, bool):
            raise cell_record.WholeProblem(
                f"history schema {v!r} is not supported; this harness reads schema {SCHEMA} "
                "(a newer harness wrote it?); nothing was changed"
            )
        return v


@cache
def _entry_model(document: type[cell_record.ResultsDocument]) -> type[HistoryEntry]:
    return create_model(
        "HistoryEntry",
        __base__=HistoryEntry,
        __doc__=HistoryEntry.__doc__,
        results=(document, ...),
    )


def entry_model() -> type[HistoryEntry]:
    """The history-line model of the metrics registered now."""
    return _entry_model(cell_record.document_model())


class HistoryError(ValueError):
    """A history file that cannot be used; the message names the file and the line."""


class TornLineWarning(UserWarning):
    """The last line of the history is incomplete (a crash mid-append); it was not used."""


@dataclass(frozen=True)
class Night:
    line: int  # 1-based line number in the file
    machine: dict[str, Any]
    night: dict[str, Any]
    results: dict[str, Any]


def machine_key(env: dict[str, Any]) -> dict[str, Any]:
    """What must match for two nights to be one series: hardware, device, torch, Python."""
    versions = env.get("versions") or {}
    return {
        "cpu": env.get("cpu"),
        "cpu_count": env.get("cpu_count"),
        "device": env.get("device"),
        "gpu": env.get("gpu"),
        "torch": versions.get("torch"),
        "python": env.get("python"),
    }


def describe_machine(m: dict[str, Any]) -> str:
    return ", ".join(f"{k}={m.get(k)}" for k in MACHINE_FIELDS)


@contextlib.contextmanager
def _locked(path: Path, exclusive: bool) -> Iterator[None]:
    """flock on ``<file>.lock``. A reader does not create it (a committed history stays clean);
    without it no writer has run, and a line a writer is adding meanwhile reads as torn."""
    lock = path.with_name(path.name + ".lock")
    if not exclusive and not lock.exists():
        yield
        return
    fd = os.open(lock, (os.O_RDWR | os.O_CREAT) if exclusive else os.O_RDONLY, 0o644)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX if exclusive else fcntl.LOCK_SH)
        yield
    finally:
        fcntl.flock(fd, fcntl.LOCK_UN)
        os.close(fd)


def parse_entry(rec: Any, where: str) -> HistoryEntry:
    """One parsed line as the model, or HistoryError naming the line and the field."""
    try:
        entry = entry_model().model_validate(rec)
        for i, cell in enumerate(entry.results.cells):
            cell_record.check_finite(cell, f"{where}: results: cells[{i}]")
    except ValidationError as e:
        raise HistoryError(str(cell_record.error_of(e, where))) from None
    except cell_record.ResultsError as e:
        raise HistoryError(str(e)) from None
    return entry


def _parse(path: Path, raw: bytes) -> tuple[list[Night], bytes]:
    """Whole nights, and the torn tail (b"" when the file ends in a whole line)."""
    nights: list[Night] = []
    end = raw.rfind(b"\n") + 1
    body, tail = raw[:end], raw[end:]
    for n, line in enumerate(body.split(b"\n")[:-1], start=1):
        if not line.strip():
            continue
        try:
            rec = json.loads(line)
        except (json.JSONDecodeError, UnicodeDecodeError) as e:
            raise HistoryError(
                f"{path}:{n}: not a JSON line ({e}); the file is damaged before its end"
            ) from None
        parse_entry(rec, f"{path}:{n}")
        nights.append(Night(n, rec["machine"], rec["night"], rec["results"]))
    return nights, tail


def read(path: str | os.PathLike[str]) -> list[Night]:
    """Every whole night of the history (none if the file does not exist). A torn last line
    is left out with a ``TornLineWarning``."""
    p = Path(path)
    if not p.exists():
        return []
    if p.is_dir():
        raise HistoryError(f"{p}: is a directory, not a history file")
    with _locked(p, exclusive=False):
        raw = p.read_bytes()
    nights, tail = _parse(p, raw)
    if tail.strip():
        warnings.warn(
            f"{p}: last line is torn ({len(tail)} bytes without a newline, a crash mid-append?); "
            "left out (the next append moves it aside)",
            TornLineWarning,
            stacklevel=2,
        )
    return nights


def append(path: str | os.PathLike[str], doc: dict[str, Any], night: dict[str, Any]) -> Night:
    """Append one night (``doc``: its results document) under the lock; return it as stored."""
    p = Path(path)
    doc = cell_record.validate(doc, "night to append")
    machine = machine_key(doc["env"])
    rec = {"schema": SCHEMA, "kind": KIND, "machine": machine, "night": night, "results": doc}
    parse_entry(rec, "night to append")  # never write a line the next reader refuses
    line = (json.dumps(rec, allow_nan=False, separators=(",", ":")) + "\n").encode()
    p.parent.mkdir(parents=True, exist_ok=True)
    with _locked(p, exclusive=True):
        raw = p.read_bytes() if p.exists() else b""
        nights, tail = _parse(p, raw)  # refuses another schema before anything is written
        fd = os.open(p, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
        try:
            if tail:
                aside = p.with_name(f"{p.name}.torn-{time.strftime('%Y%m%dT%H%M%S')}-{os.getpid()}")
                aside.write_bytes(tail)
                os.ftruncate(fd, len(raw) - len(tail))
                warnings.warn(
                    f"{p}: torn last line moved to {aside} before appending", TornLineWarning, stacklevel=2
                )
            written = os.write(fd, line)
            if written != len(line):
                raise OSError(f"{p}: short write ({written} of {len(line)} bytes)")
            os.fsync(fd)
        finally:
            os.close(fd)
    return Night(len(nights) + 1, machine, night, doc)


def select(nights: list[Night], machine: dict[str, Any]) -> tuple[list[Night], list[str]]:
    """The nights of ``machine``, and one line per other machine saying what was left out."""
    same = [n for n in nights if n.machine == machine]
    others: dict[str, int] = {}
    for n in nights:
        if n.machine != machine:
            diff = ", ".join(
                f"{k} {n.machine.get(k)!r} (here {machine.get(k)!r})"
                for k in MACHINE_FIELDS
                if n.machine.get(k) != machine.get(k)
            )
            others[diff] = others.get(diff, 0) + 1
    return same, [f"{count} night(s) left out, another machine: {diff}" for diff, count in others.items()]


def night_results(path: str | os.PathLike[str], index: int) -> dict[str, Any]:
    """The results document of night ``index`` (Python indexing: -1 is the last)."""
    nights = read(path)
    try:
        return nights[index].results
    except IndexError:
        raise HistoryError(f"{path}: no night {index} (the history holds {len(nights)})") from None
