"""The driver's memory check: which rewrites that add live bytes it may take this round.

WHY a separate gate rather than a price in seconds: time and memory are not one currency. A
rewrite that keeps more alive at once only matters where it lifts the graph's peak; there it
must pay by a margin the caller states (``OptimusConfig.memory_margin``), and it may never lift
the peak past a stated budget (``OptimusConfig.memory_budget_bytes``).

Within a round the graph's estimate (``RewriteContext.live``) is not rebuilt after each
rewrite, so the gate keeps an upper bound: every rewrite taken this round may have added its
bytes anywhere (``added``), and the peak is at most the largest projection taken so far. The
next round starts again from an exact estimate of the rewritten graph.

With the default settings (``memory_margin`` 0.0, no budget) no rewrite the driver would take
can be refused (it is taken only when it saves time), so the gate is inert and reads no
estimate: the O(n) estimate is then not paid for every round.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

from .candidate import Candidate
from .config import OptimusConfig

if TYPE_CHECKING:
    from .context import RewriteContext
    from .memory import LiveEstimate


@dataclass
class MemoryGate:
    ctx: RewriteContext  # the round's context: its estimate is read only when the gate is active
    config: OptimusConfig
    added: float = 0.0  # live bytes the rewrites taken this round may have added
    _peak: float | None = None  # bound on the estimated peak after those rewrites (read lazily)

    @property
    def active(self) -> bool:
        return self.config.memory_margin > 0 or self.config.memory_budget_bytes is not None

    @property
    def est(self) -> LiveEstimate:
        return self.ctx.live

    @property
    def peak(self) -> float:
        if self._peak is None:
            self._peak = self.est.peak
        return self._peak

    def refusal(self, cand: Candidate) -> str | None:
        """Why ``cand`` may not be taken (a ``declined_reasons`` key), or None."""
        delta = cand.live_delta
        if delta <= 0 or not self.active:
            return None
        projected = max((self.est.at(n) for n in cand.nodes), default=0.0) + self.added + delta
        budget = self.config.memory_budget_bytes
        if budget is not None and max(self.peak, projected) > budget:
            return f"{cand.rule}: over memory_budget_bytes"
        if projected > self.peak and cand.gain_share <= self.config.memory_margin:
            return f"{cand.rule}: raises peak memory, gain within memory_margin"
        return None

    def take(self, cand: Candidate) -> None:
        """Record a rewrite the driver applied."""
        delta = cand.live_delta
        if delta > 0 and self.active:
            projected = max((self.est.at(n) for n in cand.nodes), default=0.0) + self.added + delta
            self._peak = max(self.peak, projected)
            self.added += delta
