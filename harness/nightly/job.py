"""`optimus-bench nightly`: measure this commit, compare with the last good nightly, gate CI.

Why a separate command and not a CI script: the nightly must be runnable by hand (to
reproduce a red night) and testable, and it must measure and judge with the harness's own
code: cells come from ``harness.run.runner``, verdicts from ``harness.gate.compare`` (Mann-Whitney U
plus a minimum effect), so a regression here is a regression in ``optimus-bench compare``.

One night, in order:

1. The suite of the config file (``benchmarks/nightly_thresholds.json``) runs as harness
   cells into ``<store>/runs/<stamp>-<sha8>.json`` (raw samples kept).
2. It is compared with the last nightly in ``<store>/history.json`` that passed.
3. Noise handling: every (cell, metric) flagged as a regression is measured again (the
   cell re-runs in a fresh process, up to ``rerun.max_reruns`` times); it is a regression
   only if every measurement flags it. The stored cell is the last measurement.
4. asv: ``asv run <sha>^!`` for the configured benchmarks, fed the final harness cells
   (``OPTIMUS_ASV_CELLS``) so compiled cells are not measured twice, then its results files
   are compared with the base commit's (``harness.nightly.asv_results``, asv compare's rules). A flagged asv figure is re-measured (its harness cells, or the
   asv benchmark itself) and re-compared before it counts. Figures the harness comparison
   already judges are ``report_only``.
5. A markdown summary; a history entry; exit status 1 on a confirmed regression, 5 (``TOOL_FAILED``) when
   the asv part or the publish failed (the night is recorded with status ``error``).

A night that regressed is recorded with status ``regression`` and is never a base, so a
regression stays red until it is fixed (or the base is chosen explicitly with ``--base``).
"""

from __future__ import annotations

import argparse
import ast
import json
import math
import os
import re
import subprocess
import sys
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from harness import exit_codes
from harness.env import REPO_ROOT, git_info
from harness.gate import compare
from harness.modes import mode_registry
from harness.nightly import asv_results
from harness.nightly.asv_results import AsvRow
from harness.nightly.changes import (
    ChangeConfig,
    SeriesResult,
    alerts_of,
    analyse,
    build_series,
    config_from,
    format_changes,
)
from harness.nightly.paired_night import PairedConfig
from harness.outputs import check_output_dir, check_output_file
from harness.spec import DEFAULT_PROVIDER, CellKey, RunConfig, resolve_device
from harness.store import history_store, results
from harness.store.results import write_atomic

DEFAULT_CONFIG = REPO_ROOT / "benchmarks" / "nightly_thresholds.json"
DEFAULT_STORE = REPO_ROOT / "results" / "nightly"
HISTORY_SCHEMA = 1
ASV_CELLS_ENV = "OPTIMUS_ASV_CELLS"
SUITE_KEYS = ("models", "scale", "modes", "phases", "warmup", "min_iters", "max_iters", "budget_s",
              "timeout_s", "threads")  # fmt: skip
# The optional "sharded" section: a second, small suite whose cells are torchrun jobs (docs/sharded.md).
SHARDED_KEYS = (*SUITE_KEYS, "nproc", "sharding", "pg_timeout_s")
# The optional "quality" section: the training-quality gate (harness/run/quality.py) on one family per
# night, in turn (``families``), every mode in ``modes``.
QUALITY_KEYS = (
    "families",
    "scale",
    "modes",
    "steps",
    "seeds",
    "every",
    "heldout",
    "lr",
    "timeout_s",
    "threads",
)
# asv figures derived from the compiled harness cells: (family, scale, phase) params.
CELL_BENCH_PREFIX = "bench_compiled."


# --------------------------------------------------------------------------- config


@dataclass(frozen=True)
class NightlyConfig:
    """The one config file of the nightly: suite, thresholds, asv, reruns."""

    suite: dict[str, Any]
    thresholds: compare.Thresholds
    asv_enabled: bool = True
    asv_factor: float = 1.1
    asv_bench: tuple[str, ...] = ()
    asv_quick: bool = False
    higher_is_better: tuple[str, ...] = ()
    report_only: tuple[str, ...] = ()
    max_reruns: int = 1
    changes: ChangeConfig = field(default_factory=ChangeConfig)
    sharded: dict[str, Any] | None = None  # the sharded suite (nproc > 1), or None
    paired: PairedConfig = field(default_factory=PairedConfig)
    quality: dict[str, Any] | None = None  # the training-quality gate, one family a night, or None


def _section(doc: dict[str, Any], name: str, path: Path) -> dict[str, Any]:
    sec = doc.get(name, {})
    if not isinstance(sec, dict):
        raise ValueError(f"{path}: field {name!r} must be an object, got {type(sec).__name__}")
    return sec


def _check_keys(sec: dict[str, Any], allowed: Iterable[str], where: str) -> None:
    bad = sorted(set(sec) - set(allowed))
    if bad:
        raise ValueError(f"{where}: unknown field(s) {bad}; allowed: {', '.join(sorted(allowed))}")


def load_config(path: str | os.PathLike[str] = DEFAULT_CONFIG) -> NightlyConfig:
    """Read and validate the nightly config; errors name the file and the field."""
    p = Path(path)
    try:
        doc = json.loads(p.read_text())
    except FileNotFoundError:
        raise ValueError(f"{p}: no such nightly config file") from None
    except json.JSONDecodeError as e:
        raise ValueError(f"{p}: not valid JSON ({e})") from None
    if not isinstance(doc, dict):
        raise ValueError(f"{p}: top level must be an object")
    _check_keys(
        doc, ("_doc", "suite", "sharded", "paired", "quality", "harness", "asv", "rerun", "alert"), str(p)
    )
    suite = _section(doc, "suite", p)
    _check_keys(suite, SUITE_KEYS, f"{p}: suite")
    sharded = _section(doc, "sharded", p) if "sharded" in doc else None
    if sharded is not None:
        _check_keys(sharded, SHARDED_KEYS, f"{p}: sharded")
        if not (isinstance(sharded.get("nproc"), int) and not isinstance(sharded["nproc"], bool)
                and sharded["nproc"] >= 2):  # fmt: skip
            raise ValueError(f"{p}: sharded.nproc must be an integer >= 2, got {sharded.get('nproc')!r}")
    quality = _section(doc, "quality", p) if "quality" in doc else None
    if quality is not None:
        _check_keys(quality, QUALITY_KEYS, f"{p}: quality")
        fams = quality.get("families")
        if not (isinstance(fams, list) and fams and all(isinstance(f, str) and f for f in fams)):
            raise ValueError(f"{p}: quality.families must be a non-empty list of family names, got {fams!r}")
    th_doc = _section(doc, "harness", p)
    th_fields = compare.Thresholds.keys()
    _check_keys(th_doc, th_fields, f"{p}: harness")
    try:
        th = compare.Thresholds(**th_doc).validate()
    except ValueError as e:
        raise ValueError(f"{p}: harness.{e}") from None
    asv = _section(doc, "asv", p)
    _check_keys(asv, ("enabled", "factor", "bench", "quick", "higher_is_better", "report_only"), f"{p}: asv")
    factor = asv.get("factor", 1.1)
    if (
        isinstance(factor, bool)
        or not isinstance(factor, int | float)
        or not math.isfinite(factor)
        or factor < 1.0
    ):
        raise ValueError(f"{p}: asv.factor must be >= 1.0 (a ratio), got {factor}")
    rerun = _section(doc, "rerun", p)
    _check_keys(rerun, ("max_reruns",), f"{p}: rerun")
    max_reruns = rerun.get("max_reruns", 1)
    if not isinstance(max_reruns, int) or isinstance(max_reruns, bool) or max_reruns < 0:
        raise ValueError(f"{p}: rerun.max_reruns must be an integer >= 0, got {max_reruns!r}")
    return NightlyConfig(
        suite=dict(suite),
        thresholds=th,
        asv_enabled=bool(asv.get("enabled", True)),
        asv_factor=factor,
        asv_bench=tuple(asv.get("bench", ())),
        asv_quick=bool(asv.get("quick", False)),
        higher_is_better=tuple(asv.get("higher_is_better", ())),
        report_only=tuple(asv.get("report_only", ())),
        max_reruns=max_reruns,
        changes=config_from(_section(doc, "alert", p), f"{p}: alert"),
        sharded=dict(sharded) if sharded is not None else None,
        paired=PairedConfig.from_section(_section(doc, "paired", p), f"{p}: paired"),
        quality=dict(quality) if quality is not None else None,
    )


def run_config(suite: dict[str, Any], provider: str, device: str) -> RunConfig:
    """The harness RunConfig of the suite (validated by the harness, same errors as ``run``)."""
    kw = {k: v for k, v in suite.items() if k in SHARDED_KEYS}
    for name in ("models", "modes", "phases"):
        if isinstance(kw.get(name), str):
            kw[name] = kw[name].split(",")
    return RunConfig(provider=provider, device=device, **kw).validate()


def quality_run_config(section: dict[str, Any], provider: str, device: str, night: int) -> RunConfig:
    """The quality gate's RunConfig for night number ``night`` (0, 1, ...): the family whose turn
    it is (``families[night % len(families)]``), every mode of ``modes``, phase train. Why one
    family a night: a quality cell trains for minutes (docs/harness.md, 'Training quality'), so the
    families take turns and each is judged every len(families) nights."""
    fams = list(section["families"])
    kw: dict[str, Any] = {"models": [fams[night % len(fams)]], "phases": ["train"]}
    for key, field_name in (("scale", "scale"), ("timeout_s", "timeout_s"), ("threads", "threads"),
                            ("steps", "quality_steps"), ("seeds", "quality_seeds"), ("every", "quality_every"),
                            ("heldout", "quality_heldout"), ("lr", "quality_lr")):  # fmt: skip
        if key in section:
            kw[field_name] = section[key]
    if "modes" in section:
        kw["modes"] = section["modes"].split(",") if isinstance(section["modes"], str) else section["modes"]
    kw.setdefault("quality_steps", 300)
    return RunConfig(provider=provider, device=device, **kw).validate()


# --------------------------------------------------------------------------- history


def load_history(store: Path) -> dict[str, Any]:
    path = store / "history.json"
    if not path.exists():
        return {"schema": HISTORY_SCHEMA, "runs": []}
    try:
        doc = json.loads(path.read_text())
    except json.JSONDecodeError as e:
        raise ValueError(f"{path}: corrupt nightly history ({e})") from None
    if (
        not isinstance(doc, dict)
        or doc.get("schema") != HISTORY_SCHEMA
        or not isinstance(doc.get("runs"), list)
    ):
        raise ValueError(f"{path}: not a nightly history of schema {HISTORY_SCHEMA}")
    return doc


def last_good(history: dict[str, Any], store: Path) -> dict[str, Any] | None:
    """The most recent night that passed and whose results file still exists."""
    for entry in reversed(history["runs"]):
        if entry.get("status") == "pass" and (store / entry["results"]).exists():
            return dict(entry)
    return None


def paired_anchor(history: dict[str, Any], base_entry: dict[str, Any], anchor_nights: int) -> str:
    """The commit tonight is paired with: the base night's own anchor while fewer than
    ``anchor_nights`` passing nights followed it, else the base night's commit.

    Why an anchor and not always the last passing night: paired against the night before, a
    slowdown of 2% a night never shows an interval above a 2% threshold, and every night passes
    and becomes the next base. Against an anchor that stays for a week, the creep adds up night
    after night until its interval crosses the threshold; ``bisect`` then finds the commits."""
    anchor = base_entry.get("paired_base")
    if not anchor or anchor_nights <= 1:
        return str(base_entry["sha"])
    passing = 0
    for e in reversed(history["runs"]):
        if e.get("sha") == anchor and e.get("status") == "pass":
            return str(anchor) if passing < anchor_nights else str(base_entry["sha"])
        if e.get("status") == "pass":
            passing += 1
    return str(base_entry["sha"])


# --------------------------------------------------------------------------- harness cells


@dataclass
class Rerun:
    cell: str
    attempt: int
    flagged: list[str]  # metrics still flagged on this measurement


@dataclass
class HarnessOutcome:
    rows: list[compare.Row]
    first_flagged: set[tuple[str, str]]
    confirmed: set[tuple[str, str]]
    reruns: list[Rerun] = field(default_factory=list)


def _only(doc: dict[str, Any], label: str) -> dict[str, Any]:
    return {**doc, "cells": [c for c in doc["cells"] if compare.cell_label(c) == label]}


def _flagged(rows: Iterable[compare.Row]) -> set[tuple[str, str]]:
    """Regressions and failed cells: both are measured again before they count."""
    return {(r.cell, r.metric) for r in rows if r.verdict in ("regression", "failed")}


def confirm_regressions(
    base: dict[str, Any],
    new: dict[str, Any],
    th: compare.Thresholds,
    rerun: Callable[[CellKey], dict[str, Any]],
    max_reruns: int,
) -> HarnessOutcome:
    """Compare, re-measure every flagged cell, keep only what every measurement flags.

    ``new`` is updated in place: a re-measured cell replaces the flagged one.
    """
    first = _flagged(compare.compare_docs(base, new, th))
    confirmed = set(first)
    reruns: list[Rerun] = []
    keys = {compare.cell_label(c): CellKey.of(c) for c in new["cells"]}
    for label in sorted({cell for cell, _ in first}):
        for attempt in range(1, max_reruns + 1):
            results.upsert_cell(new, rerun(keys[label]))
            now = _flagged(compare.compare_docs(_only(base, label), _only(new, label), th))
            confirmed = {(c, m) for c, m in confirmed if c != label or (c, m) in now}
            reruns.append(Rerun(label, attempt, sorted(m for c, m in now if c == label)))
            if not any(c == label for c, _ in confirmed):
                break
    rows = compare.compare_docs(base, new, th)
    for r in rows:
        if r.verdict in ("regression", "failed") and (r.cell, r.metric) not in confirmed:
            r.verdict = "not confirmed"
    return HarnessOutcome(rows, first, confirmed, reruns)


# --------------------------------------------------------------------------- asv


def classify_asv(rows: list[AsvRow], higher_is_better: Iterable[str], report_only: Iterable[str]) -> None:
    """Set each row's verdict. asv marks '+' for a significant increase, '-' for a decrease."""
    hib, ro = tuple(higher_is_better), tuple(report_only)
    for r in rows:
        base_name = r.name.split("(")[0]
        up_is_good = any(base_name.endswith("." + h) or base_name == h for h in hib)
        if r.mark == "!":
            verdict = "regression"  # ran before, fails now
        elif r.mark == "*":
            verdict = "fixed"
        elif r.mark == "x":
            verdict = "not comparable"
        elif r.mark == "+":
            verdict = "improvement" if up_is_good else "regression"
        elif r.mark == "-":
            verdict = "regression" if up_is_good else "improvement"
        else:
            verdict = "no change"
        if verdict == "regression" and any(s in r.name for s in ro):
            verdict = "regression (report only)"
        r.verdict = verdict


def cell_params(name: str) -> tuple[str, ...] | None:
    """Parameters of a ``bench_compiled`` row name, e.g. ``...track_speedup('towers', 'tiny', 'infer')``."""
    m = re.search(r"\((.*)\)\s*$", name)
    if not m:
        return None
    try:
        val = ast.literal_eval(f"({m.group(1)},)")
    except (ValueError, SyntaxError):
        return None
    return tuple(str(v) for v in val)


class Asv:
    """Runs the asv command line of this repository (``python -m asv``) from the repo root."""

    def __init__(
        self, conf: Path, log: Callable[[str], None], machine: str | None = None, logfile: Path | None = None
    ) -> None:
        self.conf = conf
        self.log = log
        self.machine_name = machine
        self.machine = ["--machine", machine] if machine else []
        self.logfile = logfile

    def __call__(self, *args: str, env: dict[str, str] | None = None, check: bool = True) -> str:
        cmd = [sys.executable, "-m", "asv", *args, "--config", str(self.conf)]
        self.log("$ " + " ".join(cmd))
        proc = subprocess.run(
            cmd, cwd=REPO_ROOT, capture_output=True, text=True, env={**os.environ, **(env or {})}
        )
        if self.logfile is not None:
            self.logfile.parent.mkdir(parents=True, exist_ok=True)
            with open(self.logfile, "a", encoding="utf-8") as f:
                f.write(f"$ {' '.join(cmd)}\n{proc.stdout}\n{proc.stderr}\n(exit {proc.returncode})\n\n")
        if check and proc.returncode != 0:
            raise RuntimeError(
                f"asv {args[0]} failed (exit {proc.returncode}):\n{proc.stdout[-3000:]}\n{proc.stderr[-3000:]}"
            )
        return proc.stdout

    def ensure_machine(self) -> None:
        if not (Path.home() / ".asv-machine.json").exists():
            self("machine", "--yes", *self.machine)

    def run(self, sha: str, benches: Iterable[str], quick: bool, env: dict[str, str]) -> str:
        args = ["run", "--show-stderr", "--launch-method", "spawn", *self.machine]
        if quick:
            args.append("--quick")
        for b in benches:
            args += ["--bench", b]
        # asv exits 2 when a benchmark failed; that is reported per row by compare, not fatal.
        return self(*args, f"{sha}^!", env=env, check=False)

    def compare(self, base_sha: str, new_sha: str, factor: float) -> list[AsvRow]:
        """The two commits' figures, read from asv's results files (``harness.nightly.asv_results``)."""
        results_dir = Path(read_asv_conf(self.conf).get("results_dir", "results"))
        if not results_dir.is_absolute():
            results_dir = self.conf.resolve().parent / results_dir
        machine = asv_results.default_machine(self.machine_name)
        self.log(f"comparing asv results of {base_sha[:10]} and {new_sha[:10]} in {results_dir / machine}")
        before = asv_results.read_commit(results_dir, machine, base_sha)
        return asv_results.compare(before, asv_results.read_commit(results_dir, machine, new_sha), factor)


def read_asv_conf(conf: Path) -> dict[str, Any]:
    """asv.conf.json allows // comments; strip whole-line ones and parse."""
    text = re.sub(r"^\s*//.*$", "", conf.read_text(), flags=re.M)
    return dict(json.loads(text))


def asv_config_for_branch(conf: Path, branch: str | None, out_dir: Path) -> Path:
    """The config to publish with: asv graphs only commits of its ``branches`` (``main``).

    For a nightly on another branch (a release branch, a feature branch run by hand) this
    writes a copy listing that branch too, with every path made absolute so the copy works
    from anywhere. On a configured branch the repository's own file is returned.
    """
    doc = read_asv_conf(conf)
    root = conf.resolve().parent
    configured = list(doc.get("branches", []))
    present = [b for b in configured if _branch_exists(root, b)]
    if branch and branch != "HEAD" and branch not in present:
        present.append(branch)
    if present == configured:
        return conf
    if not present:
        raise ValueError(
            f"asv publish: none of the branches {configured} exists in {root}, and HEAD is detached"
        )
    doc["branches"] = present
    for key in ("repo", "results_dir", "html_dir", "env_dir", "benchmark_dir"):
        if key in doc:
            doc[key] = str((root / doc[key]).resolve())
    out = out_dir / f"asv.{re.sub(r'[^A-Za-z0-9_.-]', '_', '+'.join(present))}.conf.json"
    write_atomic(out, json.dumps(doc, indent=1) + "\n")
    return out


def _branch_exists(repo: Path, branch: str) -> bool:
    proc = subprocess.run(
        ["git", "rev-parse", "--verify", "--quiet", f"refs/heads/{branch}"], cwd=repo, capture_output=True
    )
    return proc.returncode == 0


def asv_env(
    suite: dict[str, Any],
    cells_path: Path,
    sharded: RunConfig | None = None,
    sharded_path: Path | None = None,
) -> dict[str, str]:
    """Environment of the asv benchmarks: the nightly's grids and its measured cells (the
    sharded benchmarks are off when the night ran no sharded suite)."""
    env = {
        ASV_CELLS_ENV: str(cells_path.resolve()),
        "OPTIMUS_ASV_FAMILIES": ",".join(suite["models"]),
        "OPTIMUS_ASV_SCALES": str(suite["scale"]),
        "OPTIMUS_ASV_PHASES": ",".join(suite["phases"]),
        "OPTIMUS_ASV_SHARDED": "off",
    }
    if sharded is not None and sharded_path is not None:
        env.update({
            "OPTIMUS_ASV_SHARDED": "on",
            "OPTIMUS_ASV_SHARDED_CELLS": str(sharded_path.resolve()),
            "OPTIMUS_ASV_SHARDED_FAMILIES": ",".join(sharded.models),
            "OPTIMUS_ASV_SHARDED_SCALE": sharded.scale,
            "OPTIMUS_ASV_SHARDED_PHASES": ",".join(sharded.phases),
            "OPTIMUS_ASV_SHARDED_MODES": ",".join(sharded.modes),
            "OPTIMUS_ASV_SHARDED_NPROC": str(sharded.nproc),
        })  # fmt: skip
    return env


# --------------------------------------------------------------------------- summary


def _short(value: str) -> str:
    """asv prints track_ figures with every digit; four significant ones read better."""
    try:
        return f"{float(value):.4g}"
    except ValueError:
        return value


def _fmt_cfg(cfg: NightlyConfig) -> str:
    th = cfg.thresholds
    return (
        f"latency: Mann-Whitney U p < {th.alpha} and median change > {th.latency:.0%}; "
        f"peak memory > {th.memory:.0%} and > {th.memory_abs} B; compile time > {th.compile:.0%} and "
        f"> {th.compile_abs} s; asv factor {cfg.asv_factor}; reruns of a flagged cell: {cfg.max_reruns}"
    )


HISTORY_FILE = "history.jsonl"


@dataclass
class ChangePoints:
    active: bool  # enough nights of this machine for change points to gate
    alerts: list[str]  # "cell metric commit-range size (reason)" of tonight's alerts
    markdown: str
    open: set[tuple[str, str]] = field(
        default_factory=set
    )  # (cell, metric) whose latest change is an alerted regression
    found: list[SeriesResult] = field(default_factory=list)  # every series analysed (for the dashboard marks)


def change_points(
    path: Path,
    tonight: dict[str, Any],
    sha: str,
    flagged: list[tuple[str, str]],
    cfg: ChangeConfig,
    log: Callable[[str], None],
) -> ChangePoints:
    """Change points of this machine's history plus tonight, and tonight's alerts (see
    ``harness.nightly.alert_policy``). Without the detector installed: a note, and the pairwise gate
    alone decides, as before."""
    try:
        detector = cfg.make_detector()
        detector([1.0, 1.0, 1.0, 1.0])  # imports the library now, not halfway through
    except ImportError as e:
        return ChangePoints(False, [], f"Change points skipped: {e} (install with scripts/install-deps).")
    nights = history_store.read(path)
    machine = history_store.machine_key(tonight["env"])
    same, left_out = history_store.select(nights, machine)
    now = history_store.Night(0, machine, {"sha": sha, "flagged": [list(f) for f in flagged]}, tonight)
    same = [*same, now][-cfg.max_nights :]
    active = len(same) >= cfg.min_history
    notes = [f"{len(same)} night(s) of this machine ({history_store.describe_machine(machine)}); "
             f"detector {cfg.detector} (p < {cfg.max_pvalue}); policy {cfg.policy}."]  # fmt: skip
    notes += left_out
    if not active:
        notes.append(f"Fewer than {cfg.min_history} nights: the pairwise gate alone decides tonight.")
        return ChangePoints(False, [], "\n".join(notes) + "\n")
    found = [analyse(s, cfg, detector) for s in build_series(same)]
    alerts = []
    still_open = {
        (r.series.cell, r.series.metric)
        for r in found
        if r.changes and r.changes[-1].regression and alerts_of(r, r.changes[-1], cfg.policy.dedupe)
    }
    for r in found:
        for c, why in r.alerted_tonight():
            if r.series.values:
                rng = f"{r.series.shas[c.index - 1][:10]}..{r.series.shas[c.index][:10]}"
                alerts.append(f"{r.series.cell} {r.series.metric} {rng} {c.change * 100:+.1f}% ({why})")
    for a in alerts:
        log(f"change-point alert: {a}")
    markdown = "\n".join(notes) + "\n\n" + format_changes(found, cfg.policy.dedupe)
    return ChangePoints(True, alerts, markdown, still_open, found)


def summary_markdown(
    *,
    sha: str,
    dirty: bool | None,
    base: dict[str, Any] | None,
    cfg: NightlyConfig,
    outcome: HarnessOutcome | None,
    asv_rows: list[AsvRow] | None,
    asv_note: str,
    status: str,
    n_cells: int,
    elapsed_s: float,
    changes_md: str = "",
    sharded_note: str = "",
    paired_note: str = "",
    quality_note: str = "",
) -> str:
    head = {"pass": "PASS", "regression": "REGRESSION", "baseline": "BASELINE"}.get(status, status.upper())
    lines = [f"# Nightly {head}: {sha[:10]}{' (dirty tree)' if dirty else ''}", ""]
    if base is None:
        lines.append(f"No earlier passing nightly: this run ({n_cells} cells) is recorded as the baseline.")
    else:
        lines.append(
            f"Compared with nightly {base['sha'][:10]} of {base['date']} ({n_cells} cells, {elapsed_s:.0f} s)."
        )
    lines += ["", f"Thresholds: {_fmt_cfg(cfg)}.", ""]
    if paired_note:
        lines += [paired_note, ""]
    if sharded_note:
        lines += [sharded_note, ""]
    if quality_note:
        lines += [quality_note, ""]
    if outcome is not None:
        n = len({c for c, _ in outcome.confirmed})
        lines.append(
            f"## Harness cells: {len(outcome.confirmed)} confirmed regression(s) in {n} cell(s); "
            f"{len(outcome.first_flagged)} flagged before reruns"
        )
        lines += ["", compare.format_rows(outcome.rows), ""]
        if outcome.reruns:
            lines += [
                "### Reruns of flagged cells",
                "",
                "| cell | attempt | still flagged |",
                "| --- | --- | --- |",
            ]
            for rr in outcome.reruns:
                lines.append(f"| {rr.cell} | {rr.attempt} | {', '.join(rr.flagged) or 'no (cleared)'} |")
            lines.append("")
    if changes_md:
        lines += ["## Change points over the history", "", changes_md, ""]
    lines.append("## asv")
    lines.append("")
    if asv_note:
        lines += [asv_note, ""]
    if asv_rows:
        lines += [
            "| change | before | after | ratio | benchmark | verdict |",
            "| --- | --- | --- | --- | --- | --- |",
        ]
        order = {"regression": 0, "regression (report only)": 1, "improvement": 2}
        for r in sorted(asv_rows, key=lambda r: (order.get(r.verdict, 9), r.name)):
            v = f"**{r.verdict}**" if r.verdict == "regression" else r.verdict
            before, after = _short(r.before), _short(r.after)
            lines.append(f"| {r.mark or ' '} | {before} | {after} | {r.ratio} | {r.name} | {v} |")
        lines.append("")
    return "\n".join(lines)


# --------------------------------------------------------------------------- the command


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--config", default=str(DEFAULT_CONFIG), help="nightly config (suite, thresholds)")
    p.add_argument(
        "--store", default=str(DEFAULT_STORE), help="where nights are kept (default results/nightly)"
    )
    p.add_argument("--base", help="compare with this results file instead of the last passing nightly")
    p.add_argument("--models", help="override suite.models (comma list)")
    p.add_argument("--scale", help="override suite.scale")
    p.add_argument("--modes", help="override suite.modes (comma list)")
    p.add_argument("--phases", help="override suite.phases (comma list)")
    p.add_argument("--threads", type=int, help="override suite.threads (torch threads per cell; 0: default)")
    p.add_argument("--device", default="auto", help="cpu, cuda or auto")
    p.add_argument("--no-asv", action="store_true", help="skip the asv part (harness cells only)")
    p.add_argument(
        "--no-sharded", action="store_true", help="skip the config's sharded suite (its torchrun cells)"
    )
    p.add_argument(
        "--unpaired",
        action="store_true",
        help="do not pair tonight's cells with the base night's commit (compare separate nights only)",
    )
    p.add_argument(
        "--auto-bisect",
        action="store_true",
        help="run `optimus-bench bisect` for each confirmed latency regression (otherwise its command is printed)",
    )
    p.add_argument(
        "--no-quality", action="store_true", help="skip the config's training-quality gate (tonight's family)"
    )
    p.add_argument("--asv-config", default=str(REPO_ROOT / "asv.conf.json"))
    p.add_argument("--publish", action="store_true", help="also `asv publish` the dashboard (results/html)")
    p.add_argument("--asv-machine", help="asv machine name (default: asv's, from ~/.asv-machine.json)")
    p.add_argument("--summary", help="also append the markdown summary here (e.g. $GITHUB_STEP_SUMMARY)")
    p.add_argument("--no-progress", action="store_true")
    p.add_argument("--provider", default=DEFAULT_PROVIDER, help=argparse.SUPPRESS)


@dataclass
class _Night:
    """What the steps of one night share: its settings, its commit and where it writes."""

    args: argparse.Namespace
    cfg: NightlyConfig
    suite: dict[str, Any]
    run_cfg: RunConfig
    store: Path
    history: dict[str, Any]
    given_base: dict[str, Any] | None
    git: dict[str, Any]
    sha: str
    new_rel: str  # runs/<stamp>-<sha8>.json, relative to the store
    t0: float
    sharded_cfg: RunConfig | None = None  # the config's sharded suite, unless skipped
    quality_cfg: RunConfig | None = None  # tonight's family of the quality gate, unless skipped

    @property
    def new_path(self) -> Path:
        return self.store / self.new_rel

    @property
    def sharded_rel(self) -> str:
        return self.new_rel.replace(".json", ".sharded.json")

    @property
    def quality_rel(self) -> str:
        return self.new_rel.replace(".json", ".quality.json")

    @property
    def asv_log(self) -> str:
        return self.new_rel.replace(".json", ".asv.log")

    @staticmethod
    def log(msg: str) -> None:
        print(f"nightly: {msg}", file=sys.stderr, flush=True)


@dataclass
class _AsvOutcome:
    rows: list[AsvRow] | None = None
    note: str = ""
    regressed: bool = False
    ran: bool = False
    failed: bool = False


def main_from_args(args: argparse.Namespace) -> int:
    """One night (see the module docstring): settings, measure, pair, compare, asv, judge, record."""
    night = _prepare(args)
    from harness.run.runner import run_one, run_suite

    night.log(f"measuring {len(night.run_cfg.cells())} cells of {night.sha[:10]} into {night.new_path}")
    new = run_suite(night.run_cfg, night.new_path, progress=not args.no_progress)
    base_entry, base_doc = _base(night)
    peaks = new["env"].get("peaks")
    paired = _paired_step(night, base_entry, new)

    def measure_again(key: CellKey, cfg: dict[str, Any], timeout_s: float) -> dict[str, Any]:
        # A re-measured cell replaces the night's: its floor divides by the night's peaks too;
        # on a paired night it is paired again, in fresh workers.
        cell = run_one(key, cfg, timeout_s, peaks)
        if paired.base_sha:
            paired.merge_again(night, key, cell)
        return cell

    outcome = _confirm(night, base_doc, new, measure_again)
    sharded = _sharded_step(night, base_entry)
    outcome = _joined(outcome, sharded.outcome)
    trained = _quality_step(night)
    asv = _asv_step(night, base_entry, new, measure_again)
    flagged_now = sorted(outcome.confirmed) if outcome is not None else []
    cp = change_points(night.store / HISTORY_FILE, new, night.sha, flagged_now, night.cfg.changes, night.log)
    uncompared = [new] if base_doc is None else []
    if sharded.doc is not None and sharded.outcome is None:
        uncompared.append(sharded.doc)
    if trained.doc is not None:  # judged against eager in each cell: a quality_mismatch is lost data
        uncompared.append(trained.doc)
    status = _status(outcome, base_doc, uncompared, asv, cp)
    paired.bisect_confirmed(night, outcome)
    _record(night, new, base_entry, outcome, asv, cp, status, flagged_now, sharded, trained, paired)
    rc = {
        "regression": exit_codes.REGRESSION,  # "flagged" is 0: recorded, not alerted, never a base
        "incomplete": exit_codes.INCOMPLETE,
        "error": exit_codes.TOOL_FAILED,
    }.get(status, exit_codes.OK)
    if args.publish and asv.ran and not _publish(night, cp):
        rc = rc or exit_codes.TOOL_FAILED
    return rc


@dataclass
class _PairedOutcome:
    """The paired part of a night: the base commit it paired with, or why it did not."""

    base_sha: str | None = None
    why_not: str = ""
    doc: dict[str, Any] | None = None
    rel: str = ""
    bisects: list[str] = field(default_factory=list)

    def merge_again(self, night: _Night, key: CellKey, cell: dict[str, Any]) -> None:
        from harness.nightly import paired_night

        assert self.base_sha is not None
        night.log(f"pairing {key.label()} again with {self.base_sha[:10]}")
        again = paired_night.pair_cells(REPO_ROOT, self.base_sha, [key], night.cfg.paired, _pair_options(night),
                                        None, night.log, _injected())  # fmt: skip
        paired_night.merge({"cells": [cell]}, again)

    def bisect_confirmed(self, night: _Night, outcome: HarnessOutcome | None) -> None:
        """The bisect command of every confirmed latency regression; run with --auto-bisect."""
        from harness.nightly import paired_night

        if not self.base_sha or outcome is None:
            return
        keys = {r.cell for r in outcome.rows if r.metric == "latency_ms" and r.verdict == "regression"}
        by_label = {compare.cell_label(c): CellKey.of(c) for c in (self.doc or {}).get("cells", [])}
        for label in sorted(keys):
            if label not in by_label:
                continue
            key = by_label[label]
            cmd = paired_night.bisect_command(self.base_sha, night.sha, key, night.cfg.paired.threshold)
            line = f"- {label}: `{cmd}`"
            if night.args.auto_bisect and night.sha != self.base_sha:
                line += "\n" + _auto_bisect(night, self.base_sha, key)
            self.bisects.append(line)

    def note(self) -> str:
        if self.base_sha is None:
            return f"Not paired: {self.why_not}." if self.why_not else ""
        cells = (self.doc or {}).get("cells", [])
        unstable = [
            compare.cell_label(c) for c in cells if (c.get("paired") or {}).get("verdict") == "unstable"
        ]
        text = (
            f"Paired with the base commit {self.base_sha[:10]}: {len(cells)} cell(s) timed side by side "
            f"({self.rel}, {(self.doc or {}).get('wall_s', 0):.0f} s); a cell's latency verdict is its "
            f"paired interval against {night_threshold(self.doc):.1%}."
        )
        if unstable:
            text += f" Not judged, their processes disagreed: {', '.join(unstable)}."
        if self.bisects:
            text += "\n\nTo find the commit of each confirmed latency regression:\n\n" + "\n".join(
                self.bisects
            )
        return text


def night_threshold(doc: dict[str, Any] | None) -> float:
    return float(((doc or {}).get("config") or {}).get("threshold", 0.0))


def _injected() -> dict[str, str]:
    """An injected slowdown (the nightly's own tests) is tonight's: the new side's workers only."""
    from harness.measure.timing import INJECT_SLOWDOWN_ENV

    value = os.environ.get(INJECT_SLOWDOWN_ENV, "").strip()
    return {INJECT_SLOWDOWN_ENV: value} if value else {}


def _pair_options(night: _Night) -> Any:
    s = night.run_cfg
    return night.cfg.paired.options(s.device, int(s.threads or 0), s.provider, int(s.seed))


def _paired_step(night: _Night, base_entry: dict[str, Any] | None, new: dict[str, Any]) -> _PairedOutcome:
    """Pair tonight's cells with the base night's commit and merge the pairs into ``new``."""
    from harness.nightly import paired_night
    from harness.run.checkouts import CheckoutError

    if night.args.unpaired or not night.cfg.paired.enabled:
        return _PairedOutcome(why_not="--unpaired" if night.args.unpaired else "paired.enabled is false")
    if base_entry is None:
        return _PairedOutcome(why_not="no base night")
    base_sha = paired_anchor(night.history, base_entry, night.cfg.paired.anchor_nights)
    try:
        from harness.run import checkouts

        base_sha = checkouts.resolve(REPO_ROOT, base_sha)
    except CheckoutError:
        return _PairedOutcome(
            why_not=f"the base {base_sha[:12] or '(no commit)'} is not a commit of this repository"
        )
    keys = [CellKey.of(c) for c in new["cells"]]
    rel = night.new_rel.replace(".json", ".paired.json")
    night.log(f"pairing {len(keys)} cells with the base commit {base_sha[:10]} into {night.store / rel}")
    doc = paired_night.pair_cells(REPO_ROOT, base_sha, keys, night.cfg.paired, _pair_options(night),
                                  night.store / rel, night.log, _injected())  # fmt: skip
    paired_night.merge(new, doc)
    results.save_atomic(night.new_path, new)
    return _PairedOutcome(base_sha=base_sha, doc=doc, rel=rel)


def _auto_bisect(night: _Night, base_sha: str, key: CellKey) -> str:
    from harness.diagnose import bisect as bisect_mod

    night.log(f"bisecting {key.label()} between {base_sha[:10]} and {night.sha[:10]}")
    try:
        doc = bisect_mod.bisect(REPO_ROOT, base_sha, night.sha, (key.model, key.scale, key.mode, key.phase),
                                _pair_options(night), threshold=night.cfg.paired.threshold, log=night.log)  # fmt: skip
    except (ValueError, RuntimeError) as e:
        return f"  bisect: {e}"
    return f"  bisect: first slower commit {doc['first_slower'][:12]}; {doc['confidence']}"


def _prepare(args: argparse.Namespace) -> _Night:
    """Settings from the config and the command line; every input and output is checked here,
    before the measurement, not after it."""
    t0 = time.perf_counter()
    cfg = load_config(args.config)
    suite = dict(cfg.suite)
    for name in ("models", "scale", "modes", "phases", "threads"):
        if getattr(args, name) is not None:
            suite[name] = getattr(args, name)
    run_cfg = run_config(suite, args.provider, resolve_device(args.device))
    suite.update({k: getattr(run_cfg, k) for k in ("models", "modes", "phases", "scale")})
    store = check_output_dir(args.store, "--store")
    check_output_dir(store / "runs", "--store")
    if args.summary:
        check_output_file(args.summary, "--summary")
    history = load_history(store)
    history_store.read(store / HISTORY_FILE)  # another schema or a damaged line: refused before measuring
    given_base = results.load(args.base) if args.base else None
    git = git_info()
    sha = git["sha"] or "unknown"
    stamp = time.strftime("%Y%m%dT%H%M%SZ", time.gmtime())
    new_rel, n = f"runs/{stamp}-{sha[:8]}.json", 1
    while (store / new_rel).exists():  # two nights in one second must not share a file
        n += 1
        new_rel = f"runs/{stamp}-{sha[:8]}-{n}.json"
    sharded_cfg = None
    if cfg.sharded is not None and not args.no_sharded:
        sharded_cfg = run_config(cfg.sharded, args.provider, resolve_device(args.device))
    quality_cfg = None
    if cfg.quality is not None and not args.no_quality:
        quality_cfg = quality_run_config(cfg.quality, args.provider, resolve_device(args.device),
                                         len(history["runs"]))  # fmt: skip
    return _Night(
        args, cfg, suite, run_cfg, store, history, given_base, git, sha, new_rel, t0, sharded_cfg, quality_cfg,
    )  # fmt: skip


def _base(night: _Night) -> tuple[dict[str, Any] | None, dict[str, Any] | None]:
    """The night to compare with: ``--base`` if given, else the last one that passed."""
    if night.given_base is not None:
        doc = night.given_base
        given_sha = ((doc.get("env") or {}).get("git") or {}).get("sha") or "given"
        return {"sha": given_sha, "date": "-", "results": str(Path(night.args.base).resolve())}, doc
    entry = last_good(night.history, night.store)
    return entry, results.load(night.store / entry["results"]) if entry else None


def _confirm(
    night: _Night,
    base_doc: dict[str, Any] | None,
    new: dict[str, Any],
    run_one: Callable[[CellKey, dict[str, Any], float], dict[str, Any]],
) -> HarnessOutcome | None:
    """Compare with the base, re-measuring flagged cells; the stored results get the reruns."""
    if base_doc is None:
        return None
    cell_cfg = dict(new["config"])

    def rerun(key: CellKey) -> dict[str, Any]:
        night.log(f"re-measuring flagged cell {key.label()}")
        return run_one(key, cell_cfg, night.run_cfg.timeout_s)

    outcome = confirm_regressions(base_doc, new, night.cfg.thresholds, rerun, night.cfg.max_reruns)
    results.save_atomic(night.new_path, new)
    return outcome


@dataclass
class _ShardedOutcome:
    doc: dict[str, Any] | None = None  # tonight's sharded cells (None: not run)
    outcome: HarnessOutcome | None = None  # against the base night's sharded cells, if it has them
    note: str = ""


def _sharded_step(night: _Night, base_entry: dict[str, Any] | None) -> _ShardedOutcome:
    """The sharded suite: its cells (torchrun jobs, ``harness.run.sharded``) in their own results
    file beside the night's, compared with the base night's sharded file, flagged cells
    re-measured as the single-process ones are. A base without one: recorded, not compared."""
    cfg = night.sharded_cfg
    if cfg is None:
        return _ShardedOutcome()
    from harness.run.runner import run_suite
    from harness.run.sharded.launch import run_sharded

    path = night.store / night.sharded_rel
    night.log(f"measuring {len(cfg.cells())} sharded cell(s) ({cfg.nproc} ranks, {cfg.sharding}) into {path}")
    doc = run_suite(cfg, path, progress=not night.args.no_progress)
    rel = (base_entry or {}).get("sharded_results")
    if base_entry is None:
        return _ShardedOutcome(doc, None, "")
    if not rel or not (night.store / rel).exists():
        note = f"Sharded cells ({len(doc['cells'])}): recorded; the base night has none to compare with."
        return _ShardedOutcome(doc, None, note)
    base = results.load(night.store / rel)
    cell_cfg = dict(doc["config"])
    plans = {c["model"]: c.get("plan") for c in doc["cells"] if c.get("plan") is not None}

    def rerun(key: CellKey) -> dict[str, Any]:
        night.log(f"re-measuring flagged sharded cell {key.label()}")
        return run_sharded(key, cell_cfg, cfg.timeout_s, plans.get(key.model))

    outcome = confirm_regressions(base, doc, night.cfg.thresholds, rerun, night.cfg.max_reruns)
    results.save_atomic(path, doc)
    note = f"Sharded cells ({len(doc['cells'])}, {cfg.nproc} ranks): compared with `{rel}`."
    return _ShardedOutcome(doc, outcome, note)


@dataclass
class _QualityOutcome:
    doc: dict[str, Any] | None = None  # tonight's quality cells (None: not run)
    note: str = ""


def _quality_step(night: _Night) -> _QualityOutcome:
    """Tonight's family of the training-quality gate: its cells in their own results file beside
    the night's. Each cell is judged against eager inside it, so there is no base to compare
    with: a cell that is not ok (``quality_mismatch`` included) makes the night incomplete."""
    cfg = night.quality_cfg
    if cfg is None:
        return _QualityOutcome()
    from harness.run.runner import run_suite

    path = night.store / night.quality_rel
    fams = list((night.cfg.quality or {}).get("families", []))
    turn = f"family {fams.index(cfg.models[0]) + 1} of {len(fams)} in turn" if cfg.models[0] in fams else ""
    night.log(f"training-quality gate: {cfg.models[0]}/{cfg.scale}, {len(cfg.cells())} cell(s) into {path}")
    doc = run_suite(cfg, path, progress=not night.args.no_progress)
    bad = [c for c in doc["cells"] if c["status"] != "ok"]
    head = (f"Training quality ({cfg.models[0]}/{cfg.scale}, {turn}; {cfg.quality_steps} steps x "
            f"{cfg.quality_seeds} seeds per mode, `{night.quality_rel}`): ")  # fmt: skip
    if not bad:
        return _QualityOutcome(doc, head + f"all {len(doc['cells'])} cell(s) train like eager.")
    rows = [f"- {CellKey.of(c).label()}: **{c['status']}**: {str(c.get('error'))[:400]}" for c in bad]
    return _QualityOutcome(doc, head + f"**{len(bad)} of {len(doc['cells'])} cell(s) not ok** (lost data):\n\n"
                           + "\n".join(rows))  # fmt: skip


def _joined(a: HarnessOutcome | None, b: HarnessOutcome | None) -> HarnessOutcome | None:
    """One outcome of the single-process and the sharded comparisons (their labels differ)."""
    if a is None or b is None:
        return a if b is None else b
    return HarnessOutcome(a.rows + b.rows, a.first_flagged | b.first_flagged, a.confirmed | b.confirmed,
                          a.reruns + b.reruns)  # fmt: skip


def _asv_step(
    night: _Night,
    base_entry: dict[str, Any] | None,
    new: dict[str, Any],
    run_one: Callable[[CellKey, dict[str, Any], float], dict[str, Any]],
) -> _AsvOutcome:
    """The asv part, unless skipped; a failure is recorded in the note, not raised."""
    args, cfg = night.args, night.cfg
    if args.no_asv or not cfg.asv_enabled:
        return _AsvOutcome(note="asv part skipped (--no-asv or asv.enabled=false).")
    if night.git["dirty"]:
        return _AsvOutcome(
            note="asv part skipped: the working tree has uncommitted changes, and asv measures commits."
        )
    out = _AsvOutcome(ran=True)
    try:
        out.rows, out.note, out.regressed = _asv_part(
            cfg,
            night.suite,
            night.sha,
            base_entry,
            new,
            night.new_path,
            night.run_cfg,
            run_one,
            night.log,
            Path(args.asv_config),
            args.asv_machine,
            night.store / night.asv_log,
            night.sharded_cfg,
            night.store / night.sharded_rel,
        )
    except (RuntimeError, OSError) as e:  # record the night; it is not a pass
        out.failed = True
        out.note = f"**asv part failed**: {str(e)[:1500]}"
        night.log(f"asv part failed: {e}")
    out.note += f" asv output: `{night.asv_log}`."
    return out


def _status(
    outcome: HarnessOutcome | None,
    base_doc: dict[str, Any] | None,
    uncompared: list[dict[str, Any]],
    asv: _AsvOutcome,
    cp: ChangePoints,
) -> str:
    """The night's verdict: incomplete, regression, flagged, error, baseline or pass.

    ``uncompared``: tonight's results that had no base (the first night's cells, sharded cells
    of a base night without any): nothing to compare, but a failed cell there is no pass."""
    lost = [] if outcome is None else compare.incomplete(outcome.rows)
    for d in uncompared:
        lost += [r for r in compare.compare_docs(d, d) if r.verdict in compare.INCOMPLETE_VERDICTS]
    confirmed_regressions = {
        (r.cell, r.metric) for r in (outcome.rows if outcome else []) if r.verdict == "regression"
    }
    harness_regressed = bool(confirmed_regressions)
    if lost:
        return "incomplete"  # recorded, never a base
    if (
        asv.regressed
        or cp.alerts
        or (harness_regressed and not cp.active)
        or (confirmed_regressions & cp.open)
    ):
        return "regression"  # a confirmed regression of an alerted, unfixed change stays red
    if harness_regressed:
        return (
            "flagged"  # the pairwise gate alone, with enough history to ask the detector: no alert, no base
        )
    if asv.failed:
        return "error"  # recorded, never a base
    return "baseline" if base_doc is None else "pass"


def _record(
    night: _Night,
    new: dict[str, Any],
    base_entry: dict[str, Any] | None,
    outcome: HarnessOutcome | None,
    asv: _AsvOutcome,
    cp: ChangePoints,
    status: str,
    flagged_now: list[tuple[str, str]],
    sharded: _ShardedOutcome,
    trained: _QualityOutcome,
    paired: _PairedOutcome | None = None,
) -> None:
    """Write the summary, the history entry and the night's history line; print the summary."""
    store, git = night.store, night.git
    text = summary_markdown(
        sha=night.sha,
        dirty=git["dirty"],
        base=base_entry,
        cfg=night.cfg,
        outcome=outcome,
        asv_rows=asv.rows,
        asv_note=asv.note,
        status=status,
        n_cells=sum(len(d["cells"]) for d in (new, sharded.doc, trained.doc) if d is not None),
        elapsed_s=time.perf_counter() - night.t0,
        changes_md=cp.markdown,
        sharded_note=sharded.note,
        paired_note=paired.note() if paired else "",
        quality_note=trained.note,
    )
    summary_rel = night.new_rel.replace(".json", ".md")
    write_atomic(store / summary_rel, text + "\n")
    entry = {
        "sha": night.sha,
        "dirty": git["dirty"],
        "branch": git["branch"],
        "date": time.strftime("%Y-%m-%d %H:%M:%SZ", time.gmtime()),
        "results": night.new_rel,
        "summary": summary_rel,
        "status": "pass" if status == "baseline" else status,
        "base": base_entry["sha"] if base_entry else None,
        "base_results": base_entry["results"] if base_entry else None,
        "asv": asv.ran and not asv.failed,
        "paired_base": paired.base_sha if paired else None,
    }
    if sharded.doc is not None:
        entry["sharded_results"] = night.sharded_rel
    if trained.doc is not None:
        entry["quality_results"] = night.quality_rel
    history = load_history(store)  # re-read: another night may have finished meanwhile
    history["runs"].append(entry)
    write_atomic(store / "history.json", json.dumps(history, indent=1) + "\n")
    line = {k: entry[k] for k in ("sha", "dirty", "branch", "date", "status", "base")}
    history_store.append(store / HISTORY_FILE, new, {**line, "flagged": [list(f) for f in flagged_now]})
    print(text)
    if night.args.summary:
        with open(night.args.summary, "a", encoding="utf-8") as f:
            f.write(text + "\n")
    night.log(f"{status}; summary in {store / summary_rel}")


def _publish(night: _Night, cp: ChangePoints) -> bool:
    """``asv publish`` the dashboard and mark tonight's change points; False if it failed (the
    night is recorded either way)."""
    args = night.args
    try:
        pub_conf = asv_config_for_branch(
            Path(args.asv_config), night.git["branch"], REPO_ROOT / "results" / "tmp"
        )
        Asv(pub_conf, night.log, args.asv_machine, night.store / night.asv_log)("publish")
        night.log(f"dashboard published to results/html ({pub_conf.name}); see docs/asv.md to view it")
        mark_changes(pub_conf, cp, night.cfg.changes, night.log)
    except (RuntimeError, ValueError, OSError) as e:
        night.log(f"asv publish failed: {e}")
        return False
    return True


def mark_changes(pub_conf: Path, cp: ChangePoints, cfg: ChangeConfig, log: Callable[[str], None]) -> None:
    """Mark tonight's change points on the dashboard just published (``harness.nightly.asv_marks``)."""
    from harness.nightly.asv_marks import mark_dashboard, marks_of

    html = Path(read_asv_conf(pub_conf).get("html_dir", "html"))
    html = html if html.is_absolute() else pub_conf.parent / html
    marked = mark_dashboard(html, marks_of(cp.found, dedupe=cfg.policy.dedupe))
    log(f"{len(marked.placed)} change point(s) marked on the dashboard")
    for why in marked.skipped:
        log(f"  not marked: {why}")


def _asv_part(
    cfg: NightlyConfig,
    suite: dict[str, Any],
    sha: str,
    base_entry: dict[str, Any] | None,
    new: dict[str, Any],
    new_path: Path,
    run_cfg: RunConfig,
    run_one: Callable[[CellKey, dict[str, Any], float], dict[str, Any]],
    log: Callable[[str], None],
    conf: Path,
    machine: str | None,
    logfile: Path,
    sharded: RunConfig | None = None,
    sharded_path: Path | None = None,
) -> tuple[list[AsvRow] | None, str, bool]:
    """Run the asv suite on ``sha`` fed with the nightly's cells; compare with the base commit."""
    asv = Asv(conf, log, machine, logfile)
    asv.ensure_machine()
    env = asv_env(suite, new_path, sharded, sharded_path)
    asv.run(sha, cfg.asv_bench, cfg.asv_quick, env)
    if base_entry is None:
        return None, "asv figures recorded for this commit; no base to compare with.", False
    base_sha = base_entry["sha"]
    if base_sha == sha:
        return (
            None,
            f"asv figures recorded; the base night is the same commit ({sha[:10]}), nothing to compare.",
            False,
        )
    if not base_entry.get("asv", False):
        return None, f"the base night {base_sha[:10]} has no asv results; asv figures recorded only.", False
    rows = asv.compare(base_sha, sha, cfg.asv_factor)
    classify_asv(rows, cfg.higher_is_better, cfg.report_only)
    flagged = [r for r in rows if r.verdict == "regression"]
    for attempt in range(1, cfg.max_reruns + 1):
        if not flagged:
            break
        benches: set[str] = set()
        for r in flagged:
            bench = r.name.split("(")[0]
            benches.add(f"^{re.escape(bench)}$")
            params = cell_params(r.name) if bench.startswith(CELL_BENCH_PREFIX) else None
            if params and len(params) >= 3:
                family, scale, phase = params[:3]
                for mode in mode_registry.asv_modes():
                    key = CellKey(family, scale, mode, phase)
                    log(f"re-measuring cell {key.label()} behind asv figure {r.name}")
                    results.upsert_cell(new, run_one(key, dict(new["config"]), run_cfg.timeout_s))
        results.save_atomic(new_path, new)
        log(f"asv rerun {attempt}: {sorted(benches)}")
        asv.run(sha, sorted(benches), cfg.asv_quick, env)
        rows2 = asv.compare(base_sha, sha, cfg.asv_factor)
        classify_asv(rows2, cfg.higher_is_better, cfg.report_only)
        still = {r.name for r in rows2 if r.verdict == "regression"}
        by_name = {r.name: r for r in rows2}
        for r in flagged:
            if r.name not in still:
                r.verdict = "not confirmed"
                if r.name in by_name:
                    r.after, r.ratio = by_name[r.name].after, by_name[r.name].ratio
        flagged = [r for r in flagged if r.name in still]
    note = f"asv results of {base_sha[:10]} -> {sha[:10]}, compared as `asv compare --factor {cfg.asv_factor}` does."
    return rows, note, bool(flagged)
