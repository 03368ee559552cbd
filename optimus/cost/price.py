"""What a rewrite costs, in device-independent units (:class:`Cost`).

WHY its own module at the bottom: cost models price it, the engine's candidates carry it, and the
semantics helpers that price layout copies return it; none of them may import the others.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Cost:
    """What a piece of graph costs to run, in device-independent units the cost model prices:
    kernel launches (or framework dispatches), bytes read+written, floating-point operations;
    and ``live_bytes``, the most tensor bytes the piece holds at once (see ``optimus.memory.live``),
    which the driver weighs against the graph's estimated peak, not against time."""

    launches: float = 0.0
    bytes: float = 0.0
    flops: float = 0.0
    live_bytes: float = 0.0

    def __add__(self, other: Cost) -> Cost:
        # two pieces' live bytes may coexist: their sum bounds what they hold at once
        return Cost(
            self.launches + other.launches,
            self.bytes + other.bytes,
            self.flops + other.flops,
            self.live_bytes + other.live_bytes,
        )
