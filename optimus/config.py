"""OptimusConfig: the one options object (rules, cost model, verify, limits)."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, replace
from typing import Any

from optimus.cost.analytic import AnalyticCostModel, CostModel
from optimus.engine.param_layout import ParamLayout, RuntimeStack
from optimus.memory.chunked import CHUNK_BYTES

# OptimusConfig.guard: what the measured guard (optimus.guard) does after the driver
GUARD_MODES = ("off", "graph", "rules")


@dataclass(frozen=True)
class OptimusConfig:
    """Options for :func:`optimus.optimize`, the ``"optimus"`` backend and ``pre_grad_pass``.

    rules: rule names to run (None: all registered, see ``optimus.RULES``).
    cost_model: prices candidates; default :class:`~optimus.cost.analytic.AnalyticCostModel`; the name
        ``"measured"`` gives :class:`~optimus.cost.measured.MeasuredCostModel` (calibrated, cached)
        (its ``min_group``/``max_group`` bound horizontal group sizes).
    verify: run original and rewritten graphs on seeded inputs after every rewrite, comparing
        outputs and gradients; roll back any rewrite that changes them (slower; for debugging).
    max_iterations / max_nodes / time_limit_s: driver limits (reported as the stop reason).
    rtol / atol: override the dtype-aware verify tolerances.
    memory_margin: a rewrite that raises the graph's estimated peak of live bytes (see
        ``optimus.memory.live``) is taken only when it saves more than this fraction of its own time
        (0.0: whenever it is faster; 1.0 or more: never).
    memory_budget_bytes: no rewrite may lift the estimated peak above this many bytes (None: no
        budget). Rewrites that add no live bytes are still taken when the graph is over it.
    memory_ceiling: no rewrite may lift the estimated peak of the whole program (live bytes plus
        the parameters and buffers the graph reads) more than this fraction above that of the
        graph as captured (None, the default: no ceiling; ``optimus.memory.live.MEMORY_CEILING``,
        0.02, is what the benchmark's Optimus modes use). The whole run is tried first and kept if
        it fits; otherwise every rewrite is gated by the ceiling, and if that does not fit either
        the graph is left as captured (``optimus.api``). Opt-in because on a toy graph the
        activations are the whole program and the ceiling refuses nearly every fusion.
    memory_outside_bytes: bytes the program holds beside this graph (the embedding tables a dense
        arch runs with), counted in the whole the ceiling is a fraction of (default 0).
    inference_chunk_bytes: a graph captured in eval mode and priced for Inductor runs each fused
        chain a few members at a time, so its stacked intermediates stay about this size (see
        ``optimus.memory.chunked``); None: never.
    guard: the measured guard (``optimus.guard``; needs example inputs, runs the model). ``"off"``
        (default): the cost model alone decides. ``"graph"``: the driver's result is timed against
        the plain capture on the example inputs, ``guard_rounds`` paired rounds in alternating
        order, forward+backward for a training capture; it is kept only when the median of the
        per-round speedups is above 1, else the plain capture is returned.
        ``"rules"``: as ``"graph"``, and when the whole result loses, the driver runs again without
        each rule that fired (one at a time, within ``guard_time_limit_s``) and the fastest variant
        that beats the plain capture is kept. ``report.guard*`` say what was measured and rejected.
        Why off by default here: it runs the model (``2 * guard_rounds`` blocks of at least
        ``optimus.guard.BLOCK_S`` each, plus warm-up); the harness's eager+optimus turns it on.
    guard_rounds: paired rounds per measurement (at least 3).
    guard_time_limit_s: ``"rules"`` starts no new variant once the guard has spent this long.
    guard_measure: seconds of ``calls`` calls of ``step`` running graph module ``gm``:
        ``guard_measure(gm, step, calls)``; None: the wall clock (``optimus.cost.timing.time_block``).
        For tests (a deterministic fake) and for devices that need a synchronize.
    guard_compile: how the result will run, when not eagerly: the guard times
        ``guard_compile(plain)`` against ``guard_compile(rewritten)``, e.g.
        ``lambda gm: torch.compile(gm, fullgraph=True, dynamic=False)``, so it judges what Inductor
        makes of both graphs (a compile of each: the rewritten graph's is Dynamo's cache entry for
        the returned module, so compiling it again afterwards reuses it). None: eager.
    """

    rules: tuple[str, ...] | None = None
    cost_model: CostModel = field(default_factory=AnalyticCostModel)
    layout: ParamLayout = field(default_factory=RuntimeStack)
    verify: bool = False
    max_iterations: int = 20
    max_nodes: int | None = None  # None: 4x the starting node count + 1000
    time_limit_s: float = 60.0
    rtol: float | None = None
    atol: float | None = None
    seed: int = 0
    memory_margin: float = 0.0
    memory_budget_bytes: int | None = None
    memory_ceiling: float | None = None
    memory_outside_bytes: int = 0
    inference_chunk_bytes: int | None = CHUNK_BYTES
    guard: str = "off"
    guard_rounds: int = 9
    guard_time_limit_s: float = 30.0
    guard_measure: Callable[..., float] | None = None
    guard_compile: Callable[[Any], Callable[..., Any]] | None = None

    def __post_init__(self) -> None:
        from optimus.rules import REGISTRY

        if self.rules is not None:
            if isinstance(self.rules, str) or not isinstance(self.rules, Sequence):
                raise ValueError(f"rules must be a sequence of rule names or None, got {self.rules!r}")
            unknown = [r for r in self.rules if r not in REGISTRY]
            if unknown:
                raise ValueError(f"unknown rule name(s) {unknown}; valid rules: {sorted(REGISTRY)}")
            object.__setattr__(self, "rules", tuple(self.rules))
        if isinstance(self.cost_model, str):  # "analytic" | "measured" (see optimus.cost.measured)
            from optimus.cost.measured import cost_model_by_name

            object.__setattr__(self, "cost_model", cost_model_by_name(self.cost_model))
        for name in ("seconds", "min_group", "max_group"):
            if not hasattr(self.cost_model, name):
                raise ValueError(f"cost_model must provide {name!r} (see optimus.cost.analytic.CostModel)")
        if not isinstance(self.max_iterations, int) or self.max_iterations < 1:
            raise ValueError(f"max_iterations must be a positive int, got {self.max_iterations!r}")
        if self.max_nodes is not None and (not isinstance(self.max_nodes, int) or self.max_nodes < 1):
            raise ValueError(f"max_nodes must be a positive int or None, got {self.max_nodes!r}")
        if not self.time_limit_s > 0:
            raise ValueError(f"time_limit_s must be > 0, got {self.time_limit_s!r}")
        margin = self.memory_margin
        if isinstance(margin, bool) or not isinstance(margin, (int, float)) or not 0 <= margin < float("inf"):
            raise ValueError(f"memory_margin must be a finite number >= 0, got {margin!r}")
        budget = self.memory_budget_bytes
        if budget is not None and (isinstance(budget, bool) or not isinstance(budget, int) or budget < 1):
            raise ValueError(f"memory_budget_bytes must be a positive int or None, got {budget!r}")
        ceiling = self.memory_ceiling
        if ceiling is not None and (
            isinstance(ceiling, bool)
            or not isinstance(ceiling, (int, float))
            or not 0 <= ceiling < float("inf")
        ):
            raise ValueError(f"memory_ceiling must be a finite number >= 0 or None, got {ceiling!r}")
        outside = self.memory_outside_bytes
        if isinstance(outside, bool) or not isinstance(outside, int) or outside < 0:
            raise ValueError(f"memory_outside_bytes must be an int >= 0, got {outside!r}")
        chunk = self.inference_chunk_bytes
        if chunk is not None and (isinstance(chunk, bool) or not isinstance(chunk, int) or chunk < 1):
            raise ValueError(f"inference_chunk_bytes must be a positive int or None, got {chunk!r}")
        if self.guard not in GUARD_MODES:
            raise ValueError(f"guard must be one of {', '.join(GUARD_MODES)}, got {self.guard!r}")
        rounds = self.guard_rounds
        if isinstance(rounds, bool) or not isinstance(rounds, int) or rounds < 3:
            raise ValueError(f"guard_rounds must be an int >= 3, got {rounds!r}")
        limit = self.guard_time_limit_s
        if isinstance(limit, bool) or not isinstance(limit, (int, float)) or not 0 <= limit < float("inf"):
            raise ValueError(f"guard_time_limit_s must be a finite number >= 0, got {limit!r}")
        for name in ("guard_measure", "guard_compile"):
            value = getattr(self, name)
            if value is not None and not callable(value):
                raise ValueError(f"{name} must be callable or None, got {value!r}")

    def with_(self, **changes: Any) -> OptimusConfig:
        """A copy with some fields replaced (validated again)."""
        return replace(self, **changes)

    def fingerprint(self) -> str:
        """Stable text identifying options that change the output graph (for cache keys)."""
        cm = self.cost_model
        return (
            f"rules={self.rules};cost={type(cm).__module__}.{type(cm).__qualname__}:{vars(cm) if hasattr(cm, '__dict__') else ''};"
            f"layout={type(self.layout).__qualname__};verify={self.verify};iters={self.max_iterations};"
            f"nodes={self.max_nodes};memory_margin={self.memory_margin};"
            f"memory_budget_bytes={self.memory_budget_bytes};memory_ceiling={self.memory_ceiling};"
            f"memory_outside_bytes={self.memory_outside_bytes};"
            f"inference_chunk_bytes={self.inference_chunk_bytes};"
            f"guard={self.guard};guard_rounds={self.guard_rounds};"
            f"guard_time_limit_s={self.guard_time_limit_s};"
            f"guard_measure={getattr(self.guard_measure, '__qualname__', self.guard_measure)};"
            f"guard_compile={getattr(self.guard_compile, '__qualname__', self.guard_compile)}"
        )
