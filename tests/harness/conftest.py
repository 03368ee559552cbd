"""The harness tests mirror the package's layers in subfolders; their shared helpers (the
``synthetic`` results builders, the ``fakes`` provider) live here, beside this file."""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
