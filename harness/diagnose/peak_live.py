"""What is live at a step's memory peak (CPU), grouped by where each buffer was allocated.

WHY: a cell's ``peak_mem_at`` (``harness.measure.memory.cpu_step_peak``) names the op where the peak
falls, not what holds the bytes there. Towers medium training read +35% over compile with both
peaks "in CompiledFunctionBackward"; only the live set told the activations the compiled forward
saved (about equal in both modes) from the backward's own transients (8.2 against 2.5 MB):
docs/perf.md, "Three leads measured and left". ``harness.diagnose.profile_cell`` prints this table per
mode, so the next memory regression is diagnosed with one command instead of a script.

Method: torch.profiler with ``profile_memory=True`` records every allocation and free of the CPU
allocator, each inside the ops that were running. Replaying them in time order (the running sum
``cpu_step_peak`` uses) gives the peak; the buffers allocated during the step and not yet freed at
that moment are the live set. Each is named by the ops around its allocation, as ``peak_mem_at``
is (``measure.peak_place``): ``compiled graph`` for a compiled forward (so, in training, what it
saved for the backward), ``CompiledFunctionBackward`` for the compiled backward, the op itself in
eager. Tensors allocated before the step (parameters, optimizer state) are not in it: the harness
counts them as static memory. Deterministic for a fixed-shape step, like the peak itself.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from harness.measure.memory import peak_place


@dataclass(frozen=True)
class LiveBuffer:
    """One allocation live at the peak: its bytes, where it was made, ms after the step began."""

    nbytes: int
    where: str
    at_ms: float


@dataclass
class LiveAtPeak:
    """The step's peak above what was allocated when it started, where it falls, and what is live."""

    peak_bytes: int
    at: str | None
    buffers: list[LiveBuffer] = field(default_factory=list)

    def groups(self) -> list[dict[str, Any]]:
        """``{where, bytes, count}`` per allocation site, most bytes first."""
        by: dict[str, list[int]] = {}
        for b in self.buffers:
            by.setdefault(b.where, []).append(b.nbytes)
        rows = [{"where": w, "bytes": sum(s), "count": len(s)} for w, s in by.items()]
        return sorted(rows, key=lambda r: (-r["bytes"], r["where"]))

    def as_dict(self, largest: int = 12) -> dict[str, Any]:
        """Plain JSON: the peak, the groups and the ``largest`` buffers (oldest first)."""
        big = sorted(self.buffers, key=lambda b: -b.nbytes)[:largest]
        return {
            "peak_step_bytes": self.peak_bytes,
            "at": self.at,
            "live_buffers": len(self.buffers),
            "live_bytes": sum(b.nbytes for b in self.buffers),
            "groups": self.groups(),
            "largest": [
                {"bytes": b.nbytes, "where": b.where, "at_ms": round(b.at_ms, 3)}
                for b in sorted(big, key=lambda b: b.at_ms)
            ],
        }


def _allocations(prof: Any) -> list[tuple[int, int, int, list[str]]]:
    """(time ns, address, signed bytes, names of the ops around it, outermost first) per event."""
    from torch._C._profiler import _EventType

    out: list[tuple[int, int, int, list[str]]] = []
    roots = prof.profiler.kineto_results.experimental_event_tree()
    todo: list[tuple[Any, list[str]]] = [(root, []) for root in roots]
    while todo:
        event, around = todo.pop()
        if event.typed[0] == _EventType.Allocation:
            fields = event.typed[1]
            out.append((event.start_time_ns, int(fields.ptr), int(fields.alloc_size), around))
            continue
        inside = [*around, event.name]
        todo.extend((child, inside) for child in event.children)
    return sorted(out, key=lambda a: a[0])


def live_at_peak(step: Callable[[], object]) -> LiveAtPeak:
    """Run ``step`` once under the profiler and return what is live at its allocation peak.

    Raises RuntimeError (one line) where this torch's profiler does not expose its allocation
    events (a private API: ``experimental_event_tree``)."""
    from torch.profiler import ProfilerActivity, profile

    with profile(activities=[ProfilerActivity.CPU], profile_memory=True) as prof:
        out = step()
        del out
    try:
        events = _allocations(prof)
    except (AttributeError, ImportError, IndexError) as e:
        raise RuntimeError(f"cannot read allocation events from torch.profiler: {e}") from e
    if not events:
        return LiveAtPeak(0, None)
    start = events[0][0]
    live: dict[int, LiveBuffer] = {}
    cur = peak = 0
    at: list[str] | None = None
    snapshot: list[LiveBuffer] = []
    for t, ptr, nbytes, around in events:
        cur += nbytes
        if nbytes > 0:
            live[ptr] = LiveBuffer(nbytes, peak_place(around) or "?", (t - start) / 1e6)
        else:  # a free; of a buffer from before the step when the address is unknown
            live.pop(ptr, None)
        if cur > peak:
            peak, at, snapshot = cur, around, list(live.values())
    return LiveAtPeak(peak, peak_place(at) if at is not None else None, snapshot)


def markdown_rows(live: dict[str, Any], top: int = 8) -> list[str]:
    """A small table of ``live.as_dict()``'s groups (the ``top`` largest, then the rest summed)."""
    groups = live["groups"]
    lines = [
        f"live at the step's peak ({live['peak_step_bytes']:,} B above the step's start, at "
        f"`{live['at']}`): {live['live_buffers']} buffers, {live['live_bytes']:,} B",
        "",
        "| allocated in | bytes | buffers |",
        "| --- | --- | --- |",
    ]
    for g in groups[:top]:
        lines.append(f"| `{g['where'].replace('|', '/')[:90]}` | {g['bytes']:,} | {g['count']} |")
    rest = groups[top:]
    if rest:
        lines.append(
            f"| {len(rest)} other places | {sum(g['bytes'] for g in rest):,} | {sum(g['count'] for g in rest)} |"
        )
    return lines
