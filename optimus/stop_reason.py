"""Why the driver stopped, as a value that carries the limit it hit.

WHY a type and not a string: "iteration_limit" alone does not say which limit a run was given,
so a reader of a results file could not tell a run cut short at 1 round from one cut at 20.
``str()`` gives the printable form (``saturated``, ``iteration_limit(limit=20)``,
``time_limit(limit_s=60.0)``), which is what ``OptimusReport.as_dict()`` and the harness record.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import Enum


class StopKind(Enum):
    SATURATED = "saturated"  # a round changed nothing (or a broken round was rolled back)
    ITERATION_LIMIT = "iteration_limit"  # OptimusConfig.max_iterations rounds ran
    NODE_LIMIT = "node_limit"  # the graph grew past max_nodes
    TIME_LIMIT = "time_limit"  # the driver ran past time_limit_s
    UNCHANGED = "unchanged"  # optimization failed or could not run: the graph is returned as it was
    NOT_RUN = "not_run"  # the driver has not run (a fresh report)


_LIMIT_NAME = {
    StopKind.ITERATION_LIMIT: "limit",
    StopKind.NODE_LIMIT: "limit",
    StopKind.TIME_LIMIT: "limit_s",
}


@dataclass(frozen=True)
class StopReason:
    """``kind``, and for the three limits the ``limit`` in force (rounds, nodes or seconds)."""

    kind: StopKind
    limit: float | None = None

    def __post_init__(self) -> None:
        if (self.limit is None) == (self.kind in _LIMIT_NAME):
            raise ValueError(f"stop reason {self.kind.value}: limit {self.limit!r} given or missing wrongly")

    def __str__(self) -> str:
        if self.limit is None:
            return self.kind.value
        return f"{self.kind.value}({_LIMIT_NAME[self.kind]}={self.limit})"

    @classmethod
    def saturated(cls) -> StopReason:
        return cls(StopKind.SATURATED)

    @classmethod
    def unchanged(cls) -> StopReason:
        return cls(StopKind.UNCHANGED)

    @classmethod
    def not_run(cls) -> StopReason:
        return cls(StopKind.NOT_RUN)

    @classmethod
    def iteration_limit(cls, limit: int) -> StopReason:
        return cls(StopKind.ITERATION_LIMIT, limit)

    @classmethod
    def node_limit(cls, limit: int) -> StopReason:
        return cls(StopKind.NODE_LIMIT, limit)

    @classmethod
    def time_limit(cls, limit_s: float) -> StopReason:
        return cls(StopKind.TIME_LIMIT, limit_s)
