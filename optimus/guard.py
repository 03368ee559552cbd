"""The measured guard: keep the driver's rewrite only where it measures faster than plain capture.

WHY: the driver ranks and takes rewrites by an analytic cost model, and a model written another
way than the ones it was fitted on can make its favourite rewrite slower on the device at hand
(a stacked batch of a few large GEMMs pays copies the unfused GEMMs never make). The model still
ranks the candidates; the guard decides what is kept, by running both graphs.

The design, and why (docs/optimus.md, "The measured guard"):

* **Whole graph, paired and interleaved.** The plain capture and the rewritten graph run the
  example inputs side by side: each round times one block of each, in ABBA order (plain first
  in even rounds, rewritten first in odd ones), so drift (another process, the CPU's clock) hits
  both sides alike, and the per-round ratio plain / rewritten is the speedup. The verdict is the
  median of ``OptimusConfig.guard_rounds`` ratios, with its 95% interval from order statistics
  (:func:`optimus.cost.timing.median_interval`); while that interval still holds 1.0, another
  ``guard_rounds`` rounds are added (at most ``EXTENSIONS`` times), so a close call is decided on
  more rounds and a clear one costs no more. **Rule:** the rewrite is kept when the median of all
  rounds is above 1.0, else it is rejected. A training capture (not eval mode, and an output that requires
  grad) runs forward and backward with the gradients set to None before each step, as
  ``zero_grad(set_to_none=True)`` does; an eval-mode capture runs the forward under ``no_grad``.
  Why the whole graph rather than a micro-measurement per rewrite: a rewrite's cost depends on its
  neighbours (a fused chain feeds the next fused op without a copy, the re-layout's backward
  hand-off is paid per group), which only the whole step shows, and the whole graph is timed in
  the few milliseconds of ``2 * guard_rounds`` blocks.
* **Per rule group** (``guard="rules"``): when the whole rewrite loses, the driver runs again from
  the plain capture without each rule that fired (one at a time, in registry order, while the
  guard has spent less than ``guard_time_limit_s``), each variant is measured against the plain
  capture the same way, and the fastest one above 1.0 is kept. Cleanup rules (dead code,
  duplicates) are never left out: they only remove work. A single fired rewrite rule has no
  variant (without it the graph is the plain capture).
* **What it leaves as the caller had it**: the measured runs use copies of the example inputs;
  buffers (BatchNorm running statistics) and the RNG are restored (``caller_state.preserved``),
  each parameter's ``.grad`` is put back; a rejected rewrite's re-laid-out parameters go back to
  their own storage (:class:`optimus.params.snapshot.LayoutSnapshot`), so a rejection leaves
  parameters, their strides and aliasing exactly as before ``optimize``.

* **Under a process group** of two or more ranks, every rank measures and takes the first rank's
  figures (a broadcast), so all ranks keep the same graph and the same parameter layout.
* **Under a compiler** (``OptimusConfig.guard_compile``, e.g. ``torch.compile``): both graphs are
  timed in their compiled form, so the verdict is about what Inductor makes of them. It costs a
  compile of each (and of each variant), which is why the harness's compile+optimus runs it only
  when asked.

Not covered: Dynamo-subgraph captures, the ``torch.compile`` backend and the pre-grad pass (no
real example inputs to run: the report says "not run").
"""

from __future__ import annotations

import itertools
import math
import time
from collections.abc import Callable, Sequence
from typing import Any

import torch
from torch import fx
from torch.utils._pytree import tree_leaves, tree_unflatten

from optimus.capture import caller_state
from optimus.config import OptimusConfig
from optimus.cost.timing import median_interval, time_block
from optimus.params.snapshot import LayoutSnapshot
from optimus.report import GuardTrial, OptimusReport
from optimus.semantics.graph_copy import copy_graph

# a timed block lasts at least this long (calls per block are chosen from the warm-up), so the
# clock's resolution and a call's fixed costs stay small against it
BLOCK_S = 0.005
MAX_CALLS = 1000  # per block
WARMUP_CALLS = 2  # per side, before timing: first-call allocations, lazy initialization
# while the interval of the median holds 1.0, measure ``guard_rounds`` more rounds, this many times
EXTENSIONS = 2

Measure = Callable[[fx.GraphModule, Callable[[], object], int], float]
Rewrite = Callable[[OptimusConfig, OptimusReport], None]

# fields of a report that describe the graph a driver run produced (adopted from the kept run)
_GRAPH_FIELDS = (
    "rules_fired",
    "nodes_after",
    "stop_reason",
    "iterations",
    "declined",
    "rolled_back",
    "declined_reasons",
    "rounds",
    "live_peak_after",
    "chains",
    "chunked_groups",
)


def wall_clock(gm: fx.GraphModule, step: Callable[[], object], calls: int) -> float:
    """The default ``guard_measure``: wall-clock seconds of ``calls`` calls of ``step``, with a
    CUDA synchronize before the clock is read when ``gm`` holds CUDA tensors (kernels run
    asynchronously: without it the clock reads the launch time)."""
    if any(t.is_cuda for t in itertools.chain(gm.parameters(), gm.buffers())):
        return time_block(step, calls, sync=torch.cuda.synchronize)
    return time_block(step, calls)


def call_args(gm: fx.GraphModule, inputs: Sequence[Any]) -> tuple[tuple[Any, ...], dict[str, Any]]:
    """``(args, kwargs)`` to call ``gm`` with, from ``inputs``, one per placeholder. Why: an
    exported graph's ``forward`` takes the traced module's own arguments (a dict of features, a
    KeyedJaggedTensor) and flattens them (``_PyTreeCodeGen``), while the driver's example inputs
    are the flat placeholders; the structure is rebuilt from the graph's input spec."""
    info = getattr(gm.graph._codegen, "pytree_info", None)
    if info is None or info.in_spec is None:
        return tuple(inputs), {}
    args, kwargs = tree_unflatten(list(inputs), info.in_spec)
    return tuple(args), dict(kwargs)


def _step(
    gm: fx.GraphModule, inputs: Sequence[Any], backward: bool, run: Callable[..., Any] | None = None
) -> Callable[[], object]:
    """One call of ``gm`` (through ``run``, its compiled form, when given) on its own copy of
    ``inputs`` (the placeholders, see :func:`call_args`): the forward under ``no_grad``, or
    forward and backward of the sum of its float outputs that require grad, gradients set to
    None first."""
    args, kwargs = call_args(gm, caller_state.clone_inputs(tuple(inputs)))
    call = gm if run is None else run
    if not backward:

        def forward() -> object:
            with torch.no_grad():
                return call(*args, **kwargs)

        return forward
    leaves: list[torch.Tensor] = [p for p in gm.parameters() if p.requires_grad]  # each once
    leaves += [
        a
        for a in tree_leaves((args, kwargs))
        if isinstance(a, torch.Tensor) and a.requires_grad and a.is_leaf
    ]

    def train() -> object:
        for leaf in leaves:
            leaf.grad = None
        with torch.enable_grad():
            out = call(*args, **kwargs)
            loss = _loss(out)
            if loss is not None:
                loss.backward()
        return out

    return train


def _loss(out: Any) -> torch.Tensor | None:
    terms = [
        o.sum()
        for o in tree_leaves(out)
        if isinstance(o, torch.Tensor) and o.requires_grad and o.is_floating_point()
    ]
    return sum(terms[1:], terms[0]) if terms else None


def trains(gm: fx.GraphModule, inputs: Sequence[Any], inference: bool) -> bool:
    """Whether a step of ``gm`` is a training step: not an eval-mode capture, and an output
    requires grad (one forward, under grad mode, on copies of the inputs)."""
    if inference:
        return False
    args, kwargs = call_args(gm, caller_state.clone_inputs(tuple(inputs)))
    with torch.enable_grad():
        out = gm(*args, **kwargs)
    return _loss(out) is not None


def paired_speedup(
    plain: fx.GraphModule,
    rewritten: fx.GraphModule,
    inputs: Sequence[Any],
    backward: bool,
    rounds: int,
    measure: Measure,
    runs: tuple[Callable[..., Any] | None, Callable[..., Any] | None] = (None, None),
    extensions: int = EXTENSIONS,
) -> tuple[float, float, float, int]:
    """``(median, low, high, rounds)`` of the per-round speedup plain seconds / rewritten seconds,
    over paired rounds in ABBA order (module docstring): ``rounds`` of them, and ``rounds`` more
    (at most ``extensions`` times) while the 95% interval of the median still holds 1.0, so an
    inconclusive verdict is decided on more rounds and a clear one costs no more. ``runs``: how
    each graph runs (its compiled form), None: the graph module itself."""
    sides = [
        (plain, _step(plain, inputs, backward, runs[0])),
        (rewritten, _step(rewritten, inputs, backward, runs[1])),
    ]
    for _, step in sides:
        for _ in range(WARMUP_CALLS):
            step()
    probe = max(min(measure(gm, step, 1) for gm, step in sides), 1e-9)
    calls = max(1, min(MAX_CALLS, math.ceil(BLOCK_S / probe)))
    ratios: list[float] = []
    for _ in range(1 + extensions):
        for _ in range(rounds):
            order = sides if len(ratios) % 2 == 0 else sides[::-1]
            seconds = {id(gm): measure(gm, step, calls) for gm, step in order}
            ratios.append(seconds[id(plain)] / max(seconds[id(rewritten)], 1e-12))
        median, low, high = median_interval(ratios)
        if not low <= 1.0 <= high:
            break
    return median, low, high, len(ratios)


class Guard:
    """One guarded optimization of ``gm`` (see the module docstring): built before the driver runs
    (it keeps the plain graph and a :class:`LayoutSnapshot`), :meth:`judge` after."""

    def __init__(self, gm: fx.GraphModule, config: OptimusConfig, inputs: Sequence[Any], inference: bool):
        self.gm, self.config, self.inputs, self.inference = gm, config, inputs, inference
        self.plain_graph = copy_graph(gm.graph)
        self.snapshot = LayoutSnapshot(gm)
        self.measure: Measure = config.guard_measure or wall_clock
        self.backward: bool | None = None
        self._plain: tuple[fx.GraphModule, Callable[..., Any] | None] | None = None
        self._last = OptimusReport()  # the report of the variant ``gm`` holds now

    def revert(self) -> None:
        """The plain capture again: parameters and attributes first, then the graph."""
        self.snapshot.restore()
        self.gm.graph = copy_graph(self.plain_graph)  # the setter recompiles

    def _trial(self, left_out: str | None, fired: dict[str, int]) -> GuardTrial:
        gm, compile_ = self.gm, self.config.guard_compile
        with caller_state.preserved(gm):  # BatchNorm statistics, the RNG
            if self._plain is None:  # made (and compiled) once: the plain graph never changes
                plain = fx.GraphModule(gm, copy_graph(self.plain_graph))
                self._plain = (plain, None if compile_ is None else compile_(plain))
            plain, plain_run = self._plain
            if self.backward is None:
                self.backward = trains(plain, self.inputs, self.inference)
            runs = (plain_run, None if compile_ is None else compile_(gm))
            figures = paired_speedup(
                plain, gm, self.inputs, self.backward, self.config.guard_rounds, self.measure, runs
            )
        median, low, high, rounds = _from_first_rank(list(figures))
        self.snapshot.restore_grads()
        return GuardTrial(left_out, median, low, high, int(rounds), dict(fired))

    def judge(self, report: OptimusReport, rewrite: Rewrite, rule_kinds: dict[str, str]) -> None:
        """Measure the driver's result (in ``gm`` now, described by ``report``) against the plain
        capture; keep it, keep the best variant without one rule, or revert to the plain capture.
        ``rewrite(config, report)`` runs the driver on ``gm`` again; ``rule_kinds``: each rule's
        kind, in registry order. Fills ``report.guard*`` and adds the guard's time to
        ``report.seconds``."""
        start = time.perf_counter()
        try:
            self._judge(report, rewrite, rule_kinds, start)
        finally:
            report.guard_seconds = time.perf_counter() - start
            report.seconds += report.guard_seconds

    def _judge(
        self, report: OptimusReport, rewrite: Rewrite, rule_kinds: dict[str, str], start: float
    ) -> None:
        if not report.rules_fired:
            report.guard = "not run: nothing was rewritten"
            return
        with torch.inference_mode(False):
            whole = self._trial(None, report.rules_fired)
        report.guard_trials.append(whole)
        if whole.speedup > 1.0:
            whole.kept = True
            report.guard = "kept"
            return
        first = dict(report.rules_fired)
        best: tuple[GuardTrial, OptimusConfig] | None = None
        current: GuardTrial | None = whole
        if self.config.guard == "rules":
            best, current = self._variants(report, rewrite, rule_kinds, start)
        if best is None:
            self.revert()
            self._adopt_plain(report)
            report.guard = "rejected"
            report.guard_rejected = first
            report.notes.append(
                f"guard: rejected the rewrite ({_figure(whole)} of plain capture's speed): "
                f"the plain capture is returned; it had fired {_fired(first)}"
            )
            return
        trial, cfg = best
        trial.kept = True
        kept = OptimusReport()
        if current is not trial:  # a later variant was measured last: make the best one again
            self.revert()
            rewrite(cfg, kept)
        else:
            kept = self._last
        for name in _GRAPH_FIELDS:
            setattr(report, name, getattr(kept, name))
        report.guard = f"kept without {trial.left_out}"
        report.guard_rejected = {
            rule: n - report.rules_fired.get(rule, 0)
            for rule, n in first.items()
            if n > report.rules_fired.get(rule, 0)
        }
        report.notes.append(
            f"guard: kept the rewrite without {trial.left_out} ({_figure(trial)} of plain capture's "
            f"speed); the whole rewrite measured {_figure(whole)}"
        )

    def _variants(
        self, report: OptimusReport, rewrite: Rewrite, rule_kinds: dict[str, str], start: float
    ) -> tuple[tuple[GuardTrial, OptimusConfig] | None, GuardTrial | None]:
        """Measure the driver's result without each fired rewrite rule; the best above 1.0 (and
        its config) and the trial whose graph ``gm`` holds now."""
        names = list(rule_kinds)
        fired = [r for r in names if r in report.rules_fired and rule_kinds[r] != "cleanup"]
        best: tuple[GuardTrial, OptimusConfig] | None = None
        current: GuardTrial | None = None
        if len(fired) < 2:
            return None, None
        for rule in fired:
            spent = _from_first_rank([time.perf_counter() - start])[0]
            if spent > self.config.guard_time_limit_s:
                report.notes.append(
                    f"guard: stopped trying variants at guard_time_limit_s={self.config.guard_time_limit_s}"
                )
                break
            self.revert()
            cfg = self.config.with_(rules=tuple(r for r in names if r != rule), guard="off")
            variant = OptimusReport()
            rewrite(cfg, variant)
            current = None
            if not variant.rules_fired:
                continue
            with torch.inference_mode(False):
                trial = self._trial(rule, variant.rules_fired)
            report.guard_trials.append(trial)
            current, self._last = trial, variant
            if trial.speedup > 1.0 and (best is None or trial.speedup > best[0].speedup):
                best = (trial, cfg)
        return best, current

    def _adopt_plain(self, report: OptimusReport) -> None:
        """The report's graph fields for the plain capture (the driver's history stays in rounds)."""
        report.rules_fired = {}
        report.chains = {}
        report.chunked_groups = 0
        report.nodes_after = len(self.gm.graph.nodes)
        report.live_peak_after = report.live_peak_before


def _from_first_rank(values: list[float]) -> list[float]:
    """``values`` as the first rank measured them, under a process group of two or more ranks;
    else as given. Why: every rank must keep the same graph (DistributedDataParallel reduces the
    gradients of the same parameters in the same layout, and a rank that kept the re-layout while
    its peer returned the plain capture would reduce different tensors or hang), and each rank's
    own timing differs."""
    dist = torch.distributed
    if not (dist.is_available() and dist.is_initialized() and dist.get_world_size() > 1):
        return values
    box: list[Any] = [values]
    dist.broadcast_object_list(box, src=0)
    return [float(v) for v in box[0]]


def _figure(t: GuardTrial) -> str:
    return f"{t.speedup:.3f}x, 95% interval {t.low:.3f}-{t.high:.3f}, {t.rounds} paired rounds"


def _fired(fired: dict[str, int]) -> str:
    return ", ".join(f"{k} x{v}" for k, v in sorted(fired.items()))
