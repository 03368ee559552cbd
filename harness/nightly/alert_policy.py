"""When a change point becomes an alert: the detector and the pairwise gate agree, or it persists.

Why two routes: the change-point detector (``harness.nightly.changepoints``) needs several nights at
a new level before a t-test between the segments is convincing, and on one noisy night it
is silent; the pairwise gate (``harness.gate.compare`` + reruns, tonight against the last good
night) sees a large step the night it lands but also fires on noisy nights and never on a
slow creep. So a regression change point alerts

* early (``agree``), when the pairwise gate flagged each of the change's first
  ``agree_nights`` nights: both saw the same step. (At this machine's night-to-night noise
  the pairwise gate flags a night in five by chance, so one flag agreeing is not enough.)
* alone (``persist``), once the detector has found it (within ``dedupe`` nights of the same
  place) on ``persist_nights`` consecutive nights: a change point that noise put there tends
  to move or vanish as nights are added, a real one stays.

A change smaller than ``min_change`` is reported, never alerted. Each change alerts once: a
change point is the one already alerted when it lies within ``dedupe`` nights of it, or when
no other change point lies between the two (the detector's place for a change moves as
nights are added, sometimes by more than a few nights).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field

from harness.nightly.changepoints import Change


@dataclass(frozen=True)
class AlertPolicy:
    persist_nights: int = 3
    agree_nights: int = 2
    min_change: float = 0.03
    dedupe: int = 3

    def validate(self) -> AlertPolicy:
        for name in ("persist_nights", "agree_nights", "dedupe"):
            v = getattr(self, name)
            if isinstance(v, bool) or not isinstance(v, int) or v < 1:
                raise ValueError(f"alert.{name}: must be an integer >= 1, got {v!r}")
        m = self.min_change
        if isinstance(m, bool) or not isinstance(m, int | float) or not math.isfinite(m) or m < 0:
            raise ValueError(f"alert.min_change: must be a finite number >= 0, got {m!r}")
        return self


@dataclass
class Tracker:
    """The alert state of one series, fed night after night (replayed from the history)."""

    policy: AlertPolicy
    streaks: dict[int, int] = field(default_factory=dict)  # change index -> consecutive nights seen
    alerted: list[int] = field(default_factory=list)

    def night(self, changes: Sequence[Change], flagged: Sequence[bool]) -> list[tuple[Change, str]]:
        """Tonight's detected ``changes`` (of the history up to tonight) and the pairwise gate's
        flags of every night so far; returns the changes to alert on, each with its reason."""
        p = self.policy
        candidates = [c for c in changes if c.regression and abs(c.change) >= p.min_change]
        streaks = {}
        for c in candidates:
            before = [n for i, n in self.streaks.items() if abs(i - c.index) <= p.dedupe]
            streaks[c.index] = 1 + max(before, default=0)
        self.streaks = streaks
        out: list[tuple[Change, str]] = []
        for c in candidates:
            if any(self._same(c, a, changes) for a in self.alerted):
                continue
            first = flagged[c.index : c.index + p.agree_nights]
            if len(first) == p.agree_nights and all(first):
                out.append((c, "agree"))
            elif streaks[c.index] >= p.persist_nights:
                out.append((c, "persist"))
            else:
                continue
            self.alerted.append(c.index)
        return out

    def _same(self, c: Change, alerted: int, changes: Sequence[Change]) -> bool:
        return same_change(c, alerted, changes, self.policy.dedupe)


def same_change(c: Change, alerted: int, changes: Sequence[Change], dedupe: int) -> bool:
    """Is ``c`` (one of tonight's ``changes``) the change alerted at index ``alerted``?"""
    if abs(c.index - alerted) <= dedupe:
        return True
    lo, hi = sorted((c.index, alerted))
    return not any(lo < o.index < hi or (o.index == alerted and o is not c) for o in changes)
