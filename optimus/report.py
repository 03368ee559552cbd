"""OptimusReport: what one optimization did (attached to the GraphModule as ``optimus_report``),
and StopReason, why the driver stopped, as a value that carries the limit it hit.

WHY a type and not a string: "iteration_limit" alone does not say which limit a run was given,
so a reader of a results file could not tell a run cut short at 1 round from one cut at 20.
``str()`` gives the printable form (``saturated``, ``iteration_limit(limit=20)``,
``time_limit(limit_s=60.0)``), which is what ``OptimusReport.as_dict()`` and the harness record."""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from enum import Enum
from typing import Any


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


@dataclass
class RoundRecord:
    """One driver round: rewrites applied per rule, and where its time went.

    ``match_s``: building the graph index and collecting and pricing every rule's candidates.
    ``apply_s``: the cleanup rules (they match and rewrite in one pass), applying candidates,
    restoring topological order and erasing what was replaced.
    """

    round: int
    applied: dict[str, int] = field(default_factory=dict)
    match_s: float = 0.0
    apply_s: float = 0.0


@dataclass
class GuardTrial:
    """One side-by-side measurement of the measured guard (``optimus.guard``): a rewritten graph
    against the plain capture, on the example inputs.

    ``left_out``: the rule whose rewrites this variant went without (None: the driver's whole
    result). ``speedup``: the median over ``rounds`` paired rounds of plain seconds / rewritten
    seconds (above 1: the rewrite is faster); ``low``/``high``: the 95% interval of that median
    (order statistics, :func:`optimus.cost.timing.median_interval`). ``fired``: what the variant's
    driver run fired. ``kept``: the guard returned this variant."""

    left_out: str | None
    speedup: float
    low: float
    high: float
    rounds: int
    fired: dict[str, int] = field(default_factory=dict)
    kept: bool = False


@dataclass
class OptimusReport:
    rules_fired: dict[str, int] = field(default_factory=dict)
    nodes_before: int = 0
    nodes_after: int = 0
    seconds: float = 0.0  # the optimizer's own time (rules + driver), excluding capture
    stop_reason: StopReason = field(default_factory=StopReason.not_run)
    iterations: int = 0
    declined: dict[str, int] = field(default_factory=dict)  # candidates the cost model rated no faster
    rolled_back: dict[str, int] = field(default_factory=dict)  # rewrites undone (error, lint, mismatch)
    # rewrites the engine refused because it could not show them safe, by reason ("cse: random op:
    # not merged", "batch_linear: grouping across grad region", ...)
    declined_reasons: dict[str, int] = field(default_factory=dict)
    graphs: int = 0  # Dynamo graphs optimized (more than 1 when the model has graph breaks)
    # dynamo-subgraphs path only: graphs Dynamo compiled (and optimus optimized) at calls after
    # optimize() returned (a new input shape, a new KJT length), and whether Dynamo's recompile
    # limit was reached, after which calls that match no compiled graph run eagerly, unoptimized
    recompiles: int = 0
    recompile_limit_hit: bool = False
    capture: str = ""  # "export" | "graph" | "dynamo-subgraphs" | "pre_grad" | "backend"
    notes: list[str] = field(default_factory=list)
    capture_seconds: float = 0.0  # Dynamo capture (export / compile of the subgraphs)
    capture_reason: str = ""  # why this capture path ran (e.g. what made whole-graph export fail)
    # one line per graph optimize()'s result re-optimized after the first, at a call that did
    # not match it (another input shape or scalar, or a train/eval switch); see specialized.py
    specializations: list[str] = field(default_factory=list)
    rounds: list[RoundRecord] = field(default_factory=list)  # one per driver round, in order
    # the estimated peak of live tensor bytes (optimus.memory.live: forward, parameters excluded) of
    # the graph as captured and as optimized; with graph breaks, the largest graph's
    live_peak_before: float = 0.0
    live_peak_after: float = 0.0
    # vertical chains (optimus.engine.vertical) taken as one rewrite under the memory gate, by name
    # ("vertical chain (batch_linear > batch_layer_norm > batch_unary)"); their links count in
    # rules_fired as well
    chains: dict[str, int] = field(default_factory=dict)
    # fused chains an inference graph for Inductor runs a few members at a time
    # (optimus.memory.chunked); why others were left whole is in ``notes``
    chunked_groups: int = 0
    # the measured guard (OptimusConfig.guard, optimus.guard): "off"; "kept" (the driver's result
    # measured faster than plain capture); "kept without RULE" (the best measured variant); "rejected"
    # (the plain capture is returned); "not run: why"
    guard: str = "off"
    guard_trials: list[GuardTrial] = field(default_factory=list)  # every measurement, in order
    # rewrites the guard took out, by rule (rules_fired is what the returned graph holds)
    guard_rejected: dict[str, int] = field(default_factory=dict)
    guard_seconds: float = 0.0  # measuring and re-running the driver; included in ``seconds``

    def fired(self, rule: str, n: int = 1) -> None:
        self.rules_fired[rule] = self.rules_fired.get(rule, 0) + n

    def merge(self, other: OptimusReport) -> None:
        """Aggregate another graph's report into this one (graph breaks)."""
        for mine, theirs in (
            (self.rules_fired, other.rules_fired),
            (self.declined, other.declined),
            (self.rolled_back, other.rolled_back),
            (self.declined_reasons, other.declined_reasons),
            (self.chains, other.chains),
            (self.guard_rejected, other.guard_rejected),
        ):
            for k, v in theirs.items():
                mine[k] = mine.get(k, 0) + v
        self.nodes_before += other.nodes_before
        self.nodes_after += other.nodes_after
        self.seconds += other.seconds
        self.chunked_groups += other.chunked_groups
        self.guard_seconds += other.guard_seconds
        self.guard_trials.extend(other.guard_trials)
        if other.guard != "off" and other.guard not in self.guard.split("; "):
            self.guard = other.guard if self.guard == "off" else f"{self.guard}; {other.guard}"
        self.iterations = max(self.iterations, other.iterations)
        self.live_peak_before = max(self.live_peak_before, other.live_peak_before)
        self.live_peak_after = max(self.live_peak_after, other.live_peak_after)
        self.graphs += other.graphs
        quiet = (StopKind.NOT_RUN, StopKind.SATURATED, StopKind.UNCHANGED)
        if self.stop_reason.kind in quiet and other.stop_reason.kind is not StopKind.NOT_RUN:
            self.stop_reason = other.stop_reason
        self.notes.extend(other.notes)
        self.rounds.extend(other.rounds)

    def as_dict(self) -> dict[str, Any]:
        """Plain JSON-ready values; ``stop_reason`` as its printable string (see StopReason)."""
        d = asdict(self)
        d["stop_reason"] = str(self.stop_reason)
        return d

    def guard_summary(self) -> str:
        """One line: what the measured guard decided and by how much (empty when it was off)."""
        if self.guard == "off":
            return ""
        parts = [f"guard: {self.guard}"]
        for t in self.guard_trials:
            what = "the whole rewrite" if t.left_out is None else f"without {t.left_out}"
            verdict = "kept" if t.kept else "not kept"
            parts.append(f"{what} {t.speedup:.3f}x ({t.low:.3f}-{t.high:.3f}, {t.rounds} rounds): {verdict}")
        if self.guard_rejected:
            rejected = ", ".join(f"{k} x{v}" for k, v in sorted(self.guard_rejected.items()))
            parts.append(f"rejected {rejected}")
        parts.append(f"{self.guard_seconds:.2f} s")
        return "; ".join(parts)
