"""Two spawned gloo ranks on the CPU, each writing what it saw to ``rank{r}.json``.

WHY one place: the DDP tests of the re-layout and of the guard start ranks the same way (a free
port, ``mp.spawn``, one JSON record per rank read back by the parent)."""

from __future__ import annotations

import contextlib
import datetime
import json
import os
import socket
import traceback
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import torch.distributed as dist
import torch.multiprocessing as mp


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def spawn_two(fn: Callable[..., None], tmp_path: Path, *args: Any) -> tuple[dict[str, Any], dict[str, Any]]:
    """Run ``fn(rank, port, *args, out)`` on two ranks; their records, rank 0 first."""
    mp.spawn(fn, args=(free_port(), *args, str(tmp_path)), nprocs=2, join=True)
    r0, r1 = (json.loads((tmp_path / f"rank{r}.json").read_text()) for r in (0, 1))
    return r0, r1


@contextlib.contextmanager
def gloo_rank(rank: int, port: int, out: str) -> Iterator[dict[str, Any]]:
    """One rank of a two-rank gloo group: yields the record the rank fills in, and writes it to
    ``rank{rank}.json`` however the body ends. A failure is recorded (its first line and trace)
    rather than raised, so the parent reads it and the peer is not left waiting."""
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    dist.init_process_group("gloo", rank=rank, world_size=2, timeout=datetime.timedelta(seconds=60))
    record: dict[str, Any] = {}
    try:
        yield record
    except Exception as exc:
        record["error"] = f"{type(exc).__name__}: {exc}".splitlines()[0]
        record["trace"] = traceback.format_exc()
    Path(out, f"rank{rank}.json").write_text(json.dumps(record))
    dist.destroy_process_group()
