"""Where a training step's wall time goes: a few profiled steps split into components.

WHY: a cell's latency is one number per step; to say what a dense-arch optimizer such as
Optimus can change in a sharded training step, the step has to be split into the parts it
touches (the dense forward and backward, its parameter hand-off) and the parts it cannot (the
sharded lookups and their all-to-alls, DDP's all-reduce, the optimizer). The split is read from
``torch.profiler`` events of the thread that runs the step, so the parts are disjoint stretches of
that thread's time and sum to the profiled step:

* the caller marks the phases it controls with :func:`mark` (``sparse``, ``dense_forward``,
  ``backward``, ``optimizer``); outside :func:`profile_split` a mark is a no-op, so the timed
  steps run as before;
* the backward is split by autograd node: a node whose forward op ran inside the ``sparse`` mark
  (the profiler's ``sequence_nr`` links the two) is ``sparse``, the re-layout's
  ``_AttachMembersBackward`` is ``handoff``, every other node is ``dense_backward``;
* ``allreduce`` is DDP's work on that thread: copying each dense gradient into its bucket
  (``reducer::mul_out``, inside the gradient's ``AccumulateGrad``), launching the all-reduce
  (``c10d::allreduce_``), and the end of the backward after its last autograd node, where DDP's
  reducer waits for its buckets and copies them back (an uninstrumented stretch); gloo runs the all-reduce on its own thread, whose busy time is
  reported beside the split (``allreduce_busy``), not in it, since it overlaps the backward;
* ``other`` is the rest of the step (the loss, DDP's forward bookkeeping, autograd's engine
  between nodes, the caller's per-step hooks, the profiler's own marks).

Innermost wins: an all-reduce launched from a dense gradient's hook is ``allreduce``, not
``dense_backward``. The split reported is the median profiled step's own (the lower median for
an even count), so its parts sum to its ``step``: a median per component would not add up when
the steps differ, and on a shared machine a rank's steps differ by tens of percent. ``step`` is
longer than an unprofiled step by the profiler's per-op cost.
"""

from __future__ import annotations

import contextlib
import statistics
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from typing import Any

COMPONENTS = ("sparse", "dense_forward", "dense_backward", "allreduce", "optimizer", "handoff", "other")
PREFIX = "step_split::"
STEP = PREFIX + "step"
MARKS = ("sparse", "dense_forward", "backward", "optimizer")
DEFAULT_STEPS = 5

_NODE = "autograd::engine::evaluate_function: "
_HANDOFF = ("_AttachMembers", "_AttachMembersBackward")  # optimus.params.attach, forward and backward
# the all-reduce as it shows on the calling thread: c10d's launch (gloo's own op when it runs
# inline), and DDP's reducer copying each gradient, scaled by 1/world, into its bucket
_ALLREDUCE = ("c10d::allreduce_", "gloo:all_reduce", "c10d::allreduce_coalesced_",
              "torch::distributed::reducer::mul_out")  # fmt: skip

_active = [False]
_NULL = contextlib.nullcontext()


def mark(name: str) -> contextlib.AbstractContextManager[Any]:
    """A profiler range named ``step_split::<name>`` while :func:`profile_split` runs; a shared
    no-op otherwise (a record_function costs a dispatcher call even with no profiler on)."""
    if not _active[0]:
        return _NULL
    from torch.profiler import record_function

    return record_function(PREFIX + name)


@dataclass(frozen=True)
class Event:
    """One profiler event: name, thread, [start, end) in microseconds, autograd sequence number
    (-1 when the op made no autograd node)."""

    name: str
    thread: int
    start: float
    end: float
    seq: int = -1


@contextlib.contextmanager
def _marking() -> Iterator[None]:
    _active[0] = True
    try:
        yield
    finally:
        _active[0] = False


def profile_events(step: Callable[[], Any], steps: int = DEFAULT_STEPS) -> list[Event]:
    """Run ``step`` ``steps`` times under the CPU profiler, each inside a ``step_split::step``
    range, with the phase marks on; the events of every thread."""
    from torch.profiler import ProfilerActivity, profile, record_function

    with profile(activities=[ProfilerActivity.CPU]) as prof, _marking():
        for _ in range(steps):
            with record_function(STEP):
                step()
    return [
        Event(e.name, int(e.thread), float(e.time_range.start), float(e.time_range.end), int(e.sequence_nr))
        for e in prof.events()
    ]


def profile_split(step: Callable[[], Any], steps: int = DEFAULT_STEPS) -> dict[str, Any]:
    """:func:`split` of ``steps`` profiled calls of ``step`` (which marks its phases)."""
    return split(profile_events(step, steps))


def _inside(events: list[Event], lo: float, hi: float) -> list[Event]:
    return [e for e in events if e.start >= lo and e.end <= hi]


def _label(e: Event, sparse_seq: set[int]) -> str | None:
    """The component an event's own time belongs to; None: its parent's."""
    name = e.name
    if name.startswith(PREFIX):
        phase = name[len(PREFIX) :]
        return {"sparse": "sparse", "dense_forward": "dense_forward", "optimizer": "optimizer",
                "backward": "backward", "step": "other"}.get(phase)  # fmt: skip
    if name.startswith(_NODE):
        node = name[len(_NODE) :]
        if node in _HANDOFF:
            return "handoff"
        return "sparse" if e.seq >= 0 and e.seq in sparse_seq else "dense_backward"
    if name in _HANDOFF:
        return "handoff"
    if name in _ALLREDUCE:
        return "allreduce"
    return None


def _exclusive(labelled: list[tuple[Event, str]]) -> dict[str, float]:
    """Each label's time on one thread, innermost label winning (the thread's events nest)."""
    out: dict[str, float] = {}
    stack: list[tuple[Event, str]] = []
    for e, lab in sorted(labelled, key=lambda p: (p[0].start, -p[0].end)):
        while stack and stack[-1][0].end <= e.start:
            stack.pop()
        dur = e.end - e.start
        out[lab] = out.get(lab, 0.0) + dur
        if stack:
            parent = stack[-1][1]
            out[parent] -= dur
        stack.append((e, lab))
    return out


def split_step(events: list[Event], step: Event) -> dict[str, float]:
    """One step's components in ms (``COMPONENTS``, ``step``, ``allreduce_busy``); ``events`` are
    all threads' events, ``step`` the step's range on the thread that ran it."""
    own = [e for e in _inside(events, step.start, step.end) if e.thread == step.thread]
    sparse_seq = {
        e.seq for m in own if m.name == PREFIX + "sparse" for e in _inside(own, m.start, m.end) if e.seq >= 0
    }
    labelled = [(e, lab) for e in own if (lab := _label(e, sparse_seq)) is not None]
    # the backward's tail: after its last autograd node, DDP's reducer waits for its all-reduces
    for b in (e for e in own if e.name == PREFIX + "backward"):
        nodes = [e.end for e in _inside(own, b.start, b.end) if e.name.startswith(_NODE)]
        if nodes:
            labelled.append((Event("backward tail", b.thread, max(nodes), b.end), "allreduce"))
    times = _exclusive(labelled)
    times["other"] = times.get("other", 0.0) + times.pop("backward", 0.0)
    out = {c: max(0.0, times.get(c, 0.0)) / 1e3 for c in COMPONENTS}
    out["step"] = (step.end - step.start) / 1e3
    busy = [
        e
        for e in events
        if e.thread != step.thread and e.name in _ALLREDUCE and e.start < step.end and e.end > step.start
    ]
    out["allreduce_busy"] = sum(min(e.end, step.end) - max(e.start, step.start) for e in busy) / 1e3
    return out


def split(events: Iterable[Event]) -> dict[str, Any]:
    """The median profiled step's components (ms), its length (``step``) and the gloo thread's
    all-reduce time during it (``allreduce_busy``); ``steps``, how many were profiled."""
    evs = list(events)
    steps = [e for e in evs if e.name == STEP]
    if not steps:
        raise ValueError("no profiled step (no step_split::step range) among the events")
    per = [split_step(evs, s) for s in steps]
    middle = statistics.median_low(p["step"] for p in per)
    out: dict[str, Any] = dict(next(p for p in per if p["step"] == middle))
    out["steps"] = len(per)
    return out


class _MarkedOptimizer:
    """An optimizer whose ``zero_grad`` and ``step`` are the split's ``optimizer``."""

    def __init__(self, optimizer: Any) -> None:
        self.optimizer = optimizer

    def zero_grad(self, set_to_none: bool = True) -> None:
        with mark("optimizer"):
            self.optimizer.zero_grad(set_to_none=set_to_none)

    def step(self) -> None:
        with mark("optimizer"):
            self.optimizer.step()


def marked_optimizer(optimizer: Any) -> Any:
    """``optimizer`` with its ``zero_grad`` and ``step`` marked (None stays None)."""
    return None if optimizer is None else _MarkedOptimizer(optimizer)
