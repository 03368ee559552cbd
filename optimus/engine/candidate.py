"""One rewrite a rule offers (:class:`Candidate`), priced in :class:`optimus.cost.price.Cost`.

WHY in the engine and not in ``rules/``: the context, the driver and the memory gate work in this
type, and the rules build on the engine.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from torch import fx

from optimus.cost.price import Cost


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
