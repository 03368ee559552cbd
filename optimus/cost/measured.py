"""MeasuredCostModel: the CostModel protocol with per-device constants measured on this machine.

WHY: the analytic default prices a launch, a byte and a FLOP with constants written for "a CPU" and
"a GPU". Whether batching G small ops into one pays depends on the real ratio of dispatch overhead
to bandwidth and matmul throughput on *this* device, thread count and torch build; the same rule
should fire where launches are dear and decline where they are cheap. So: three small timing
probes, run once per (device, torch version, thread count) and cached as JSON:

* launch_s: median time of a 1-element ``torch.add`` (dispatcher + kernel launch);
* bytes_per_s: a large ``copy_`` (read + write bytes / time);
* flops_per_s: a square ``mm`` (2 n^3 / time, launch time subtracted).

Cache: ``$OPTIMUS_CACHE_DIR`` or ``~/.cache/optimus``, one file per key (no read-modify-write),
written atomically (temp file + rename), plain JSON (never pickle); a missing, unreadable or
mismatching file is recalibrated. Use: ``OptimusConfig(cost_model="measured")`` or
``OptimusConfig(cost_model=MeasuredCostModel())``.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import platform
import statistics
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import torch

from optimus.atomic import write_atomic
from optimus.cost.analytic import AnalyticCostModel, CostModel, DeviceConstants
from optimus.cost.price import Cost
from optimus.cost.timing import time_block

SCHEMA = 1
ENV_DIR = "OPTIMUS_CACHE_DIR"


def cache_dir() -> Path:
    env = os.environ.get(ENV_DIR)
    return Path(env) if env else Path.home() / ".cache" / "optimus"


def _device_name(device: torch.device) -> str:
    if device.type == "cuda":
        return torch.cuda.get_device_name(device)
    name = platform.processor() or platform.machine()
    try:
        with open("/proc/cpuinfo", encoding="utf-8") as fh:
            for line in fh:
                if line.startswith("model name"):
                    name = line.split(":", 1)[1].strip()
                    break
    except OSError:
        pass
    return name


def cache_key(device: torch.device) -> dict[str, Any]:
    """What a calibration depends on: device kind and model, torch version, intra-op threads."""
    return {
        "device": device.type,
        "device_name": _device_name(device),
        "torch": torch.__version__,
        "threads": torch.get_num_threads(),
    }


def cache_path(key: dict[str, Any], directory: Path | None = None) -> Path:
    digest = hashlib.sha256(json.dumps(key, sort_keys=True).encode()).hexdigest()[:16]
    return (directory or cache_dir()) / f"cost-{key['device']}-{digest}.json"


def save(path: Path, key: dict[str, Any], constants: DeviceConstants, probes: dict[str, Any]) -> None:
    """Atomic JSON write (temp file in the same directory, then rename)."""
    payload = {"schema": SCHEMA, "key": key, "constants": asdict(constants), "probes": probes}
    write_atomic(path, json.dumps(payload, indent=1, sort_keys=True))


def load(path: Path, key: dict[str, Any]) -> DeviceConstants | None:
    """The cached constants if the file exists, parses, and was made for exactly ``key``."""
    try:
        payload = json.loads(path.read_text(encoding="utf-8"))
        if payload.get("schema") != SCHEMA or payload.get("key") != key:
            return None
        c = payload["constants"]
        found = DeviceConstants(float(c["launch_s"]), float(c["bytes_per_s"]), float(c["flops_per_s"]))
    except (OSError, ValueError, KeyError, TypeError, AttributeError):
        return None
    if not (found.launch_s >= 0 and found.bytes_per_s > 0 and found.flops_per_s > 0):
        return None
    return found


def _median_seconds(fn: Callable[[], Any], device: torch.device, iters: int, rounds: int = 5) -> float:
    def sync() -> None:
        if device.type == "cuda":
            torch.cuda.synchronize(device)

    fn()
    sync()
    samples = [time_block(fn, iters, sync) / iters for _ in range(rounds)]
    return statistics.median(samples)


def calibrate(device: torch.device) -> tuple[DeviceConstants, dict[str, Any]]:
    """Run the three probes (well under a second on CPU). Returns constants and the raw probes."""
    with torch.no_grad():
        a = torch.ones(1, device=device)
        launch = _median_seconds(lambda: torch.add(a, a), device, iters=200)
        n_bytes = 8 * 2**20
        src = torch.empty(n_bytes // 4, device=device)
        dst = torch.empty_like(src)
        copy_s = _median_seconds(lambda: dst.copy_(src), device, iters=5)
        n = 128 if device.type == "cpu" else 2048
        m = torch.randn(n, n, device=device)
        mm_s = _median_seconds(lambda: torch.mm(m, m), device, iters=5)
    bytes_per_s = 2 * n_bytes / max(copy_s - launch, 1e-9)
    flops_per_s = 2 * n**3 / max(mm_s - launch, 1e-9)
    probes = {"add_1elem_s": launch, "copy_bytes": n_bytes, "copy_s": copy_s, "mm_n": n, "mm_s": mm_s}
    return DeviceConstants(launch, bytes_per_s, flops_per_s), probes


def constants_for(device: torch.device, directory: Path | None = None) -> DeviceConstants:
    """Cached constants for ``device`` (calibrating and caching them on a miss)."""
    key = cache_key(device)
    path = cache_path(key, directory)
    found = load(path, key)
    if found is not None:
        return found
    constants, probes = calibrate(device)
    with contextlib.suppress(OSError):  # a read-only home still gets a measured, uncached model
        save(path, key, constants, probes)
    return constants


@dataclass
class MeasuredCostModel:
    """time = launches * launch_s + bytes / bandwidth + flops / throughput, with the constants
    measured on this machine per device type (``constants`` may be given, e.g. in tests)."""

    min_group: int = 2
    max_group: int = 128
    constants: dict[str, DeviceConstants] = field(default_factory=dict)
    directory: Path | None = None
    inductor: bool = False  # the graph goes to Inductor (see optimus.cost.analytic)

    def __post_init__(self) -> None:
        AnalyticCostModel(
            min_group=self.min_group, max_group=self.max_group, inductor=self.inductor
        )  # same validation
        if not self.constants:  # calibrate now: the model's fingerprint must not change later
            self.constants["cpu"] = constants_for(torch.device("cpu"), self.directory)
            if torch.cuda.is_available():
                self.constants["cuda"] = constants_for(torch.device("cuda"), self.directory)

    def seconds(self, cost: Cost, device: torch.device) -> float:
        k = self.constants.get(device.type)
        if k is None:
            self.constants[device.type] = k = constants_for(device, self.directory)
        return cost.launches * k.launch_s + cost.bytes / k.bytes_per_s + cost.flops / k.flops_per_s


NAMES = ("analytic", "measured")


def cost_model_by_name(name: str) -> CostModel:
    """``OptimusConfig(cost_model="measured")`` and ``"analytic"``."""
    if name == "analytic":
        return AnalyticCostModel()
    if name == "measured":
        return MeasuredCostModel()
    raise ValueError(f"cost_model must be a CostModel or one of {NAMES}, got {name!r}")
