"""asv's results files read as data, and two commits compared the way ``asv compare`` does.

WHY not ``asv compare``'s printed table: the table is for people (units folded into the
figures, columns that change with asv's version), and reading it back with a regex loses the
samples and fails silently on a layout change. The results files are asv's own record.

Format (asv 0.6, results api ``version`` 2; ``asv/results.py``, ``Results.save``): one file per
machine, commit and environment, ``<results_dir>/<machine>/<sha[:8]>-<env>.json``, holding
``commit_hash``, ``env_name``, ``params`` (``machine`` among them), ``result_columns`` (the names
of the columns, e.g. ``result``, ``params``, ``version``, ``stats_q_25``, ..., ``samples``) and
``results``: benchmark name -> its row in those columns, trailing empty columns dropped. A
parameterized benchmark holds one value per combination of its ``params`` (the product of the
lists of parameter reprs, in order); a value is ``None`` when it failed and NaN when skipped.

The marks follow ``asv compare``: ``x`` benchmark version changed, ``!`` failed now, ``*``
fixed, ``+`` larger by more than ``factor`` (and, with samples or confidence intervals on both
sides, significantly so), ``-`` smaller likewise, empty otherwise (ratio prefixed ``~`` when
the change passes ``factor`` but not the significance test).
"""

from __future__ import annotations

import itertools
import json
import math
import platform
from dataclasses import dataclass
from pathlib import Path
from typing import Any

RESULTS_API_VERSION = 2


@dataclass
class AsvRow:
    """One compared figure; ``before``/``after`` are printable (a number, ``failed`` or ``n/a``)."""

    mark: str
    before: str
    after: str
    ratio: str
    name: str
    verdict: str = ""


@dataclass(frozen=True)
class AsvFigure:
    """One figure of one commit: a benchmark at one parameter combination."""

    name: str  # as asv prints it: ``module.Class.bench('towers', 'tiny')``
    value: float | None  # None: failed; NaN: skipped
    stats: dict[str, Any] | None
    samples: list[float] | None
    version: str | None


def default_machine(machine: str | None) -> str:
    """The machine asv itself records under when none is named (``asv`` uses the node name)."""
    return machine or platform.node()


def results_files(results_dir: Path, machine: str, sha: str) -> list[Path]:
    return sorted((results_dir / machine).glob(f"{sha[:8]}-*.json"))


def load_figures(path: Path) -> dict[str, AsvFigure]:
    """Every figure of one results file, by name; a file of another format is refused."""
    doc = json.loads(path.read_text())
    if doc.get("version") != RESULTS_API_VERSION:
        raise RuntimeError(
            f"{path}: asv results version {doc.get('version')!r}, expected {RESULTS_API_VERSION}"
        )
    try:
        columns, results = doc["result_columns"], doc["results"]
    except KeyError as e:
        raise RuntimeError(f"{path}: not an asv results file (no {e})") from e
    out: dict[str, AsvFigure] = {}
    for bench, row in results.items():
        col = dict(zip(columns, row, strict=False))
        params = col.get("params") or []
        combos = list(itertools.product(*params))
        values = _per_combo(col.get("result"), len(combos))
        samples = _per_combo(col.get("samples"), len(combos))
        stats = _stats_per_combo(col, len(combos))
        for i, combo in enumerate(combos):
            name = f"{bench}({', '.join(combo)})" if combo else bench
            out[name] = AsvFigure(name, values[i], stats[i], samples[i], col.get("version"))
    return out


def _per_combo(values: Any, n: int) -> list[Any]:
    if values is None:
        return [None] * n
    return list(values) + [None] * (n - len(values))


def _stats_per_combo(col: dict[str, Any], n: int) -> list[dict[str, Any] | None]:
    out: list[dict[str, Any] | None] = [None] * n
    for key, values in col.items():
        if not key.startswith("stats_") or values is None:
            continue
        for i, v in enumerate(values[:n]):
            if v is not None:
                out[i] = {**(out[i] or {}), key[len("stats_") :]: v}
    return out


def read_commit(results_dir: Path, machine: str, sha: str) -> dict[str, AsvFigure]:
    """All figures of ``sha`` on ``machine`` (several environments: the env is named in brackets)."""
    files = results_files(results_dir, machine, sha)
    if not files:
        raise RuntimeError(f"no asv results for {sha[:10]} in {results_dir / machine}")
    out: dict[str, AsvFigure] = {}
    for path in files:
        env = path.stem.split("-", 1)[1]
        for name, fig in load_figures(path).items():
            key = name if len(files) == 1 else f"{name} [{env}]"
            out[key] = AsvFigure(key, fig.value, fig.stats, fig.samples, fig.version)
    return out


def _isna(value: float | None) -> bool:
    return value is None or value != value


def _printable(value: float | None) -> str:
    if value is None:
        return "failed"
    return "n/a" if math.isnan(value) else repr(value)


def _better(
    a: float, b: float, fa: AsvFigure | None, fb: AsvFigure | None, factor: float, stats: bool
) -> bool:
    """``a`` smaller than ``b`` by ``factor``; with stats on both sides, also significantly
    (asv's own test, ``asv._stats.is_different``)."""
    if (
        stats
        and fa
        and fb
        and fa.stats
        and fb.stats
        and fa.stats.get("repeat", 0) != 1
        and fb.stats.get("repeat", 0) != 1
    ):
        try:
            from asv import _stats
        except ImportError:  # asv not installed: the factor alone decides
            pass
        else:
            if not _stats.is_different(fa.samples, fb.samples, fa.stats, fb.stats):
                return False
    return a < b / factor


def compare(before: dict[str, AsvFigure], after: dict[str, AsvFigure], factor: float) -> list[AsvRow]:
    """One row per figure of either commit, sorted by name, marked as ``asv compare`` marks it."""
    rows: list[AsvRow] = []
    for name in sorted(set(before) | set(after)):
        f1, f2 = before.get(name), after.get(name)
        t1 = f1.value if f1 else math.nan
        t2 = f2.value if f2 else math.nan
        ratio = "n/a"
        if not (_isna(t1) or _isna(t2)) and t1 != 0:
            ratio = f"{t2 / t1:.2f}"  # type: ignore[operator]
        v1, v2 = (f1.version if f1 else None), (f2.version if f2 else None)
        mark = ""
        if v1 is not None and v2 is not None and v1 != v2:
            mark = "x"
        elif t1 is not None and t2 is None:
            mark = "!"
        elif t1 is None and t2 is not None:
            mark = "*"
        elif not (_isna(t1) or _isna(t2)):
            assert t1 is not None and t2 is not None
            if _better(t2, t1, f2, f1, factor, True):
                mark = "-"
            elif _better(t1, t2, f1, f2, factor, True):
                mark = "+"
            elif _better(t1, t2, None, None, factor, False) or _better(t2, t1, None, None, factor, False):
                ratio = "~" + ratio
        rows.append(AsvRow(mark, _printable(t1), _printable(t2), ratio, name))
    return rows
