"""Paired measurement: two sides of one cell, each in worker processes of its own, timed in
alternating rounds by this process.

WHY: a ratio of two cells measured minutes apart carries the machine's drift between them (one
night's noise on the 2-core development machine is about 4.5%), and a compiled cell can run at
two speeds in two processes of the same commit. Here both sides are prepared first, then every
round times every worker in turn (the order reversed every other round: ABBA), so a drift hits
both sides alike, and each round gives one paired ratio. Each side runs in two or more
processes, so a process that happened to land on a slow layout shows as a spread between
processes, beside the spread between rounds, instead of as a regression.

A side is a checkout and a mode: two commits in one mode (``pair``, the nightly, ``bisect``) or
two modes of one commit. The worker (``pair_worker.py``) is the one protocol for all of them.

Figures of a pair (``ratio`` is new time over base time: above 1 is slower):

- ``ratio``: the median over rounds of mean(new workers' ms) / mean(base workers' ms), and its
  bootstrap 95% interval; a worker's ms in a round is the median of its ``steps`` steps, so one
  step that another process preempted does not decide the round, taken after untimed steps that
  fill ``round_warmup_ms`` in the same request (a worker that idled runs its first steps slower);
- ``process_spread``: per side, (slowest - fastest) / fastest of the workers' median ms;
- compile time: every worker's first call with caches off (at least ``compiles`` per side,
  spawned alternately);
- peak memory: one measured step of each side's first worker.
"""

from __future__ import annotations

import contextlib
import json
import math
import os
import queue
import signal
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from harness import stats
from harness.modes.builtin import CACHE_ENV
from harness.run.checkouts import WORKER, Checkout

MAX_ROUND_WARMUP = 200
"""At most this many untimed steps per turn, however short the step."""

STEP_TIMEOUT_S = 120.0
"""A worker that does not answer one round's steps within this is hung (a step is at most a
second or so at the scales paired)."""


class WorkerError(RuntimeError):
    """A worker crashed, hung or refused: the message names the side and the worker."""


@dataclass(frozen=True)
class SideSpec:
    """One side of the pair: what it runs (a checkout and a mode) and extra environment."""

    label: str
    checkout: Checkout
    mode: str
    env: dict[str, str] = field(default_factory=dict)


@dataclass(frozen=True)
class PairOptions:
    rounds: int = 15
    max_rounds: int = 45
    steps: int = 5
    warmup: int = 3
    processes: int = 2
    max_processes: int = 4
    compiles: int = 3
    process_spread: float = 0.05
    device: str = "cpu"
    seed: int = 0
    threads: int = 1
    atol: float = 1e-4
    rtol: float = 1e-3
    provider: str = "models:build"
    prepare_timeout_s: float = 1200.0
    round_warmup_ms: float = 50.0
    """Untimed steps at the start of every worker's turn, enough to fill this many ms (at most
    ``MAX_ROUND_WARMUP`` steps; 0: none). WHY: a worker that has idled while the others took their
    turns runs its next steps slower. On the 2-vCPU development machine, towers tiny compiled ran
    0.73-0.87 ms a step in rounds of 5 steps and 0.44-0.49 ms in rounds of 60. Two A/A pairs side
    by side, with and without this warm-up: the spread between processes 4.8% against 9.6% (tiny)
    and 1.7% against 11.6% (small), the per-round noise 14.7% against 16.6% and 8.0% against
    10.3%. Untimed steps in the same request, not a separate one: the worker must not idle
    between them and the timed steps. The parent drops them itself, so a worker of an older
    commit, which knows nothing of them, is measured alike. Every turn takes at least one."""

    def check(self) -> None:
        for name in ("rounds", "steps", "processes", "compiles"):
            if getattr(self, name) < 1:
                raise ValueError(f"{name}: must be >= 1, got {getattr(self, name)}")
        if self.warmup < 0:
            raise ValueError(f"warmup: must be >= 0, got {self.warmup}")
        if self.max_rounds < self.rounds:
            raise ValueError(f"max_rounds: must be >= rounds ({self.rounds}), got {self.max_rounds}")
        if self.max_processes < self.processes:
            raise ValueError(
                f"max_processes: must be >= processes ({self.processes}), got {self.max_processes}"
            )
        if not self.process_spread > 0:
            raise ValueError(f"process_spread: must be > 0, got {self.process_spread}")
        if not (math.isfinite(self.round_warmup_ms) and self.round_warmup_ms >= 0):
            raise ValueError(f"round_warmup_ms: must be a number >= 0, got {self.round_warmup_ms}")

    def round_warmup_steps(self, step_ms: float) -> int:
        """Untimed steps before a turn's timed ones, for a step of ``step_ms``."""
        if self.round_warmup_ms <= 0:
            return 0
        return min(MAX_ROUND_WARMUP, math.ceil(self.round_warmup_ms / max(step_ms, 1e-3)))


def worker_env(root: Path, threads: int, extra: dict[str, str]) -> dict[str, str]:
    """The checkout first on the path, caches off, OpenMP sized like torch's threads (the same
    settings as a ``run`` cell's process, ``harness.run.process_env``)."""
    env = dict(os.environ)
    env.pop("OPTIMUS_BENCH_INJECT_SLOWDOWN", None)  # only a side's own ``extra`` may inject
    if threads > 0:
        env["OMP_NUM_THREADS"] = str(threads)
    env["PYTHONPATH"] = str(root) + (os.pathsep + env["PYTHONPATH"] if env.get("PYTHONPATH") else "")
    env.update(CACHE_ENV)
    env.update(extra)
    return env


class Worker:
    """One worker process of one side; ``ask`` sends a request and waits for its reply."""

    def __init__(self, side: SideSpec, index: int, threads: int, scratch: Path) -> None:
        self.side, self.index = side, index
        self.name = f"{side.label} worker {index} ({side.checkout.sha[:12]}, {side.mode})"
        self.step_ms = float("inf")  # its last turn's median step (sizes the next turn's warm-up)
        cache = scratch / f"{side.label}-{index}-cache"
        env = worker_env(side.checkout.root, threads, side.env)
        env["TORCHINDUCTOR_CACHE_DIR"] = str(cache)
        env["TRITON_CACHE_DIR"] = str(cache / "triton")
        self.stderr_path = scratch / f"{side.label}-{index}.stderr"
        self._err = open(self.stderr_path, "wb")  # noqa: SIM115 - closed in close()
        self.proc = subprocess.Popen(
            [sys.executable, str(WORKER)], cwd=side.checkout.root, env=env,
            stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=self._err, text=True, bufsize=1,
            start_new_session=True,  # its own group: a kill takes Inductor's compile workers too
        )  # fmt: skip
        self._replies: queue.Queue[str | None] = queue.Queue()
        threading.Thread(target=self._read, daemon=True).start()

    def _read(self) -> None:
        assert self.proc.stdout is not None
        for line in self.proc.stdout:
            self._replies.put(line)
        self._replies.put(None)

    def _last_stderr(self) -> str:
        try:
            lines = [x for x in self.stderr_path.read_text(errors="replace").splitlines() if x.strip()]
        except OSError:
            return ""
        return lines[-1].strip()[:300] if lines else ""

    def ask(self, req: dict[str, Any], timeout_s: float) -> dict[str, Any]:
        op = req.get("op")
        try:
            assert self.proc.stdin is not None
            self.proc.stdin.write(json.dumps(req) + "\n")
            self.proc.stdin.flush()
            line = self._replies.get(timeout=timeout_s)
        except queue.Empty:
            self.kill()
            raise WorkerError(f"{self.name} hung: no answer to {op!r} within {timeout_s:.0f} s") from None
        except (BrokenPipeError, OSError):
            line = None
        if line is None:
            rc = self.proc.wait(timeout=30)
            tail = self._last_stderr()
            raise WorkerError(
                f"{self.name} exited with status {rc} during {op!r}" + (f": {tail}" if tail else "")
            )
        reply: dict[str, Any] = json.loads(line)
        if not reply.get("ok"):
            raise WorkerError(f"{self.name} failed {op!r}: {reply.get('error')}")
        return reply

    def kill(self) -> None:
        if self.proc.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(self.proc.pid, signal.SIGKILL)
            self.proc.wait(timeout=30)

    def close(self) -> None:
        if self.proc.poll() is None:
            try:
                assert self.proc.stdin is not None
                self.proc.stdin.write(json.dumps({"op": "quit"}) + "\n")
                self.proc.stdin.flush()
                self.proc.wait(timeout=30)
            except (OSError, subprocess.TimeoutExpired):
                self.kill()
        self._err.close()


def _prepare(worker: Worker, cell: tuple[str, str, str], opt: PairOptions, out_path: Path | None) -> float:
    model, scale, phase = cell
    req = {
        "op": "prepare", "model": model, "scale": scale, "mode": worker.side.mode, "phase": phase,
        "device": opt.device, "seed": opt.seed, "provider": opt.provider, "threads": opt.threads,
        "warmup": opt.warmup, "out_path": str(out_path) if out_path else None,
    }  # fmt: skip
    return float(worker.ask(req, opt.prepare_timeout_s)["first_call_s"])


def alternate(pairs: int, sides: int = 2) -> list[int]:
    """Side order for spawning ``pairs`` workers per side: 0 1 1 0 0 1 ... (ABBA), so neither
    side's compiles always run first, in the warmer or the quieter machine."""
    order: list[int] = []
    for i in range(pairs):
        order += list(range(sides)) if i % 2 == 0 else list(reversed(range(sides)))
    return order


def spread(medians: Sequence[float]) -> float:
    """(slowest - fastest) / fastest."""
    lo = min(medians)
    return (max(medians) - lo) / lo if lo > 0 else float("inf")


def summarize_rounds(base: Sequence[Sequence[float]], new: Sequence[Sequence[float]]) -> dict[str, Any]:
    """Paired figures from per-round, per-worker ms (``base[r][w]``): the median per-round
    ratio with its bootstrap interval, and the spread between rounds and between processes."""
    b = [float(np.mean(r)) for r in base]
    n = [float(np.mean(r)) for r in new]
    ratios = np.asarray(n) / np.asarray(b)
    q1, med, q3 = (float(v) for v in np.percentile(ratios, [25, 50, 75]))
    lo, hi = stats.bootstrap_median(ratios)

    def per_process(rows: Sequence[Sequence[float]]) -> list[float]:
        width = max(len(r) for r in rows)
        return [float(np.median([r[w] for r in rows if w < len(r)])) for w in range(width)]

    pb, pn = per_process(base), per_process(new)
    return {
        "ratio": med,
        "ci95": [lo, hi],
        "round_ratios": [float(x) for x in ratios],
        "round_spread": (q3 - q1) / med,
        "process_ms": {"base": pb, "new": pn},
        "process_spread": {"base": spread(pb), "new": spread(pn)},
    }


def run_pair(
    cell: tuple[str, str, str], sides: tuple[SideSpec, SideSpec], opt: PairOptions, **kw: Any
) -> dict[str, Any]:
    """``measure_sides`` for a base and a new side, its figures flattened: the ratio, interval,
    spreads and verdict inputs of new against base, and each side's record."""
    m = measure_sides(cell, sides, opt, **kw)
    fig = m["figures"][0]
    return {
        **fig,
        "stable": fig["stable"],
        "rounds": m["rounds"],
        "steps": opt.steps,
        "processes": m["processes"],
        "round_warmup_ms": m["round_warmup_ms"],
        "parity": m["parity"][0],
        "base": m["sides"][0],
        "new": m["sides"][1],
        "wall_s": m["wall_s"],
    }


def measure_sides(
    cell: tuple[str, str, str],
    sides: Sequence[SideSpec],
    opt: PairOptions,
    *,
    log: Callable[[str], None] = print,
    close: Callable[[Any, Any], tuple[bool, float]] | None = None,
    undecided: Callable[[dict[str, Any]], bool] | None = None,
    max_rounds: int = 0,
) -> dict[str, Any]:
    """Measure ``cell`` (model, scale, phase) on two or more sides: side 0 is the base, and every
    other side gets its figures against it (``figures[j - 1]``, ``parity[j - 1]``), from the same
    rounds. Raises WorkerError naming the side when a worker crashes, hangs or fails.
    ``close(base_out, out)`` -> (ok, max abs err) is the parity check of the first outputs (None:
    parity not checked). While ``undecided(figures)`` holds for a side, the same workers time
    ``rounds`` more rounds, up to ``max_rounds`` in all: an interval that straddles the threshold
    narrows with more rounds, without new compiles."""
    opt.check()
    if len(sides) < 2:
        raise ValueError(f"sides: need two or more, got {len(sides)}")
    import torch

    model, scale, phase = cell
    where = f"{model}/{scale}/{phase}"
    n = len(sides)
    compile_s: list[list[float]] = [[] for _ in sides]
    workers: list[list[Worker]] = [[] for _ in sides]
    rows: list[list[list[float]]] = [[] for _ in sides]  # rows[side][round][worker]
    t_start = time.perf_counter()

    def figures() -> list[dict[str, Any]]:
        out = []
        for j in range(1, n):
            fig = summarize_rounds(rows[0], rows[j])
            fig["stable"] = max(fig["process_spread"].values()) <= opt.process_spread
            out.append(fig)
        return out

    with tempfile.TemporaryDirectory(prefix="optimus-pair-work-") as tmp:
        scratch = Path(tmp)
        outs = [scratch / f"out-{i}.pt" for i in range(n)]

        def spawn(side_i: int, keep: bool) -> None:
            w = Worker(sides[side_i], len(compile_s[side_i]), opt.threads, scratch)
            first = not workers[side_i] and keep
            log(f"[pair] {where}: preparing {w.name} ...")
            try:
                s = _prepare(w, cell, opt, outs[side_i] if first else None)
            except BaseException:
                w.close()
                raise
            compile_s[side_i].append(s)
            log(f"[pair]   first call {s:.1f} s")
            if keep:
                w.step_ms = float(np.median(w.ask({"op": "time", "steps": 1}, STEP_TIMEOUT_S)["ms"]))
                workers[side_i].append(w)
            else:
                w.close()

        def time_rounds(count: int) -> None:
            for r in range(count):
                order = [w for group in zip(*workers, strict=True) for w in group]
                if len(rows[0]) % 2:
                    order.reverse()
                ms: dict[int, float] = {}
                for w in order:
                    warm = opt.round_warmup_steps(w.step_ms)
                    steps_ms = w.ask({"op": "time", "steps": warm + opt.steps}, STEP_TIMEOUT_S)["ms"][warm:]
                    w.step_ms = ms[id(w)] = float(np.median(steps_ms))
                for side_i in range(n):
                    rows[side_i].append([ms[id(w)] for w in workers[side_i]])
                if (r + 1) % 5 == 0 or r + 1 == count:
                    log(f"[pair]   round {len(rows[0])}")

        try:
            for side_i in alternate(opt.processes, n):
                spawn(side_i, keep=True)
            parity: list[dict[str, Any] | None] = [None] * (n - 1)
            if close is not None:
                ref = torch.load(outs[0], weights_only=True)
                for j in range(1, n):
                    ok, err = close(ref, torch.load(outs[j], weights_only=True))
                    parity[j - 1] = {"ok": bool(ok), "max_abs_err": float(err)}
            time_rounds(opt.rounds)
            figs = figures()
            while not all(f["stable"] for f in figs) and len(workers[0]) < opt.max_processes:
                worst = max(max(f["process_spread"].values()) for f in figs)
                log(f"[pair]   processes disagree (spread up to {worst:.1%}): one more worker per side")
                for side_i in alternate(len(workers[0]) + 1, n)[-n:]:
                    spawn(side_i, keep=True)
                time_rounds(opt.rounds)
                figs = figures()
            while (
                undecided is not None
                and any(undecided(f) for f in figs)
                and len(rows[0]) + opt.rounds <= max_rounds
            ):
                log(f"[pair]   an interval straddles the threshold: {opt.rounds} more rounds")
                time_rounds(opt.rounds)
                figs = figures()
            memory = [w[0].ask({"op": "memory"}, opt.prepare_timeout_s) for w in workers]
        finally:
            for side_workers in workers:
                for w in side_workers:
                    w.close()
        processes = len(workers[0])
        extra = max(0, opt.compiles - len(compile_s[0]))
        for side_i in alternate(extra, n) if extra else []:
            spawn(side_i, keep=False)
    return {
        "figures": figs,
        "parity": parity,
        "rounds": len(rows[0]),
        "processes": processes,
        "round_warmup_ms": opt.round_warmup_ms,
        "sides": [_side_record(sides[i], rows[i], compile_s[i], memory[i]) for i in range(n)],
        "wall_s": time.perf_counter() - t_start,
    }


def _side_record(
    side: SideSpec, rows: list[list[float]], compiles: list[float], mem: dict[str, Any]
) -> dict[str, Any]:
    return {
        "sha": side.checkout.sha,
        "mode": side.mode,
        "ms": [float(np.mean(r)) for r in rows],
        "worker_ms": rows,
        "compile_s": compiles,
        "peak_mem_bytes": mem.get("peak_mem_bytes"),
        "peak_mem_method": mem.get("peak_mem_method"),
        "peak_mem_static_counted": bool(mem.get("static_counted")),
    }
