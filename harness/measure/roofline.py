"""The floor of a cell: the roofline of its dense arch on this machine's measured peaks.

Why: a speedup says how much faster one mode is than another, not how far either is from what
the machine can do. The roofline model (Williams, Waterman and Patterson, "Roofline: an
insightful visual performance model", CACM 2009) bounds a kernel's time from below by its
arithmetic at the machine's peak compute rate and its unavoidable bytes at the peak memory
bandwidth; both rates are measured here, not taken from a data sheet.

``measure_peaks`` runs once per run (the runner, before the cells; ``env["peaks"]``), so every
cell of a run divides by the same rates. ``count`` runs in each cell on the dense arch as built
(the math every mode must do; a rewrite may add padding, never remove work), and ``floor``
turns the two into ``floor_ms = max(flops / gemm_rate, bytes / bandwidth)``: the step overlaps
compute and memory traffic at best perfectly, so the larger of the two is a lower bound; their
sum would assume no overlap at all and can sit above a well-fused step's measured time.
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any

# (M, N, K) of the GEMM rates: rows of a batch times the widths of the families' dense layers
# (widths 256 to 1024 at the medium and large scales). On the 2-core development machine the rate
# falls from about 160 GFLOP/s, while the smaller operand stays in the 2 MiB L2 cache, to about
# 65 beyond it, so one rate cannot price every matmul: each is priced at the rate of the measured
# shape nearest below its own size (``gemm_rate_for``).
GEMM_SHAPES: tuple[tuple[int, int, int], ...] = ((1024, 256, 256), (1024, 512, 512), (2048, 1024, 1024))
CACHE_COPY_BYTES = 512 * 2**10  # a copy whose source and destination stay in the L2 cache
COPY_MIN_BYTES = 64 * 2**20  # the memory copy's source: at least this and 1.25x the last-level cache
REPEATS = 5


def last_level_cache_bytes() -> int | None:
    """Size of the largest CPU cache sysfs reports (None where it reports none)."""
    best = None
    for size in Path("/sys/devices/system/cpu/cpu0/cache").glob("index*/size"):
        try:
            text = size.read_text().strip()
        except OSError:
            continue
        mult = {"K": 2**10, "M": 2**20, "G": 2**30}.get(text[-1:], 1)
        digits = text.rstrip("KMG")
        if digits.isdigit():
            best = max(best or 0, int(digits) * mult)
    return best


def _median_s(fn: Callable[[], Any], sync: Callable[[], None], repeats: int) -> float:
    fn()  # warm: first-touch page faults, oneDNN/cuBLAS heuristics
    sync()
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        fn()
        sync()
        times.append(time.perf_counter() - t0)
    return statistics.median(times)


def gemm_rate(m: int, n: int, k: int, device: str = "cpu", repeats: int = REPEATS, seed: int = 0) -> float:
    """FLOP/s of ``[m, k] @ [k, n]`` in float32 (2mnk FLOPs, as FlopCounterMode counts a mm),
    median of ``repeats`` calls."""
    import torch

    gen = torch.Generator().manual_seed(seed)
    a = torch.randn(m, k, generator=gen).to(device)
    b = torch.randn(k, n, generator=gen).to(device)
    out = torch.empty(m, n, device=device)
    sync = torch.cuda.synchronize if device == "cuda" else (lambda: None)
    return 2.0 * m * n * k / _median_s(lambda: torch.mm(a, b, out=out), sync, repeats)


def copy_bandwidth(nbytes: int, device: str = "cpu", repeats: int = REPEATS) -> float:
    """Bytes/s of a streaming copy of ``nbytes`` (read once, written once: 2 * nbytes moved)."""
    import torch

    src = torch.ones(nbytes // 4, device=device)
    dst = torch.empty_like(src)
    sync = torch.cuda.synchronize if device == "cuda" else (lambda: None)
    return 2.0 * src.numel() * 4 / _median_s(lambda: dst.copy_(src), sync, repeats)


def measure_peaks(device: str = "cpu", threads: int = 1, seed: int = 0) -> dict[str, Any]:
    """The run's machine peaks (``env["peaks"]``), at the cells' thread count, medians of
    ``REPEATS`` calls: the GEMM rate of each of ``GEMM_SHAPES`` (``key_bytes``: its smaller
    operand, what the kernel keeps in cache), the streaming-copy bandwidth of a copy larger than
    the last-level cache (``bandwidth_bytes_per_s``) and of one that stays in cache
    (``cache_bandwidth_bytes_per_s``). Two to three seconds on the 2-core development machine."""
    import torch

    saved = torch.get_num_threads()
    if threads:
        torch.set_num_threads(threads)
    t0 = time.perf_counter()
    try:
        gemms = [
            {"m": m, "n": n, "k": k, "key_bytes": 4 * min(m * k, k * n),
             "flops_per_s": gemm_rate(m, n, k, device, seed=seed)}
            for m, n, k in GEMM_SHAPES
        ]  # fmt: skip
        llc = last_level_cache_bytes() if device == "cpu" else None
        nbytes = max(COPY_MIN_BYTES, int(1.25 * (llc or 0)))
        bandwidth = copy_bandwidth(nbytes, device, repeats=3)
        cache_bw = copy_bandwidth(CACHE_COPY_BYTES, device) if device == "cpu" else None
    finally:
        torch.set_num_threads(saved)
    return {
        "device": device,
        "threads": threads or saved,
        "seed": seed,
        "repeats": REPEATS,
        "gemm": gemms,
        "gemm_flops_per_s": max(g["flops_per_s"] for g in gemms),
        "copy_bytes": nbytes,
        "last_level_cache_bytes": llc,
        "bandwidth_bytes_per_s": bandwidth,
        "cache_copy_bytes": CACHE_COPY_BYTES if cache_bw else None,
        "cache_bandwidth_bytes_per_s": cache_bw,
        "measure_s": time.perf_counter() - t0,
    }


def gemm_rate_for(key_bytes: int, peaks: dict[str, Any]) -> float:
    """The rate a matmul whose smaller operand has ``key_bytes`` is priced at: that of the largest
    measured shape whose own smaller operand is no larger (the rate falls as operands leave the
    cache, so a smaller shape's rate is at least the op's own: the floor stays a bound); below
    every measured shape, the best rate measured."""
    below = [g for g in peaks["gemm"] if g["key_bytes"] <= key_bytes]
    if not below:
        return float(peaks["gemm_flops_per_s"])
    return float(max(below, key=lambda g: g["key_bytes"])["flops_per_s"])


def bandwidth_for(nbytes: int, peaks: dict[str, Any]) -> tuple[float, str]:
    """(bytes/s, level) the cell's bytes are priced at: the in-cache copy's bandwidth when they fit
    in the last-level cache (they may stay there from one step to the next, and a cache-resident
    copy is the fastest the machine moves bytes), the memory copy's otherwise."""
    llc, cache_bw = peaks.get("last_level_cache_bytes"), peaks.get("cache_bandwidth_bytes_per_s")
    if llc and cache_bw and nbytes <= llc:
        return float(max(cache_bw, peaks["bandwidth_bytes_per_s"])), "cache"
    return float(peaks["bandwidth_bytes_per_s"]), "memory"


def _flop_counter(calls: list[tuple[int, int]]) -> Any:
    """A ``FlopCounterMode`` that also keeps, per counted call, (its FLOPs, the bytes of its
    second-largest tensor operand: a matmul's smaller operand). FlopCounterMode does the
    counting; the rate a call is priced at depends on that operand's size."""
    from torch.utils.flop_counter import FlopCounterMode

    class Counter(FlopCounterMode):
        def _count_flops(self, func_packet: Any, out: Any, args: Any, kwargs: Any) -> Any:
            before = self.get_total_flops()
            result = super()._count_flops(func_packet, out, args, kwargs)
            flops = self.get_total_flops() - before
            if flops:
                sizes = sorted((t.numel() * t.element_size() for t in _flatten(args)), reverse=True)
                calls.append((int(flops), sizes[1] if len(sizes) > 1 else (sizes[0] if sizes else 0)))
            return result

    return Counter(display=False)


def _storage_key(t: Any) -> tuple[int, int] | None:
    try:
        return (t.untyped_storage().data_ptr(), t.untyped_storage().nbytes())
    except (RuntimeError, NotImplementedError):
        return None


def _nbytes(tensors: Iterable[Any], seen: set[tuple[int, int]]) -> int:
    """Bytes of the distinct storages of ``tensors`` not already in ``seen`` (a view or a tensor
    met twice is counted once)."""
    import torch

    total = 0
    for t in tensors:
        if not isinstance(t, torch.Tensor):
            continue
        key = _storage_key(t)
        if key is None:
            total += t.numel() * t.element_size()
        elif key not in seen:
            seen.add(key)
            total += key[1]
    return total


def _flatten(obj: Any) -> list[Any]:
    import torch

    if isinstance(obj, torch.Tensor):
        return [obj]
    if isinstance(obj, dict):
        return [t for v in obj.values() for t in _flatten(v)]
    if isinstance(obj, list | tuple):
        return [t for v in obj for t in _flatten(v)]
    return []


def count(
    module: Any, inputs: tuple[Any, ...], train: bool, input_grads: list[bool] | None = None
) -> dict[str, Any]:
    """FLOPs and unavoidable bytes of one call of ``module`` (in ``train``: forward and backward).

    FLOPs: ``torch.utils.flop_counter.FlopCounterMode`` over the call (its matmuls, convolutions
    and attention; pointwise ops count 0, which keeps the floor a bound). Bytes, each distinct
    storage once: every parameter and buffer read, the inputs read, the outputs written; in
    ``train`` also every parameter's gradient and the gradient of each input that requires one
    (``input_grads``, as in the model's step) written, and the activations autograd saves for
    backward written once (``torch.autograd.graph.saved_tensors_hooks``: each packed tensor whose
    storage is not already counted as a parameter, buffer or input). Reading the saved activations
    back in backward, the loss and the optimizer step are left out: a lower bound.
    """
    import torch

    params = list(module.parameters()) + list(module.buffers())
    seen: set[tuple[int, int]] = set()
    param_bytes = _nbytes(params, seen)
    flags = input_grads if input_grads is not None else [False] * len(inputs)
    args = tuple(
        t.detach().clone().requires_grad_(bool(train and f and t.is_floating_point()))
        if isinstance(t, torch.Tensor)
        else t
        for t, f in zip(inputs, list(flags) + [False] * (len(inputs) - len(flags)), strict=False)
    )
    input_bytes = _nbytes(args, seen)
    saved: list[Any] = []

    def pack(t: Any) -> Any:  # what autograd saves for backward, kept to be counted
        saved.append(t)
        return t

    calls: list[tuple[int, int]] = []
    counter = _flop_counter(calls)
    if train:
        was = module.training
        module.train(True)
        try:
            with counter, torch.enable_grad():
                with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
                    out = module(*args)
                outs = [o for o in _flatten(out) if o.requires_grad]
                torch.autograd.backward(outs, [torch.ones_like(o) for o in outs])
        finally:
            module.train(was)
        output_bytes = _nbytes(_flatten(out), seen)
        saved_bytes = _nbytes(saved, seen)
        grad_bytes = _nbytes([p.grad for p in module.parameters() if p.grad is not None], set())
        grad_bytes += _nbytes(
            [a.grad for a in args if isinstance(a, torch.Tensor) and a.grad is not None], set()
        )
        module.zero_grad(set_to_none=True)
    else:
        with counter, torch.no_grad():
            out = module(*args)
        output_bytes = _nbytes(_flatten(out), seen)
        saved_bytes = grad_bytes = 0
    nbytes = param_bytes + input_bytes + output_bytes + saved_bytes + grad_bytes
    return {
        "flops": int(counter.get_total_flops()),
        "flop_calls": calls,
        "bytes": int(nbytes),
        "param_bytes": param_bytes,
        "input_bytes": input_bytes,
        "output_bytes": output_bytes,
        "saved_bytes": saved_bytes,
        "grad_bytes": grad_bytes,
    }


def floor(counts: dict[str, Any], peaks: dict[str, Any]) -> dict[str, Any]:
    """The cell's ``floor`` object: compute time (each counted call at ``gemm_rate_for`` its
    operand; FLOPs no call was recorded for, at the best rate), memory time (``bandwidth_for``)
    and ``floor_ms``, the larger of the two: compute and memory traffic overlap at best
    perfectly."""
    calls = [tuple(c) for c in counts.get("flop_calls", [])]
    compute_s = sum(f / gemm_rate_for(k, peaks) for f, k in calls)
    compute_s += max(0, counts["flops"] - sum(f for f, _ in calls)) / peaks["gemm_flops_per_s"]
    bandwidth, level = bandwidth_for(counts["bytes"], peaks)
    compute_ms, memory_ms = 1e3 * compute_s, 1e3 * counts["bytes"] / bandwidth
    figures = {k: v for k, v in counts.items() if k != "flop_calls"}
    return {
        **figures,
        "flop_calls": len(calls),
        "compute_ms": compute_ms,
        "memory_ms": memory_ms,
        "memory_level": level,
        "bound": "compute" if compute_ms >= memory_ms else "memory",
        "floor_ms": max(compute_ms, memory_ms),
    }


def fill_cell(cell: dict[str, Any], counts: dict[str, Any], peaks: dict[str, Any]) -> None:
    """Record ``floor`` (the figures), ``floor_ms`` and ``of_floor = floor_ms / median_ms`` in
    ``cell``; ``of_floor`` is left out when the cell has no latency."""
    f = floor(counts, peaks)
    cell["floor"] = f
    cell["floor_ms"] = f["floor_ms"]
    median = (cell.get("latency_ms") or {}).get("median")
    cell["of_floor"] = f["floor_ms"] / median if median else None
