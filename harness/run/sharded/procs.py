"""Finding and killing every process of one sharded cell (Linux /proc, no psutil).

Why not ``killpg`` alone: torchrun starts each rank with ``start_new_session=True``, so the
ranks (and their Inductor compile workers) are outside torchrun's process group. Every
process of a cell inherits ``OPTIMUS_BENCH_CELL_ID`` from the launcher's environment, so the
final sweep finds them by that mark, orphans included.
"""

from __future__ import annotations

import contextlib
import os
import signal
from pathlib import Path

CELL_ID_ENV = "OPTIMUS_BENCH_CELL_ID"


def _ppid_map() -> dict[int, int]:
    out: dict[int, int] = {}
    for d in Path("/proc").iterdir():
        if not d.name.isdigit():
            continue
        try:
            stat = (d / "stat").read_text()
        except OSError:
            continue
        # pid (comm) state ppid ...; comm may hold spaces and parentheses
        fields = stat[stat.rfind(")") + 2 :].split()
        out[int(d.name)] = int(fields[1])
    return out


def descendants(pid: int) -> list[int]:
    """Every live descendant of ``pid`` (children first found, breadth first)."""
    parents = _ppid_map()
    found, frontier = [], [pid]
    while frontier:
        p = frontier.pop(0)
        kids = [c for c, pp in parents.items() if pp == p]
        found += kids
        frontier += kids
    return found


def marked(cell_id: str) -> list[int]:
    """Live processes whose environment holds ``OPTIMUS_BENCH_CELL_ID=cell_id``."""
    needle = f"{CELL_ID_ENV}={cell_id}".encode()
    pids = []
    for d in Path("/proc").iterdir():
        if not d.name.isdigit() or int(d.name) == os.getpid():
            continue
        try:
            env = (d / "environ").read_bytes()
            state = (d / "stat").read_text()
        except OSError:
            continue
        if needle in env.split(b"\0") and state[state.rfind(")") + 2 :].split()[0] != "Z":
            pids.append(int(d.name))
    return pids


def kill_all(pids: list[int]) -> None:
    """SIGKILL each pid and the process group it leads (a rank leads its own session)."""
    for pid in pids:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            if os.getpgid(pid) == pid:
                os.killpg(pid, signal.SIGKILL)
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.kill(pid, signal.SIGKILL)


def kill_cell(root_pid: int, cell_id: str) -> None:
    """Kill the launcher ``root_pid``, everything under it, and every process marked with
    ``cell_id`` (twice: a process may start a child between the snapshot and the kill)."""
    for _ in range(2):
        kill_all([root_pid, *descendants(root_pid), *marked(cell_id)])
