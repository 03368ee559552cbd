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
    kernel launches (or framework dispatches), bytes read+written, floating-point operations;
    and ``live_bytes``, the most tensor bytes the piece holds at once (see ``optimus.memory``),
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
    gain_share: float = field(default=0.0)  # set by the driver: gain / the before's seconds

    @property
    def live_delta(self) -> float:
        """Bytes the rewrite adds to what is alive at once (negative: it frees some)."""
        return self.after.live_bytes - self.before.live_bytes
