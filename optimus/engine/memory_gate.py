"""The driver's memory check: which rewrites that add live bytes it may take this round.

WHY a separate gate rather than a price in seconds: time and memory are not one currency. A
rewrite that keeps more alive at once only matters where it lifts the graph's peak; there it
must pay by a margin the caller states (``OptimusConfig.memory_margin``), and it may never lift
the peak past a stated budget (``OptimusConfig.memory_budget_bytes``).

Within a round the graph's estimate (``RewriteContext.live``) is not rebuilt after each
rewrite, so the gate keeps an upper bound: every rewrite taken this round may have added its
bytes anywhere (``added``), and the peak is at most the largest projection taken so far. The
next round starts again from an exact estimate of the rewritten graph.

``memory_ceiling`` (the benchmark's Optimus modes use ``optimus.memory.live.MEMORY_CEILING``) is
a budget the driver derives once, from the graph as captured (``ceiling``, in live bytes): the program's estimated
memory (parameters and buffers plus the live peak) may grow by at most that fraction. It is what
keeps a tiny model's peak where compile's is: there a stacked group of twelve towers holds more
than the whole unfused graph does at once, and the time it saves does not buy that. With
``memory_ceiling=None``, ``memory_margin`` 0.0 and no budget, no rewrite the driver would take
can be refused (it is taken only when it saves time), so the gate is inert and reads no
estimate: the O(n) estimate is then not paid for every round.

A vertical chain (``optimus.engine.vertical``: a fused group and the per-member chain after it) is
judged as one rewrite, on exact estimates of the graph before and after it (``exact``,
``chain_refusal``): its links are only worth their memory together, and the projection above
(the live bytes where one candidate's members run, plus its own delta) cannot see a later link
reading an earlier one's stacked output and freeing it. After a chain is taken, the gate
continues from the exact estimate (``adopt``).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

from optimus.engine.candidate import Candidate
from optimus.memory.live import LiveEstimate, estimate
from optimus.semantics.graph_index import stable_toposort

if TYPE_CHECKING:
    from optimus.config import OptimusConfig
    from optimus.engine.context import RewriteContext


@dataclass
class MemoryGate:
    ctx: RewriteContext  # the round's context: its estimate is read only when the gate is active
    config: OptimusConfig
    ceiling: float | None = None  # live bytes the memory_ceiling allows (the driver derives it)
    added: float = 0.0  # live bytes the rewrites taken this round may have added
    _peak: float | None = None  # bound on the estimated peak after those rewrites (read lazily)
    _est: LiveEstimate | None = None  # an exact estimate adopted mid-round (after a chain)

    @property
    def active(self) -> bool:
        return self.config.memory_margin > 0 or self.budget is not None

    @property
    def budget(self) -> float | None:
        """The lower of ``memory_budget_bytes`` and the ceiling's budget (None: neither)."""
        limits = [b for b in (self.config.memory_budget_bytes, self.ceiling) if b is not None]
        return min(limits) if limits else None

    @property
    def est(self) -> LiveEstimate:
        return self._est if self._est is not None else self.ctx.live

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
        budget = self.budget
        if budget is not None and max(self.peak, projected) > budget:
            return f"{cand.rule}: {self._over(max(self.peak, projected))}"
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

    def exact(self) -> LiveEstimate:
        """The estimate of the graph as it is now, mid-round: put in topological order (as the
        end of the round will), the nodes rewrites of this round replaced (and nothing reads any
        more) left out. O(n)."""
        ctx = self.ctx
        stable_toposort(ctx.graph, ctx.index.chained)
        gone = {n for n in ctx.leftovers if not n.users}
        nodes = [n for n in ctx.graph.nodes if n not in gone]
        return estimate(nodes, {n: ctx.canon(n) for n in nodes}, ctx.inductor)

    def chain_refusal(self, name: str, before: float, after: float, gain_share: float) -> str | None:
        """Why a chain that moves the exact estimated peak from ``before`` to ``after`` and saves
        ``gain_share`` of its own time may not be taken, or None. A chain that does not lift the
        peak is always taken (as a single rewrite that adds no live bytes would be)."""
        if after <= before:
            return None
        budget = self.budget
        if budget is not None and after > budget:
            return f"{name}: {self._over(after)}"
        if gain_share <= self.config.memory_margin:
            return f"{name}: raises peak memory, gain within memory_margin"
        return None

    def _over(self, peak: float) -> str:
        """Which limit a peak of ``peak`` live bytes breaks (the budget named first)."""
        budget = self.config.memory_budget_bytes
        return "over memory_budget_bytes" if budget is not None and peak > budget else "over memory_ceiling"

    def adopt(self, est: LiveEstimate) -> None:
        """Continue from an exact estimate of the graph as it is now (after a chain was taken)."""
        self._est = est
        self._peak = est.peak
        self.added = 0.0
