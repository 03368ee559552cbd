"""Hypothesis profiles for the optimus property tests, and the shared helpers on the path.

CI runs the ``ci`` profile: 300 examples in total across the property tests. More:
``pytest tests/optimus --hypothesis-profile=thorough`` (3000) or
``OPTIMUS_HYPOTHESIS_EXAMPLES=N pytest tests/optimus`` (N in total).
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

from hypothesis import HealthCheck, settings

# The tests mirror the package's layers in subfolders; the shared helpers (optimus_helpers,
# layout_helpers, the fuzzers) live here, beside this file.
sys.path.insert(0, str(Path(__file__).resolve().parent))

_TOTAL = int(os.environ.get("OPTIMUS_HYPOTHESIS_EXAMPLES", "300"))
_COMMON = {
    "deadline": None,
    "suppress_health_check": [HealthCheck.too_slow, HealthCheck.data_too_large],
    "derandomize": True,
    "print_blob": True,
}
settings.register_profile("ci", max_examples=_TOTAL, **_COMMON)
settings.register_profile("thorough", max_examples=max(_TOTAL, 3000), **_COMMON)
if settings.get_current_profile_name() == "default":
    settings.load_profile("ci")
