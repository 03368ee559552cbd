"""The engine's vocabulary: what a rewrite costs (:class:`Cost`) and one rewrite a rule offers
(:class:`Candidate`).

WHY here and not in ``rules/``: the engine (context, driver, cost models) works in these types,
and the rules build on the engine; defining them in ``rules/`` made the engine import the rule
package, which imports the engine back (an import cycle). ``optimus.rules.base`` re-exports both,
so a rule file imports everything it needs from one place.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from torch import fx


@dataclass(frozen=True)
class Cost:
    """What a piece of graph costs to run, in device-independent units the cost model prices:
    kernel launches (or framework dispatches), bytes read+written, floating-point operations."""

    launches: float = 0.0
    bytes: float = 0.0
    flops: float = 0.0

    def __add__(self, other: Cost) -> Cost:
        return Cost(self.launches + other.launches, self.bytes + other.bytes, self.flops + other.flops)


@dataclass(eq=False)
class Candidate:
    """One rewrite a rule offers. ``nodes`` are the nodes it replaces (in order; for a horizontal
    group the members). No two candidates touching the same node are applied in one round."""

    rule: str
    nodes: tuple[fx.Node, ...]
    before: Cost
    after: Cost
    label: float = 0.0  # where the rewritten computation sits in the depth labelling
    data: Any = None  # rule-private payload handed back to ``apply``
    gain: float = field(default=0.0)  # set by the driver from the cost model (seconds saved)
