"""Cost model: a small protocol and an analytic default.

WHY: a batched op saves kernel launches but may move more bytes (stacking inputs and weights).
Whether that pays depends on the device: on CPU a "launch" is a few microseconds of dispatcher
overhead and memory bandwidth is low; on CUDA launches cost about as much but bandwidth is ~100x
higher. The driver asks the model to price a candidate's before/after :class:`Cost` and applies
only rewrites rated faster. Replace the default with a measured model by implementing
``seconds``/``min_group``/``max_group``.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol, runtime_checkable

import torch

from .rules.base import Cost


@runtime_checkable
class CostModel(Protocol):
    min_group: int
    max_group: int

    def seconds(self, cost: Cost, device: torch.device) -> float: ...


@dataclass(frozen=True)
class DeviceConstants:
    launch_s: float  # per op dispatched (framework + kernel launch)
    bytes_per_s: float  # sustained memory bandwidth
    flops_per_s: float  # sustained fp32 throughput


CPU = DeviceConstants(launch_s=8e-6, bytes_per_s=10e9, flops_per_s=50e9)
CUDA = DeviceConstants(launch_s=6e-6, bytes_per_s=1.5e12, flops_per_s=30e12)


@dataclass
class AnalyticCostModel:
    """time = launches * launch_s + bytes / bandwidth + flops / throughput (per device)."""

    cpu: DeviceConstants = CPU
    cuda: DeviceConstants = CUDA
    min_group: int = 2
    max_group: int = 128

    def __post_init__(self) -> None:
        if not (isinstance(self.min_group, int) and self.min_group >= 2):
            raise ValueError(f"min_group must be an int >= 2, got {self.min_group!r}")
        if not (isinstance(self.max_group, int) and self.max_group >= self.min_group):
            raise ValueError(
                f"max_group must be an int >= min_group ({self.min_group}), got {self.max_group!r}"
            )

    def constants(self, device: torch.device) -> DeviceConstants:
        return self.cuda if device.type == "cuda" else self.cpu

    def seconds(self, cost: Cost, device: torch.device) -> float:
        k = self.constants(device)
        return cost.launches * k.launch_s + cost.bytes / k.bytes_per_s + cost.flops / k.flops_per_s
