"""Cost model: a small protocol and an analytic default.

WHY: a batched op saves kernel launches but may move more bytes (stacking inputs and weights).
Whether that pays depends on the device: on CPU a "launch" is a few microseconds of dispatcher
overhead and memory bandwidth is low; on CUDA launches cost about as much but bandwidth is ~100x
higher. The driver asks the model to price a candidate's before/after :class:`Cost` and applies
only rewrites rated faster. Replace the default with a measured model by implementing
``seconds``/``min_group``/``max_group``.

A model may also say that Inductor compiles the result (``inductor=True``). Then a copy whose
only reader is a ``cat`` costs nothing of its own: Inductor writes it straight into the cat's
output in the cat's loop, where eager runs it as one more kernel over the bytes. Whether
such a rewrite pays depends on who runs the graph, as well as on the device.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any, Protocol, runtime_checkable

import torch

from optimus.cost.price import Cost


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
    """time = launches * launch_s + bytes / bandwidth + flops / throughput (per device).

    ``inductor``: the rewritten graph is compiled by Inductor (see the module docstring).
    """

    cpu: DeviceConstants = CPU
    cuda: DeviceConstants = CUDA
    min_group: int = 2
    max_group: int = 128
    inductor: bool = False

    def __post_init__(self) -> None:
        if not (isinstance(self.min_group, int) and self.min_group >= 2):
            raise ValueError(f"min_group must be an int >= 2, got {self.min_group!r}")
        if not (isinstance(self.max_group, int) and self.max_group >= self.min_group):
            raise ValueError(
                f"max_group must be an int >= min_group ({self.min_group}), got {self.max_group!r}"
            )
        if not isinstance(self.inductor, bool):
            raise ValueError(f"inductor must be a bool, got {self.inductor!r}")

    def constants(self, device: torch.device) -> DeviceConstants:
        return self.cuda if device.type == "cuda" else self.cpu

    def seconds(self, cost: Cost, device: torch.device) -> float:
        k = self.constants(device)
        return cost.launches * k.launch_s + cost.bytes / k.bytes_per_s + cost.flops / k.flops_per_s


def for_inductor(cost_model: Any) -> Any:
    """``cost_model`` pricing for Inductor: a copy with ``inductor=True`` when it is a dataclass
    with that field (the two built-in models), else unchanged (a custom model decides itself)."""
    if getattr(cost_model, "inductor", False) is True:
        return cost_model
    is_instance = dataclasses.is_dataclass(cost_model) and not isinstance(cost_model, type)
    if is_instance and any(f.name == "inductor" for f in dataclasses.fields(cost_model)):
        return dataclasses.replace(cost_model, inductor=True)
    return cost_model
