"""One atomic file writer for the whole repository (optimus, models, harness).

Why here: the optimizer stands alone (it imports nothing from the harness), yet it writes a file
too (the measured cost model's cache). So the writer lives at the bottom of the stack and the
harness and models import it. Readers see the old file or the new one, never half of it: a temp
file in the same folder, fsync, then rename; on any error the temp file is removed.
"""

from __future__ import annotations

import os
import tempfile
from pathlib import Path


def write_atomic(path: str | os.PathLike[str], text: str) -> None:
    """Write ``text`` to ``path`` atomically (creating its folder)."""
    p = Path(path)
    p.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{p.name}.", suffix=".tmp", dir=p.parent)
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as f:
            f.write(text)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, p)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
