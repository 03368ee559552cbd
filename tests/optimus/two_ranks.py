"""Two spawned gloo ranks on the CPU, each writing what it saw to ``rank{r}.json``.

WHY one place: the DDP tests of the re-layout and of the guard start ranks the same way (a free
port, ``mp.spawn``, one JSON record per rank read back by the parent)."""

from __future__ import annotations

import json
import socket
from collections.abc import Callable
from pathlib import Path
from typing import Any

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
