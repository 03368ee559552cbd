"""One-shot GPU check: what Optimus does on a CUDA device, measured side by side in one process.

WHY: the project is developed on CPU-only machines; a borrowed GPU (one H200, a few minutes of wall
time) is rare. This script gets the most out of one run on it: the tower model
(``models.synthetic_towers.Towers``: split input -> per-tower Linear -> LayerNorm -> tanh) under
eager, eager+optimus (``optimus.optimize`` with the one-time parameter re-layout), compile (Inductor),
compile+peer (Inductor's own pre-grad batch fusions and split/cat patterns, every one this torch
ships) and compile+optimus (Inductor on the re-laid-out GraphModule); inference and a training step;
CUDA-synchronized latency (median and IQR in microseconds over rounds interleaved across modes, so
machine noise hits every mode alike), compile seconds, peak memory of one step, parity against eager;
then which rules the analytic and the measured cost models fire on the device (and on CPU, for
comparison). The most valuable results come first (first config: infer, then train; then the next
config; the cost models last), everything obeys ``--budget-s`` (what is left is recorded as
``"skipped: budget"``), and the JSON is rewritten atomically after every measurement, so a kill
loses nothing that was finished.

It needs only torch (+ triton on CUDA) and this repo's ``optimus`` package: no torchrec, no fbgemm.

    python3 scripts/gpu_check.py --out $OUT/gpu_check.json
    PYTHONPATH=. python scripts/gpu_check.py --device cpu --configs 4x8x16 --rounds 3 --iters 3  # dry run

Notes on method (also recorded in the JSON ``settings``):

* TF32 is off (fp32 matmuls in full precision) so parity can use atol = rtol = 1e-4.
* Inductor's FX graph cache (and AOTAutograd's cache) are off, so every compile is a real compile.
* ``torch._dynamo.reset()`` runs once before each (config, phase) group, not before every compiled
  mode: a reset drops the compiled code of the modes compiled earlier in the group, which would then
  recompile during timing (compile+peer outside its config patch, i.e. without the peer's passes).
  Each compiled mode instead gets its own entry function (its own code object): without that, a
  deepcopy of the same model class reuses the compiled graph of the copy compiled before it (seen on
  torch 2.13), and compile+peer would silently time plain compile. ``graphs_compiled`` (per mode) and
  ``recompiled_in_timing`` (per group) record whether that held.
"""

from __future__ import annotations

import argparse
import contextlib
import copy
import datetime
import json
import os
import platform
import statistics
import sys
import tempfile
import time
import traceback
from collections.abc import Callable, Iterator
from dataclasses import asdict, dataclass, field, is_dataclass
from typing import Any, Protocol

import torch
import torch._dynamo
import torch._inductor.config
from torch import nn
from torch._inductor.custom_graph_pass import CustomGraphPass

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "tests", "optimus"))
sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))

import optimus
from optimus.layout_relayout import RelayoutParams
from optimus.timing import time_block

MODES = ("eager", "eager+optimus", "compile", "compile+peer", "compile+optimus")
PHASES = ("infer", "train")
COMPILED = ("compile", "compile+peer", "compile+optimus")
OPTIMUS_MODES = ("eager+optimus", "compile+optimus")
ATOL = 1e-4
RTOL = 1e-4
GRAD_REL_TOL = 1e-3  # gradients: max |g - g_eager| / max |g_eager| per parameter
PARITY_STEPS = 3
MIN_ROUNDS = 3  # rounds taken even past the budget once a group's modes are compiled (seconds on GPU)

Step = Callable[[], Any]
Inputs = tuple[torch.Tensor, ...]  # a model's positional inputs (Towers: one tensor)


def as_inputs(x: torch.Tensor | Inputs) -> Inputs:
    """``x`` as a tuple of positional inputs (a lone tensor is one input)."""
    return (x,) if isinstance(x, torch.Tensor) else tuple(x)


# ----------------------------------------------------------------------------- small utilities


def now_iso() -> str:
    """UTC time stamp, seconds resolution."""
    return datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds")


def short_error(exc: BaseException) -> str:
    """``Type: first line of the message`` (the JSON keeps a traceback tail separately)."""
    msg = str(exc).strip().splitlines()
    return f"{type(exc).__name__}: {msg[0] if msg else ''}"[:500]


def jsonable(value: Any) -> Any:
    """Plain JSON types for dataclasses, tuples, devices, paths and non-finite floats."""
    if is_dataclass(value) and not isinstance(value, type):
        return jsonable(asdict(value))
    if isinstance(value, dict):
        return {str(k): jsonable(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [jsonable(v) for v in value]
    if isinstance(value, float):
        return value if value == value and abs(value) != float("inf") else str(value)
    if value is None or isinstance(value, (bool, int, str)):
        return value
    return str(value)


def write_json(path: str, payload: dict[str, Any]) -> None:
    """Atomic write: a temp file in the target's directory, then ``os.replace``."""
    directory = os.path.dirname(os.path.abspath(path))
    os.makedirs(directory, exist_ok=True)
    with tempfile.NamedTemporaryFile("w", dir=directory, delete=False, suffix=".tmp") as fh:
        json.dump(jsonable(payload), fh, indent=1)
    os.replace(fh.name, path)


def sync(device: torch.device) -> None:
    """Wait for queued device work (a no-op on CPU), so a clock read sees it finished."""
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def unique_graphs() -> int | None:
    """Dynamo's count of graphs compiled so far in this process (None if this torch lacks it)."""
    try:
        from torch._dynamo.utils import counters

        return int(counters["stats"]["unique_graphs"])
    except Exception:
        return None


@dataclass
class Budget:
    """Wall-clock budget from process start; work that would start past it is skipped."""

    seconds: float
    start: float = field(default_factory=time.perf_counter)

    def elapsed(self) -> float:
        return time.perf_counter() - self.start

    def left(self) -> float:
        return self.seconds - self.elapsed()

    def over(self) -> bool:
        return self.left() <= 0


# ----------------------------------------------------------------------------- setup


@dataclass(frozen=True)
class TowerConfig:
    """One ``--configs`` entry: towers x width x batch (hidden = width)."""

    towers: int
    width: int
    batch: int

    @property
    def name(self) -> str:
        return f"{self.towers}x{self.width}x{self.batch}"


class GroupConfig(Protocol):
    """What the group machinery needs of a config: a name for the cells (TowerConfig; other
    scripts reusing this one pass their own)."""

    @property
    def name(self) -> str: ...


MakeBase = Callable[[Any, torch.device, bool], tuple[nn.Module, torch.Tensor | Inputs]]


def parse_configs(text: str) -> list[TowerConfig]:
    """``"64x64x2048,32x16x256"`` -> configs; raises ValueError on anything else."""
    out = []
    for item in text.split(","):
        parts = item.strip().lower().split("x")
        if len(parts) != 3 or not all(p.isdigit() and int(p) > 0 for p in parts):
            raise ValueError(f"config {item!r}: expected TOWERSxWIDTHxBATCH with positive ints")
        out.append(TowerConfig(*(int(p) for p in parts)))
    return out


def parse_list(text: str, allowed: tuple[str, ...], what: str) -> list[str]:
    """Comma list restricted to ``allowed``, kept in ``allowed``'s order."""
    picked = {s.strip() for s in text.split(",") if s.strip()}
    unknown = picked - set(allowed)
    if unknown or not picked:
        raise ValueError(f"--{what}: unknown or empty {sorted(unknown)}; allowed: {', '.join(allowed)}")
    return [m for m in allowed if m in picked]


@contextlib.contextmanager
def precision_settings(threads: int) -> Iterator[dict[str, Any]]:
    """TF32 off for matmuls and cuDNN (full fp32), Inductor's FX graph cache and AOTAutograd's cache
    off, ``threads`` intra-op threads if > 0; yields the settings and restores the old ones after
    (so a test calling :func:`main` leaves its process as it was)."""
    functorch_config: Any = getattr(torch, "_functorch", None)
    functorch_config = getattr(functorch_config, "config", None)
    old = (
        torch.backends.cuda.matmul.allow_tf32,
        torch.backends.cudnn.allow_tf32,
        torch.get_float32_matmul_precision(),
        torch._inductor.config.fx_graph_cache,
        getattr(functorch_config, "enable_autograd_cache", None),
        torch.get_num_threads(),
    )
    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.allow_tf32 = False
    torch.set_float32_matmul_precision("highest")
    torch._inductor.config.fx_graph_cache = False
    if old[4] is not None:
        functorch_config.enable_autograd_cache = False
    if threads:
        torch.set_num_threads(threads)
    try:
        yield {
            "tf32": "off",
            "cuda.matmul.allow_tf32": torch.backends.cuda.matmul.allow_tf32,
            "cudnn.allow_tf32": torch.backends.cudnn.allow_tf32,
            "float32_matmul_precision": torch.get_float32_matmul_precision(),
            "inductor.fx_graph_cache": torch._inductor.config.fx_graph_cache,
            "functorch.enable_autograd_cache": None if old[4] is None else False,
            "threads": torch.get_num_threads(),
        }
    finally:
        torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32 = old[0], old[1]
        torch.set_float32_matmul_precision(old[2])
        torch._inductor.config.fx_graph_cache = old[3]
        if old[4] is not None:
            functorch_config.enable_autograd_cache = old[4]
        torch.set_num_threads(old[5])


def environment(device: torch.device) -> dict[str, Any]:
    """Versions and hardware: torch, CUDA, GPU, triton, python, host."""
    env: dict[str, Any] = {
        "torch": torch.__version__,
        "cuda": torch.version.cuda,
        "python": platform.python_version(),
        "platform": platform.platform(),
        "cpu_count": os.cpu_count(),
        "torch_threads": torch.get_num_threads(),
        "argv": list(sys.argv),
        "device": str(device),
        "gpu": None,
        "triton": None,
    }
    if device.type == "cuda":
        env["gpu"] = torch.cuda.get_device_name(device)
        env["gpu_capability"] = list(torch.cuda.get_device_capability(device))
        env["gpu_memory_gib"] = round(torch.cuda.get_device_properties(device).total_memory / 2**30, 1)
    try:
        import triton

        env["triton"] = triton.__version__
    except Exception as exc:
        env["triton"] = f"not importable ({type(exc).__name__})"
    return env


def peer_options() -> dict[str, dict[str, Any]]:
    """Every pre-grad batch fusion and split/cat pattern this Inductor ships, default options."""
    keys: list[str] = []
    with contextlib.suppress(Exception):
        from torch._inductor.fx_passes import group_batch_fusion

        keys += list(getattr(group_batch_fusion, "PRE_GRAD_FUSIONS", {}))
    with contextlib.suppress(Exception):
        from torch._inductor.fx_passes import split_cat

        keys += list(getattr(split_cat, "PRE_GRAD_PATTERNS", {}))
    return {k: {} for k in keys}


# ----------------------------------------------------------------------------- modes


class CountNodes(CustomGraphPass):
    """An Inductor pre-grad custom pass that only records the FX node count it is handed (it runs
    after Inductor's own pre-grad passes, so for compile+peer it sees the peer's result)."""

    def __init__(self) -> None:
        self.counts: list[int] = []

    def __call__(self, graph: torch.fx.Graph) -> None:
        self.counts.append(len(graph.nodes))

    def uuid(self) -> str:
        return "gpu-check-count-nodes"


def unique_entry(module: nn.Module, tag: str) -> Callable[..., torch.Tensor]:
    """A new function ``entry(*x) = module(*x)`` with its OWN code object (Dynamo caches compiled code
    per code object; a closure would share one): two copies of one model class compiled separately
    then cannot reuse each other's graph."""
    namespace: dict[str, Any] = {"module": module}
    exec(compile("def entry(*x):\n    return module(*x)\n", f"<gpu_check {tag}>", "exec"), namespace)
    entry: Callable[..., torch.Tensor] = namespace["entry"]
    return entry


def report_fields(gm: Any) -> dict[str, Any]:
    """The useful fields of ``gm.optimus_report`` (nodes before/after, rules fired, ...)."""
    rep = getattr(gm, "optimus_report", None)
    if rep is None:
        return {"optimus_report": None}
    names = ("nodes_before", "nodes_after", "rules_fired", "declined", "rolled_back", "stop_reason")
    out = {n: getattr(rep, n, None) for n in names}
    out.update(
        {f"optimus_{n}": getattr(rep, n, None) for n in ("seconds", "capture_seconds", "capture", "notes")}
    )
    return out


@dataclass
class Prepared:
    """One mode ready to time: the callable, the module whose parameters train, its optimizer."""

    fn: Callable[..., torch.Tensor]
    params: nn.Module
    opt: torch.optim.Optimizer
    info: dict[str, Any]


def build_mode(
    mode: str, base: nn.Module, x: torch.Tensor | Inputs, lr: float, peer: dict[str, dict[str, Any]]
) -> tuple[Prepared, Callable[[], contextlib.AbstractContextManager[Any]], CountNodes]:
    """Deepcopy ``base`` and make ``mode``'s callable (optimizing first for the optimus modes); returns
    it, a context factory for the first call (for compiled modes: the node counter, plus the peer's
    fusion options for compile+peer) and the counter."""
    src = copy.deepcopy(base)
    info: dict[str, Any] = {}
    fn: Callable[..., torch.Tensor] = src
    if mode in OPTIMUS_MODES:
        t0 = time.perf_counter()
        gm = optimus.optimize(src, as_inputs(x), config=optimus.OptimusConfig(layout=RelayoutParams()))
        info["optimize_s"] = time.perf_counter() - t0
        info.update(report_fields(gm))
        fn = gm
    counter = CountNodes()
    if mode in COMPILED:
        fn = torch.compile(unique_entry(fn, mode), fullgraph=True, dynamic=False)  # type: ignore[arg-type]
    opt = torch.optim.SGD(src.parameters(), lr=lr)
    prepared = Prepared(fn, src, opt, info)

    def first_call_context() -> contextlib.AbstractContextManager[Any]:
        if mode not in COMPILED:
            return contextlib.nullcontext()
        patches: dict[str, Any] = {"pre_grad_custom_pass": counter}
        if mode == "compile+peer":
            patches["pre_grad_fusion_options"] = peer
        return torch._inductor.config.patch(patches)

    return prepared, first_call_context, counter


def warm_inductor(device: torch.device) -> float:
    """Compile and run (forward + backward) a tiny Linear -> LayerNorm -> tanh once, so the first
    measured compile does not also pay Inductor's one-time start-up (imports, compile workers,
    toolchain); returns its seconds."""
    t0 = time.perf_counter()
    torch._dynamo.reset()
    mod = nn.Sequential(nn.Linear(8, 8), nn.LayerNorm(8), nn.Tanh()).to(device)
    fn = torch.compile(unique_entry(mod, "warmup"), fullgraph=True, dynamic=False)
    fn(torch.randn(4, 8, device=device)).sum().backward()
    sync(device)
    return time.perf_counter() - t0


def step_fn(p: Prepared, x: torch.Tensor | Inputs, train: bool) -> Step:
    """One call of the phase: no_grad forward, or zero_grad + forward + square-mean backward + SGD step."""
    inputs = as_inputs(x)
    if not train:

        def infer() -> torch.Tensor:
            with torch.no_grad():
                return p.fn(*inputs)

        return infer

    def train_step() -> torch.Tensor:
        p.opt.zero_grad(set_to_none=True)
        out = p.fn(*inputs)
        out.square().mean().backward()
        p.opt.step()
        return out

    return train_step


def time_calls(step: Step, iters: int, device: torch.device) -> float:
    """Seconds per call over ``iters`` back-to-back calls (device synchronized before each clock read)."""
    sync(device)
    return time_block(step, iters, lambda: sync(device)) / iters


def peak_memory(step: Step, device: torch.device) -> dict[str, int | None]:
    """Peak allocated bytes during one step, and that peak minus what was allocated before it."""
    if device.type != "cuda":
        return {"peak_mem_bytes": None, "step_mem_bytes": None}
    sync(device)
    torch.cuda.reset_peak_memory_stats(device)
    before = torch.cuda.memory_allocated(device)
    step()
    sync(device)
    peak = torch.cuda.max_memory_allocated(device)
    return {"peak_mem_bytes": peak, "step_mem_bytes": peak - before}


# ----------------------------------------------------------------------------- parity


def max_abs_diff(a: torch.Tensor, b: torch.Tensor) -> float:
    return (a.detach().float() - b.detach().float()).abs().max().item()


def snapshot(module: nn.Module) -> list[torch.Tensor]:
    """Detached copies of the parameters (in ``parameters()`` order)."""
    return [p.detach().clone() for p in module.parameters()]


def grads(p: Prepared, x: torch.Tensor | Inputs) -> list[torch.Tensor]:
    """Gradients of one forward+backward (no optimizer step), cloned; zero where a grad is None."""
    p.opt.zero_grad(set_to_none=True)
    p.fn(*as_inputs(x)).square().mean().backward()
    out = [
        q.grad.detach().clone() if q.grad is not None else torch.zeros_like(q) for q in p.params.parameters()
    ]
    p.opt.zero_grad(set_to_none=True)
    return out


def compare_lists(got: list[torch.Tensor], want: list[torch.Tensor]) -> tuple[float, float, bool]:
    """(max abs diff, max over tensors of abs diff / max |want|, allclose at ATOL/RTOL)."""
    if len(got) != len(want):
        raise RuntimeError(f"parameter count differs from eager: {len(got)} vs {len(want)}")
    abs_d, rel_d, ok = 0.0, 0.0, True
    for g, w in zip(got, want, strict=True):
        d = max_abs_diff(g, w)
        abs_d = max(abs_d, d)
        rel_d = max(rel_d, d / max(w.abs().max().item(), 1e-30))
        ok = ok and torch.allclose(g.float(), w.float(), atol=ATOL, rtol=RTOL)
    return abs_d, rel_d, ok


# ----------------------------------------------------------------------------- the run


@dataclass
class Run:
    """The run's state: arguments, budget, the JSON payload and where it goes."""

    args: argparse.Namespace
    device: torch.device
    budget: Budget
    payload: dict[str, Any]
    cells: dict[tuple[str, str, str], dict[str, Any]] = field(default_factory=dict)
    compile_times: list[float] = field(default_factory=list)  # compile_s of every compiled mode so far
    make_base: MakeBase | None = None  # (cfg, device, train) -> (model, inputs); None: base_model

    def save(self) -> None:
        """Rewrite the JSON (atomically) with the elapsed time so far."""
        env = self.payload["env"]
        env["last_write"] = now_iso()
        env["elapsed_s"] = round(self.budget.elapsed(), 2)
        write_json(self.args.out, self.payload)

    def left_for_groups(self) -> float:
        """Seconds left for the model groups: the budget less the cost-model part's reserve."""
        reserve = 0.0 if self.args.no_cost_models else self.args.cost_reserve_s
        return self.budget.left() - reserve

    def cell(self, cfg: GroupConfig, phase: str, mode: str) -> dict[str, Any]:
        """The (config, phase, mode) result dict, created on first use and kept in the payload."""
        key = (cfg.name, phase, mode)
        if key not in self.cells:
            self.cells[key] = {"config": cfg.name, "phase": phase, "mode": mode, "status": "pending"}
            self.payload["cells"].append(self.cells[key])
        return self.cells[key]


TABLE_HEAD = (
    "| config | phase | mode | status | median us | IQR us | n | vs eager | vs compile | compile s "
    "| step MiB | max diff | parity |\n| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |"
)


def fmt(value: Any, spec: str) -> str:
    """``format(value, spec)``, or ``-`` for None / non-numbers."""
    return format(value, spec) if isinstance(value, (int, float)) and not isinstance(value, bool) else "-"


def table_row(c: dict[str, Any]) -> str:
    """One markdown line for a cell."""
    mem = c.get("step_mem_bytes")
    diff = c.get("param_max_abs_diff", c.get("out_max_abs_diff"))
    parity = c.get("parity_ok")
    status = c.get("status", "?")
    if status == "error":
        status = f"error: {c.get('error', '')[:60]}"
    return (
        f"| {c['config']} | {c['phase']} | {c['mode']} | {status} | {fmt(c.get('median_us'), '.1f')} "
        f"| {fmt(c.get('iqr_us'), '.1f')} | {fmt(c.get('n'), 'd')} | {fmt(c.get('speedup_vs_eager'), '.2f')} "
        f"| {fmt(c.get('speedup_vs_compile'), '.2f')} | {fmt(c.get('compile_s'), '.1f')} "
        f"| {fmt(mem / 2**20 if mem is not None else None, '.1f')} | {fmt(diff, '.1e')} "
        f"| {'-' if parity is None else parity} |"
    )


def log(msg: str) -> None:
    """Progress to stderr (stdout keeps the table)."""
    print(msg, file=sys.stderr, flush=True)


def record_error(run: Run, cell: dict[str, Any], exc: BaseException) -> None:
    """Mark a cell failed (with a traceback tail), save, and print its line."""
    cell.update(status="error", error=short_error(exc), traceback=traceback.format_exc().splitlines()[-12:])
    run.save()
    print(table_row(cell), flush=True)


def skip_cell(run: Run, cell: dict[str, Any], why: str) -> None:
    """Mark a cell skipped for the budget, save, and print its line."""
    cell.update(status="skipped: budget", note=why)
    run.save()
    print(table_row(cell), flush=True)


def base_model(cfg: TowerConfig, device: torch.device, train: bool) -> tuple[nn.Module, torch.Tensor]:
    """Towers(n, width, hidden=width) with seed 0, moved to ``device`` BEFORE any optimize (the
    re-layout requires that), and its seeded input."""
    torch.manual_seed(0)
    # imported here: scripts/gpu_dense_archs.py imports this module before it may stub torchrec
    from models.synthetic_towers import Towers

    model = Towers(cfg.towers, cfg.width, cfg.width).to(device).train(train)
    gen = torch.Generator().manual_seed(1)
    x = torch.randn(cfg.batch, cfg.towers * cfg.width, generator=gen).to(device)
    return model, x


def prepare_mode(
    run: Run,
    cfg: GroupConfig,
    phase: str,
    mode: str,
    base: nn.Module,
    x: torch.Tensor | Inputs,
    reference: dict[str, Any],
) -> Prepared:
    """Build ``mode``, make its first call (timed: compile_s), the parity steps against eager, and one
    step's peak memory; fills the cell. ``reference`` holds eager's results (filled when mode is eager)."""
    train = phase == "train"
    cell = run.cell(cfg, phase, mode)
    peer = run.payload["settings"]["peer_options"]
    if mode == "compile+peer" and not peer:
        raise RuntimeError("this torch has no pre-grad fusions or split/cat patterns (the peer)")
    t0 = time.perf_counter()
    prepared, first_ctx, counter = build_mode(mode, base, x, run.args.lr, peer)
    step = step_fn(prepared, x, train)
    graphs0 = unique_graphs()  # after optimize (its export is a Dynamo graph too)
    with first_ctx():
        out = step()
    sync(run.device)
    first_s = time.perf_counter() - t0
    cell.update(prepared.info)
    cell["first_call_s"] = first_s
    cell["compile_s"] = first_s if mode != "eager" else None
    if mode in COMPILED:
        g1 = unique_graphs()
        cell["graphs_compiled"] = None if graphs0 is None or g1 is None else g1 - graphs0
        cell["pregrad_nodes"] = counter.counts[-1] if counter.counts else None
    if not train:
        want = reference.setdefault("out", out.detach().clone())
        cell["out_max_abs_diff"] = max_abs_diff(out, want)
        cell["parity_ok"] = bool(torch.allclose(out.float(), want.float(), atol=ATOL, rtol=RTOL))
    else:
        for _ in range(PARITY_STEPS - 1):
            step()
        params = snapshot(prepared.params)
        g = grads(prepared, x)
        want_p = reference.setdefault("params", params)
        want_g = reference.setdefault("grads", g)
        initial = reference["initial"]
        p_abs, _, p_ok = compare_lists(params, want_p)
        g_abs, g_rel, _ = compare_lists(g, want_g)
        upd = [p - i for p, i in zip(params, initial, strict=True)]
        upd_want = [p - i for p, i in zip(want_p, initial, strict=True)]
        _, u_rel, _ = compare_lists(upd, upd_want)
        cell.update(
            param_max_abs_diff=p_abs,
            parity_ok=p_ok,
            update_rel_diff=u_rel,
            grad_max_abs_diff=g_abs,
            grad_rel_diff=g_rel,
            grad_ok=g_rel <= GRAD_REL_TOL,
        )
    cell.update(peak_memory(step, run.device))
    cell["status"] = "prepared"
    run.save()
    log(
        f"  prepared {cfg.name} {phase} {mode}: first call {first_s:.1f}s, "
        f"parity {cell.get('parity_ok')} (elapsed {run.budget.elapsed():.0f}s)"
    )
    return prepared


def quartiles(samples: list[float]) -> tuple[float, float]:
    """(median, IQR); IQR 0 for fewer than 2 samples."""
    med = statistics.median(samples)
    if len(samples) < 2:
        return med, 0.0
    q = statistics.quantiles(samples, n=4)
    return med, q[2] - q[0]


def summarize(run: Run, cfg: GroupConfig, phase: str, samples: dict[str, list[float]]) -> None:
    """Median/IQR/n and speedups into each timed cell of the group."""
    medians = {m: statistics.median(s) for m, s in samples.items() if s}
    for mode, s in samples.items():
        cell = run.cell(cfg, phase, mode)
        if not s or cell["status"] == "error":
            continue
        med, iqr = quartiles(s)
        cell.update(median_us=med, iqr_us=iqr, n=len(s), samples_us=s)
        for ref in ("eager", "compile"):
            cell[f"speedup_vs_{ref}"] = medians[ref] / med if ref in medians else None


def run_group(run: Run, cfg: GroupConfig, phase: str) -> None:
    """All modes of one (config, phase): prepare each (budget permitting), then interleaved rounds."""
    args, device, budget = run.args, run.device, run.budget
    left = run.left_for_groups
    train = phase == "train"
    log(f"== {cfg.name} {phase} (elapsed {budget.elapsed():.0f}s, {left():.0f}s left for timing)")
    torch._dynamo.reset()
    make_base: MakeBase = run.make_base or base_model
    base, x = make_base(cfg, device, train)
    reference: dict[str, Any] = {"initial": snapshot(base)}
    steps: dict[str, Step] = {}
    compile_seen: list[float] = []
    for mode in args.modes:
        cell = run.cell(cfg, phase, mode)
        # a compiled mode starts only if about as much time is left as a compile has taken: the
        # slowest one so far in this group, else the quickest one so far in the run
        need = max(compile_seen, default=min(run.compile_times, default=0.0)) if mode in COMPILED else 0.0
        if left() <= need:
            skip_cell(run, cell, f"{left():.0f}s left, needs ~{need:.0f}s")
            continue
        if mode != "eager" and "out" not in reference and "params" not in reference:
            record_error(run, cell, RuntimeError("no eager reference (eager failed or not selected)"))
            continue
        try:
            prepared = prepare_mode(run, cfg, phase, mode, base, x, reference)
        except Exception as exc:
            record_error(run, cell, exc)
            continue
        if mode in COMPILED:
            compile_seen.append(run.cell(cfg, phase, mode)["compile_s"])
            run.compile_times.append(compile_seen[-1])
        steps[mode] = step_fn(prepared, x, train)
    if not steps:
        return
    graphs0 = unique_graphs()
    for mode, step in list(steps.items()):
        try:
            for _ in range(args.warmup):
                step()
            sync(device)
        except Exception as exc:
            record_error(run, run.cell(cfg, phase, mode), exc)
            del steps[mode]
    samples: dict[str, list[float]] = {m: [] for m in steps}
    for r in range(args.rounds):
        if r >= min(MIN_ROUNDS, args.rounds) and left() <= 0:
            for mode in steps:
                run.cell(cfg, phase, mode)["truncated"] = "budget"
            break
        for mode, step in list(steps.items()):
            try:
                samples[mode].append(time_calls(step, args.iters, device) * 1e6)
            except Exception as exc:
                record_error(run, run.cell(cfg, phase, mode), exc)
                del steps[mode]
        summarize(run, cfg, phase, samples)
        run.save()
    graphs1 = unique_graphs()
    recompiled = None if graphs0 is None or graphs1 is None else graphs1 - graphs0
    for mode in steps:
        cell = run.cell(cfg, phase, mode)
        cell["recompiled_in_timing"] = recompiled
        cell["status"] = "ok"
    run.save()
    for mode in args.modes:
        cell = run.cell(cfg, phase, mode)
        if cell["status"] == "ok":
            print(table_row(cell), flush=True)


# ----------------------------------------------------------------------------- cost models


@contextlib.contextmanager
def cache_dir_env(path: str) -> Iterator[None]:
    """Point ``OPTIMUS_CACHE_DIR`` (the measured cost model's calibration cache) at ``path``."""
    from optimus.cost_measured import ENV_DIR

    old = os.environ.get(ENV_DIR)
    os.environ[ENV_DIR] = path
    try:
        yield
    finally:
        if old is None:
            os.environ.pop(ENV_DIR, None)
        else:
            os.environ[ENV_DIR] = old


def cost_model_cell(cfg: TowerConfig, device: torch.device, cost: str) -> dict[str, Any]:
    """``optimus.optimize`` on Towers (eval) on ``device`` with the default config (analytic cost
    model, runtime-stacked layout) or ``cost_model="measured"``; what fired, nodes before/after."""
    model, x = base_model(cfg, device, train=False)
    t0 = time.perf_counter()
    # cost_model="measured" is a name resolved in OptimusConfig.__post_init__ (annotated CostModel)
    named: Any = cost
    config = optimus.OptimusConfig() if cost == "analytic" else optimus.OptimusConfig(cost_model=named)
    setup_s = time.perf_counter() - t0  # the measured model calibrates when the config is made
    t0 = time.perf_counter()
    gm = optimus.optimize(model, (x,), config=config)
    out: dict[str, Any] = {"optimize_s": time.perf_counter() - t0, "config_setup_s": setup_s}
    out.update(report_fields(gm))
    constants = getattr(config.cost_model, "constants", None)
    if callable(constants):  # AnalyticCostModel.constants(device)
        constants = constants(device)
    out["cost_constants"] = jsonable(constants)
    return out


def run_cost_models(run: Run, configs: list[TowerConfig]) -> None:
    """Analytic vs measured cost model on the device (and on CPU for comparison), per config."""
    devices = [run.device] if run.device.type == "cpu" else [run.device, torch.device("cpu")]
    with tempfile.TemporaryDirectory(prefix="optimus-cost-") as tmp, cache_dir_env(tmp):
        run.payload["settings"]["cost_cache_dir"] = tmp
        for cfg in configs:
            for device in devices:
                for cost in ("analytic", "measured"):
                    cell: dict[str, Any] = {"config": cfg.name, "device": str(device), "cost_model": cost}
                    run.payload["cost_model"].append(cell)
                    if run.budget.over():
                        cell["status"] = "skipped: budget"
                        run.save()
                        continue
                    try:
                        cell.update(cost_model_cell(cfg, device, cost))
                        cell["status"] = "ok"
                    except Exception as exc:
                        cell.update(status="error", error=short_error(exc))
                    run.save()
                    print(cost_row(cell), flush=True)


COST_HEAD = "| config | device | cost model | status | nodes before -> after | rules fired |\n| --- | --- | --- | --- | --- | --- |"


def cost_row(c: dict[str, Any]) -> str:
    """One markdown line for a cost-model cell."""
    status = c["status"] if c["status"] != "error" else f"error: {c.get('error', '')[:60]}"
    return (
        f"| {c['config']} | {c['device']} | {c['cost_model']} | {status} "
        f"| {c.get('nodes_before', '-')} -> {c.get('nodes_after', '-')} | {c.get('rules_fired', '-')} |"
    )


# ----------------------------------------------------------------------------- main


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    """Command line; validates and normalizes lists."""
    default_out = (
        os.path.join(os.environ["OUT"], "gpu_check.json") if os.environ.get("OUT") else "gpu_check.json"
    )
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--device", default="cuda")
    parser.add_argument("--configs", default="64x64x2048,32x16x256", help="TOWERSxWIDTHxBATCH,...")
    parser.add_argument("--modes", default=",".join(MODES))
    parser.add_argument("--phases", default=",".join(PHASES))
    parser.add_argument("--rounds", type=int, default=7, help="interleaved timing rounds per mode")
    parser.add_argument("--iters", type=int, default=20, help="calls per round")
    parser.add_argument("--warmup", type=int, default=3, help="untimed calls per mode before the rounds")
    parser.add_argument("--budget-s", type=float, default=360.0, help="skip work that would start later")
    parser.add_argument("--lr", type=float, default=0.1, help="SGD learning rate (train phase)")
    parser.add_argument("--threads", type=int, default=0, help="torch intra-op threads (0: leave as is)")
    parser.add_argument("--no-cost-models", action="store_true", help="skip the cost-model part")
    parser.add_argument(
        "--cost-reserve-s",
        type=float,
        default=20.0,
        help="seconds of the budget the model groups leave for the cost-model part (run last)",
    )
    parser.add_argument("--out", default=default_out)
    args = parser.parse_args(argv)
    try:
        args.config_list = parse_configs(args.configs)
        args.modes = parse_list(args.modes, MODES, "modes")
        args.phases = parse_list(args.phases, PHASES, "phases")
    except ValueError as exc:
        parser.error(str(exc))
    check_run_args(parser, args)
    if args.cost_reserve_s < 0:
        parser.error("--cost-reserve-s must be >= 0")
    return args


def check_run_args(parser: argparse.ArgumentParser, args: argparse.Namespace) -> None:
    """The checks every GPU script's CLI shares (modes, rounds, iters, warm-up, budget, lr)."""
    if "eager" not in args.modes:
        parser.error("--modes must include eager (the parity and speedup reference)")
    for name in ("rounds", "iters"):
        if getattr(args, name) < 1:
            parser.error(f"--{name} must be >= 1")
    if args.warmup < 0 or args.threads < 0 or args.budget_s <= 0 or args.lr <= 0:
        parser.error("--warmup/--threads must be >= 0, --budget-s and --lr > 0")


def main(argv: list[str] | None = None) -> dict[str, Any]:
    """Run everything in priority order; returns the payload (also written to ``--out``)."""
    budget = Budget(0.0)
    args = parse_args(argv)
    budget.seconds = args.budget_s
    device = torch.device(args.device)
    if device.type == "cuda" and not torch.cuda.is_available():
        raise SystemExit("--device cuda but torch.cuda.is_available() is False")
    with precision_settings(args.threads) as precision:
        return run_all(args, device, budget, precision)


def base_settings(args: argparse.Namespace) -> dict[str, Any]:
    """The run settings every GPU script records (timing, budget, precision, tolerances)."""
    return {
        "modes": args.modes,
        "phases": args.phases,
        "rounds": args.rounds,
        "iters": args.iters,
        "warmup": args.warmup,
        "budget_s": args.budget_s,
        "lr": args.lr,
        "dtype": "float32",
        "atol": ATOL,
        "rtol": RTOL,
        "grad_rel_tol": GRAD_REL_TOL,
    }


def run_all(
    args: argparse.Namespace, device: torch.device, budget: Budget, precision: dict[str, Any]
) -> dict[str, Any]:
    """The groups (configs x phases), then the cost models; prints the tables, writes the JSON."""
    env = environment(device)
    env["start"] = now_iso()
    settings = {
        "configs": args.configs,
        **base_settings(args),
        "parity": f"infer: outputs vs eager; train: parameters after {PARITY_STEPS} identical SGD steps vs eager "
        "(parity_ok: allclose), update_rel_diff, and gradients of one more fwd+bwd (grad_ok)",
        "dynamo_reset": "before each (config, phase) group; each compiled mode has its own entry code object",
        "optimus_config": "OptimusConfig(layout=RelayoutParams()) for eager+optimus and compile+optimus",
        "compile": "torch.compile(fullgraph=True, dynamic=False) of a per-mode entry function; "
        "a tiny compile runs first (env.inductor_warmup_s) so no mode pays Inductor's start-up",
        "cost_reserve_s": 0.0 if args.no_cost_models else args.cost_reserve_s,
        "peer_options": peer_options(),
        **precision,
    }
    payload: dict[str, Any] = {"schema": 1, "env": env, "settings": settings, "cells": [], "cost_model": []}
    run = Run(args, device, budget, payload)
    run.save()
    env["inductor_warmup_s"] = None
    if any(m in COMPILED for m in args.modes):
        try:
            env["inductor_warmup_s"] = warm_inductor(device)
        except Exception as exc:  # the compiled modes will say what is wrong
            env["inductor_warmup_error"] = short_error(exc)
        run.save()
    print(f"gpu_check: torch {env['torch']} cuda {env['cuda']} gpu {env['gpu']} -> {args.out}", flush=True)
    print(TABLE_HEAD, flush=True)
    for cfg in args.config_list:
        for phase in args.phases:
            try:
                run_group(run, cfg, phase)
            except Exception as exc:  # a whole group failing (e.g. building the model) skips to the next
                log(f"group {cfg.name} {phase} failed: {short_error(exc)}")
                payload.setdefault("group_errors", []).append(
                    {"config": cfg.name, "phase": phase, "error": short_error(exc)}
                )
                run.save()
    if not args.no_cost_models:
        print(COST_HEAD, flush=True)
        run_cost_models(run, args.config_list)
    env["end"] = now_iso()
    payload["finished"] = True
    run.save()
    print("\nFinal results:\n" + TABLE_HEAD, flush=True)
    for c in payload["cells"]:
        print(table_row(c), flush=True)
    if payload["cost_model"]:
        print("\n" + COST_HEAD, flush=True)
        for c in payload["cost_model"]:
            print(cost_row(c), flush=True)
    print(f"elapsed {budget.elapsed():.1f}s; JSON: {args.out}", flush=True)
    return payload


if __name__ == "__main__":
    main()
