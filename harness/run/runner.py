"""Run every cell of a configuration, each in a subprocess, writing results as it goes.

Why this shape: a benchmark run of the whole suite takes minutes to hours; it must survive
a cell that segfaults, runs out of memory or hangs (the cell is recorded as failed or
timeout with its error, the run goes on), and an interrupted run must not lose finished
cells (the results file is rewritten atomically after every cell; ``resume=True`` skips
cells already in it).
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from harness.env import REPO_ROOT, collect_env
from harness.measure import roofline
from harness.modes import mode_registry
from harness.run.process_env import child_env
from harness.spec import CellKey, RunConfig
from harness.store import cell_record, results

# Fields of the config that decide what a cell measures; a resumed run must agree on them.
RESUME_FIELDS = (
    "scale", "device", "seed", "warmup", "min_iters", "max_iters", "budget_s", "threads", "atol", "rtol", "provider",
    "nproc", "sharding", "quality_steps", "quality_seeds", "quality_every", "quality_heldout", "quality_lr",
)  # fmt: skip


def _tail(path: Path, lines: int = 12) -> str:
    try:
        text = path.read_text(errors="replace")
    except OSError:
        return ""
    return "\n".join(text.strip().splitlines()[-lines:])


def _kill_group(proc: subprocess.Popen[bytes]) -> None:
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(proc.pid, signal.SIGKILL)
    proc.wait()


def run_one(
    key: CellKey, config: dict[str, Any], timeout_s: float, peaks: dict[str, Any] | None = None
) -> dict[str, Any]:
    """Run one cell in a fresh process (its own session, so a timeout kills its compile workers).
    ``peaks``: the run's machine peaks, which the cell divides its floor by (none: no floor)."""

    with tempfile.TemporaryDirectory(prefix="optimus-bench-cell-") as tmp:
        spec_path, out_path, err_path = Path(tmp, "spec.json"), Path(tmp, "out.json"), Path(tmp, "stderr.txt")
        spec = {
            "model": key.model,
            "scale": key.scale,
            "mode": key.mode,
            "phase": key.phase,
            "config": config,
            "peaks": peaks,
        }
        spec_path.write_text(json.dumps(spec))
        # A quality run (``--quality STEPS``) trains instead of timing: harness/run/quality.py.
        module = "harness.run.quality" if config.get("quality_steps") else "harness.run.cell"
        cmd = [sys.executable, "-m", module, str(spec_path), str(out_path)]
        t0 = time.perf_counter()
        with open(err_path, "wb") as err:
            proc = subprocess.Popen(
                cmd,
                stdout=err,
                stderr=subprocess.STDOUT,
                env=child_env(str(Path(tmp, "inductor-cache")), int(config.get("threads") or 0)),
                cwd=str(REPO_ROOT),
                start_new_session=True,
            )
            try:
                rc = proc.wait(timeout=timeout_s)
            except subprocess.TimeoutExpired:
                _kill_group(proc)
                cell = cell_record.empty(key)
                cell["status"] = "timeout"
                cell["error"] = f"cell did not finish within {timeout_s:g} s and was killed"
                cell["log_tail"] = _tail(err_path)
                cell["wall_s"] = time.perf_counter() - t0
                return cell
            except BaseException:
                _kill_group(proc)
                raise
        wall = time.perf_counter() - t0
        try:
            cell = json.loads(out_path.read_text())
        except (OSError, json.JSONDecodeError):
            cell = cell_record.empty(key)
            how = f"killed by signal {-rc}" if rc < 0 else f"exit status {rc}"
            cell["error"] = (
                f"cell process crashed ({how}) before writing a result: {_tail(err_path, 3) or 'no output'}"
            )
            cell["log_tail"] = _tail(err_path)
        else:
            if cell.get("status") != "ok":
                cell.setdefault("log_tail", _tail(err_path))
        cell["wall_s"] = wall
        cell["finished_at"] = time.time()
        return cell


class LineProgress:
    """The progress bar's calls, printed as one line per finished cell (``3/40 cells [12 s]
    label: ok``). Why: where stderr is a log or a pipe (CI, the GPU machine's captured output),
    tqdm's carriage-return redraws pile up into one unreadable line."""

    def __init__(self, total: int, done: int) -> None:
        self.total, self.n, self.label, self.t0 = total, done, "", time.perf_counter()

    def set_postfix_str(self, label: str) -> None:
        self.label = label

    def update(self, k: int) -> None:
        self.n += k
        print(f"{self.n}/{self.total} cells [{time.perf_counter() - self.t0:.0f} s] {self.label}",
              file=sys.stderr, flush=True)  # fmt: skip

    def write(self, text: str) -> None:
        print(text, file=sys.stderr, flush=True)

    def close(self) -> None:
        pass


def line_summary(cell: dict[str, Any]) -> str:
    """``towers/tiny/compile/infer: ok, 0.61 ms, compile 8.2 s, 14 s in all`` (LineProgress)."""
    text = f"{CellKey.of(cell).label()}: {cell['status']}"
    median = (cell.get("latency_ms") or {}).get("median")
    if median is not None:
        text += f", {median:.3g} ms"
    if cell.get("compile_s"):
        text += f", compile {cell['compile_s']:.1f} s"
    return text + f", {cell.get('wall_s', 0.0):.0f} s in all"


# Fields added after files were written: a file without one was run with this value.
RESUME_DEFAULTS: dict[str, Any] = {"nproc": 1, "sharding": "auto", "quality_steps": 0, "quality_seeds": 3,
                                   "quality_every": 10, "quality_heldout": 128, "quality_lr": 0.5}  # fmt: skip


def _check_resumable(doc: dict[str, Any], config: dict[str, Any], path: Path) -> None:
    old = {**RESUME_DEFAULTS, **doc["config"]}
    config = {**RESUME_DEFAULTS, **config}
    single = int(old.get("nproc") or 1) == 1 and int(config.get("nproc") or 1) == 1
    diff = [f for f in RESUME_FIELDS if old.get(f) != config.get(f) and not (single and f == "sharding")]
    if diff:
        details = ", ".join(f"{f}: {old.get(f)!r} in file vs {config.get(f)!r} now" for f in diff)
        raise ValueError(f"--resume: {path} was written with a different configuration ({details})")


def run_suite(
    cfg: RunConfig,
    out: str | os.PathLike[str],
    *,
    resume: bool = False,
    retry_failed: bool = False,
    progress: bool = True,
    on_cell: Callable[[dict[str, Any]], None] | None = None,
    sharded_plans: dict[str, dict[str, Any]] | None = None,
) -> dict[str, Any]:
    """Run every cell of ``cfg`` not already done, writing ``out`` after each; return the document.

    With ``cfg.nproc > 1`` every cell is a torchrun job (``harness.run.sharded.launch``);
    ``sharded_plans`` (model -> plan JSON, made up front by ``run --nproc``) saves planning
    each model again, and a model missing from it is planned at its first cell."""
    path = Path(out)
    config = cfg.as_dict()
    for name in cfg.modes:  # run-level facts of a mode (compile+peer: the peer's pattern keys)
        run_info = mode_registry.get(name).run_info
        if run_info is not None:
            config.update(run_info())
    if resume and path.exists():
        doc = results.load(path)
        _check_resumable(doc, config, path)
        merged = dict(doc["config"])
        for name in ("models", "modes", "phases"):
            merged[name] = list(dict.fromkeys([*doc["config"].get(name, []), *config[name]]))
        merged.update({k: v for k, v in config.items() if k not in ("models", "modes", "phases")})
        doc["config"] = merged
        doc.setdefault("resumed", []).append(time.time())
    else:
        doc = results.new_results(collect_env(cfg.device), config)
    # Resumed: every recorded cell is finished, except failed/timeout ones if asked to retry.
    done = {
        k
        for k, c in results.cell_map(doc).items()
        if not (retry_failed and c["status"] in ("failed", "timeout"))
    }
    todo = [k for k in cfg.cells() if k not in done]
    if todo and cfg.nproc == 1 and not cfg.quality_steps and not doc["env"].get("peaks"):
        # Once per run, before the cells: every cell's floor divides by the same peaks (a resumed
        # run keeps the ones its first cells used).
        doc["env"]["peaks"] = roofline.measure_peaks(cfg.device, int(cfg.threads or 0), int(cfg.seed))
    results.save_atomic(path, doc)

    bar: Any = None
    if progress and not sys.stderr.isatty():  # a log file or a pipe: one plain line per cell
        bar = LineProgress(len(cfg.cells()), len(cfg.cells()) - len(todo))
    elif progress:
        from tqdm import tqdm

        bar = tqdm(total=len(cfg.cells()), initial=len(cfg.cells()) - len(todo), unit="cell", file=sys.stderr,
                   dynamic_ncols=True, bar_format="{l_bar}{bar}| {n_fmt}/{total_fmt} cells [{elapsed}<{remaining}] {postfix}")  # fmt: skip
    plans: dict[str, dict[str, Any]] = dict(sharded_plans or {})
    try:
        for key in todo:
            if bar is not None:
                bar.set_postfix_str(key.label())
            if cfg.nproc > 1:
                from harness.run.sharded.launch import run_sharded

                cell = run_sharded(key, config, cfg.timeout_s, plans.get(key.model))
                if cell.get("plan") is not None:
                    plans[key.model] = cell["plan"]
            else:
                cell = run_one(key, config, cfg.timeout_s, doc["env"].get("peaks"))
            results.upsert_cell(doc, cell)
            results.save_atomic(path, doc)
            if on_cell is not None:
                on_cell(cell)
            if isinstance(bar, LineProgress):
                bar.label = line_summary(cell)
            if bar is not None:
                bar.update(1)
                if cell["status"] != "ok":
                    bar.write(f"{key.label()}: {cell['status']}: {str(cell['error'])[:200]}")
    finally:
        if bar is not None:
            bar.close()
    return doc
