"""Shared pieces of the asv suite: the parameter grid and the bridge to the harness.

Why a bridge and not a measurement: the harness (``optimus-bench run``) owns timing,
peak-memory and compile-time measurement, each cell in its own subprocess with caches off.
The asv suite asks it for cells and reads the results file, so asv tracks exactly the
figures the harness and the nightly report, with no second copy of that logic.

The default grid is small enough for a 2-core CPU (``tiny`` scale, two families). Widen it
with environment variables, which asv passes through to the benchmark processes:

    OPTIMUS_ASV_FAMILIES=dlrm,dcn,towers,mmoe   (default: towers,dlrm)
    OPTIMUS_ASV_SCALES=tiny,small                (default: tiny)
    OPTIMUS_ASV_PHASES=infer,train               (default: infer,train)
    OPTIMUS_ASV_WIDTHS=64,256,1024               (optimizer pass benchmarks; default: 64,256)

Sharded cells (``bench_sharded``, each a torchrun job of ``OPTIMUS_ASV_SHARDED_NPROC`` ranks):

    OPTIMUS_ASV_SHARDED=off                      (skip them: the benchmarks show n/a)
    OPTIMUS_ASV_SHARDED_FAMILIES=towers          (default: towers)
    OPTIMUS_ASV_SHARDED_SCALE=tiny               (default: tiny)
    OPTIMUS_ASV_SHARDED_PHASES=train             (default: train)
    OPTIMUS_ASV_SHARDED_MODES=compile+optimus    (default: compile+optimus)
    OPTIMUS_ASV_SHARDED_NPROC=2                  (default: 2)
    OPTIMUS_ASV_SHARDED_CELLS=<results file>     (the nightly's sharded cells of this commit)
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
from collections.abc import Sequence
from pathlib import Path
from typing import Any

KNOWN_FAMILIES = ("dlrm", "dcn", "towers", "mmoe")
KNOWN_SCALES = ("tiny", "small", "medium", "large", "xl", "medium-hetero")
KNOWN_PHASES = ("infer", "train")
try:  # the modes are defined in harness/modes/mode_registry.py; asv may import this file at an older commit
    from harness.modes.mode_registry import BASELINES, TARGET, asv_modes

    COMPILED_MODES = asv_modes()
    BASE_MODE = BASELINES[0]
except ImportError:  # a commit before the registry: the two compiled modes it had
    COMPILED_MODES, BASE_MODE, TARGET = ("compile", "compile+optimus"), "compile", "compile+optimus"

# Seconds the harness may spend on all compiled cells of one setup_cache (asv's timeout).
CELLS_TIMEOUT_S = 3600.0


def env_list(name: str, default: Sequence[str], allowed: Sequence[str] | None = None) -> list[str]:
    """Read a comma-separated list from ``name``; reject values outside ``allowed``."""
    raw = os.environ.get(name, "").strip()
    values = [v.strip() for v in raw.split(",") if v.strip()] if raw else list(default)
    if allowed is not None:
        bad = [v for v in values if v not in allowed]
        if bad:
            raise ValueError(f"{name}: unknown value(s) {bad}; allowed: {', '.join(allowed)}")
    return values


def families() -> list[str]:
    return env_list("OPTIMUS_ASV_FAMILIES", ("towers", "dlrm"), KNOWN_FAMILIES)


def scales() -> list[str]:
    return env_list("OPTIMUS_ASV_SCALES", ("tiny",), KNOWN_SCALES)


def phases() -> list[str]:
    return env_list("OPTIMUS_ASV_PHASES", KNOWN_PHASES, KNOWN_PHASES)


def sharded_on() -> bool:
    return os.environ.get("OPTIMUS_ASV_SHARDED", "on").strip().lower() not in ("off", "0", "no")


def sharded_families() -> list[str]:
    return env_list("OPTIMUS_ASV_SHARDED_FAMILIES", ("towers",), KNOWN_FAMILIES)


def sharded_scale() -> str:
    vals = env_list("OPTIMUS_ASV_SHARDED_SCALE", ("tiny",), KNOWN_SCALES)
    if len(vals) != 1:
        raise ValueError(f"OPTIMUS_ASV_SHARDED_SCALE must name one scale, got {vals}")
    return vals[0]


def sharded_phases() -> list[str]:
    return env_list("OPTIMUS_ASV_SHARDED_PHASES", ("train",), KNOWN_PHASES)


def sharded_modes() -> list[str]:
    return env_list("OPTIMUS_ASV_SHARDED_MODES", (TARGET,))


def sharded_nproc() -> int:
    raw = os.environ.get("OPTIMUS_ASV_SHARDED_NPROC", "2").strip()
    if not raw.isdigit() or int(raw) < 2:
        raise ValueError(f"OPTIMUS_ASV_SHARDED_NPROC must be an integer >= 2, got {raw!r}")
    return int(raw)


def widths() -> list[int]:
    vals = env_list("OPTIMUS_ASV_WIDTHS", ("64", "256"))
    try:
        out = [int(v) for v in vals]
    except ValueError as err:
        raise ValueError(f"OPTIMUS_ASV_WIDTHS must be integers, got {vals}") from err
    if any(v < 1 for v in out):
        raise ValueError(f"OPTIMUS_ASV_WIDTHS must be positive, got {out}")
    return out


def _cells_doc(path: str, commit: str | None) -> dict[str, Any]:
    """A results file, or from a nightly history (``.jsonl``, ``harness.store.history_store``) the newest
    night measured at ``commit`` (else the newest night). A torn last line is skipped, as the
    store's own reader does; the harness is not imported here (asv runs the commit's own)."""
    text = Path(path).read_text()
    if not path.endswith(".jsonl"):
        return dict(json.loads(text))
    docs = []
    for line in text.splitlines():
        try:
            rec = json.loads(line)
        except json.JSONDecodeError:
            continue
        if isinstance(rec, dict) and isinstance(rec.get("results"), dict):
            docs.append(rec["results"])
    at_commit = [d for d in docs if ((d.get("env") or {}).get("git") or {}).get("sha") == commit]
    return (at_commit or docs or [{}])[-1]


def given_cells(models: Sequence[str], scales_: Sequence[str], modes: Sequence[str],
                phases_: Sequence[str], env: str = "OPTIMUS_ASV_CELLS",
                nproc: int = 1) -> list[dict[str, Any]] | None:  # fmt: skip
    """Cells measured by ``optimus-bench nightly`` for this very commit, if it passed them on.

    The nightly sets ``OPTIMUS_ASV_CELLS`` to its results file so compiled cells are measured
    once per night; it may also name the nightly history (``results/nightly/history.jsonl``). The file is used only if it was written at the commit asv is measuring
    (``ASV_COMMIT``) from a clean tree and holds every cell of the grid; otherwise None and
    the harness runs here.
    """
    path = os.environ.get(env, "")
    if not path:
        return None
    doc = _cells_doc(path, os.environ.get("ASV_COMMIT"))
    git = (doc.get("env") or {}).get("git") or {}
    commit = os.environ.get("ASV_COMMIT")
    if not commit or git.get("sha") != commit or git.get("dirty"):
        print(
            f"asv: {path} is from {git.get('sha')} (dirty={git.get('dirty')}), not {commit}; measuring here"
        )
        return None
    cells = [c for c in doc.get("cells", []) if int(c.get("nproc") or 1) == nproc]
    have = {(c.get("model"), c.get("scale"), c.get("mode"), c.get("phase")) for c in cells}
    need = {(m, s, mode, ph) for m in models for s in scales_ for mode in modes for ph in phases_}
    if not need <= have:
        print(f"asv: {path} lacks cells {sorted(need - have)[:4]}; measuring here")
        return None
    return cells


def run_harness_cells(
    models: Sequence[str],
    scales_: Sequence[str],
    modes: Sequence[str],
    phases_: Sequence[str],
    out_dir: Path,
    extra_args: Sequence[str] = (),
    cells_env: str = "OPTIMUS_ASV_CELLS",
    nproc: int = 1,
) -> Path:
    """Run ``optimus-bench run`` once per scale and merge the cells into one results file.

    Runs with the interpreter asv runs us in, so the harness of the commit under test
    measures. A failing cell is kept in the file with its status; the benchmark that reads
    it raises, so asv shows it as failed instead of a number. Cells the nightly already
    measured at this commit are taken from it instead (``given_cells``).
    """
    out_dir.mkdir(parents=True, exist_ok=True)
    merged = out_dir / "cells.json"
    given = given_cells(models, scales_, modes, phases_, cells_env, nproc)
    if given is not None:
        _write_json_atomic(merged, {"cells": given})
        return merged
    cells: list[dict[str, Any]] = []
    for scale in scales_:
        out = out_dir / f"cells-{scale}.json"
        cmd = [
            sys.executable,
            "-m",
            "harness.cli",
            "run",
            "--models",
            ",".join(models),
            "--scale",
            scale,
            "--modes",
            ",".join(modes),
            "--phases",
            ",".join(phases_),
            *extra_args,
            "--out",
            str(out),
        ]
        proc = subprocess.run(cmd, capture_output=True, text=True, timeout=CELLS_TIMEOUT_S)
        if not out.exists():
            raise RuntimeError(
                f"optimus-bench run wrote no results (exit {proc.returncode}):\n{proc.stderr[-4000:]}"
            )
        data = json.loads(out.read_text())
        cells.extend(data.get("cells", []))
    _write_json_atomic(merged, {"cells": cells})
    return merged


def _write_json_atomic(path: Path, data: dict[str, Any]) -> None:
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=path.name, suffix=".tmp")
    with os.fdopen(fd, "w") as fh:
        json.dump(data, fh)
    os.replace(tmp, path)


def load_cells(path: str | Path) -> list[dict[str, Any]]:
    return list(json.loads(Path(path).read_text())["cells"])


def find_cell(
    cells: Sequence[dict[str, Any]], model: str, scale: str, mode: str, phase: str
) -> dict[str, Any]:
    """Return the ``ok`` cell for the key, or raise (asv then shows the benchmark failed)."""
    for c in cells:
        if (c.get("model"), c.get("scale"), c.get("mode"), c.get("phase")) == (model, scale, mode, phase):
            if c.get("status") != "ok":
                raise RuntimeError(
                    f"cell {model}/{scale}/{mode}/{phase} is {c.get('status')}: {c.get('error')}"
                )
            return c
    raise RuntimeError(f"no cell {model}/{scale}/{mode}/{phase} in the harness results")


def median_latency_ms(cell: dict[str, Any]) -> float:
    return float(cell["latency_ms"]["median"])
