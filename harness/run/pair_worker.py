"""One side of a paired measurement: a process that prepares one mode of one model from one
checkout, then steps it whenever the parent asks (``harness.run.paired``).

Why a script run by path, importing only its checkout: a pair compares two commits, and each
side must run that commit's optimizer, models and modes. The parent starts this file with the
checkout first on ``PYTHONPATH`` and as the working directory, so ``import harness`` below is the
checkout's. The one thing asked of a checkout is ``harness.run.interleaved.contender`` (the
builder ``ab`` uses too); a commit without it cannot be paired, and the worker says so in one
line.

The protocol: one JSON object per line on stdin, one JSON reply per line on the original
stdout. Everything else the process prints (Inductor's warnings, a model's prints) goes to
stderr, so it cannot corrupt a reply.

    {"op": "prepare", "model", "scale", "mode", "phase", "device", "seed", "provider",
     "threads", "warmup", "out_path"}     -> {"ok": true, "first_call_s": s}
    {"op": "time", "steps": n}            -> {"ok": true, "ms": [ms of each step]}
    {"op": "memory"}                      -> {"ok": true, "peak_mem_bytes": ..., ...}
    {"op": "quit"}                        -> (exits 0)

A failure is ``{"ok": false, "error": "one line"}``. ``OPTIMUS_BENCH_INJECT_SLOWDOWN`` makes every
timed step longer by that fraction (the injection studies slow one side only).
"""

from __future__ import annotations

import json
import math
import os
import sys
import time
from typing import Any

INJECT_ENV = "OPTIMUS_BENCH_INJECT_SLOWDOWN"


def _slowdown() -> float:
    raw = os.environ.get(INJECT_ENV, "").strip()
    frac = float(raw) if raw else 0.0
    if not math.isfinite(frac) or frac < 0:
        raise ValueError(f"{INJECT_ENV}: must be a number >= 0, got {raw!r}")
    return frac


def _stall(seconds: float) -> None:
    end = time.perf_counter() + seconds
    while time.perf_counter() < end:
        pass


class Side:
    """The prepared contender and what the ops below need of it."""

    def __init__(self, req: dict[str, Any]) -> None:
        import torch

        threads = int(req.get("threads", 1))
        if threads:
            torch.set_num_threads(threads)
        try:
            from harness.modes import builtin

            builtin.disable_compile_caches()  # cold compiles: the compile time is the real one
        except (ImportError, AttributeError):
            pass
        from harness.run.interleaved import contender

        self.device = str(req["device"])
        self.slow = _slowdown()
        self.c = contender(
            req["model"], req["scale"], req["mode"], req["phase"],
            device=self.device, seed=int(req["seed"]), provider=req["provider"],
        )  # fmt: skip
        out_path = req.get("out_path")
        if out_path:  # the first output, for parity between the sides (read weights_only)
            torch.save(_tensors(self.c.first_out), out_path)
        for _ in range(int(req.get("warmup", 3))):
            self.c.step()
        self.sync()

    def sync(self) -> None:
        if self.device == "cuda":
            import torch

            torch.cuda.synchronize()

    def time(self, steps: int) -> list[float]:
        """ms of each of ``steps`` steps (the parent takes their median: a step that another
        process preempted does not decide the round)."""
        out = []
        for _ in range(steps):
            t0 = time.perf_counter()
            self.c.step()
            self.sync()
            elapsed = time.perf_counter() - t0
            if self.slow:
                _stall(self.slow * elapsed)
                elapsed = time.perf_counter() - t0
            out.append(elapsed * 1e3)
        return out

    def memory(self) -> dict[str, Any]:
        try:
            from harness.measure.memory import step_peak_memory
        except ImportError as e:  # a checkout without the harness's memory measure
            return {"peak_mem_bytes": None, "peak_mem_method": f"unavailable: {e}"}

        static: list[Any] = []
        module = getattr(self.c, "module", None)
        if module is not None:
            from harness.run.cell import step_static_tensors

            static = step_static_tensors(module, getattr(self.c, "optimizer", None))
        out = dict(step_peak_memory(self.c.step, self.device, static))
        out["static_counted"] = module is not None  # older checkouts: the step's own peak only
        return out


def _tensors(out: Any) -> Any:
    """The output as plain tensors, lists and dicts (what ``torch.load(weights_only=True)`` reads)."""
    import torch

    if isinstance(out, torch.Tensor):
        return out.detach().cpu()
    if isinstance(out, (list, tuple)):
        return [_tensors(o) for o in out]
    if isinstance(out, dict):
        return {str(k): _tensors(v) for k, v in out.items()}
    return torch.tensor(float(out))


def _one_line(e: BaseException) -> str:
    text = " ".join(str(e).split())
    return f"{type(e).__name__}: {text}"[:500]


def main() -> int:
    reply = os.fdopen(os.dup(1), "w", buffering=1)  # the protocol's own channel
    os.dup2(2, 1)  # anything else printed, from Python or C, goes to stderr
    sys.stdout = sys.stderr
    if sys.path and os.path.abspath(sys.path[0]) == os.path.dirname(os.path.abspath(__file__)):
        del sys.path[0]  # this file's folder must not shadow the checkout's modules
    side: Side | None = None
    for line in sys.stdin:
        if not line.strip():
            continue
        req = json.loads(line)
        op = req.get("op")
        if op == "quit":
            return 0
        try:
            if op == "prepare":
                t0 = time.perf_counter()
                side = Side(req)
                answer: dict[str, Any] = {
                    "first_call_s": side.c.first_call_s,
                    "setup_s": time.perf_counter() - t0,
                }
            elif side is None:
                raise RuntimeError(f"{op!r} before 'prepare'")
            elif op == "time":
                answer = {"ms": side.time(int(req["steps"]))}
            elif op == "memory":
                answer = side.memory()
            else:
                raise ValueError(f"unknown op {op!r}")
            answer["ok"] = True
        except Exception as e:  # one line to the parent, which names the side
            answer = {"ok": False, "error": _one_line(e)}
        reply.write(json.dumps(answer) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
