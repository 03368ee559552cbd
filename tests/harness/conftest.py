"""The harness tests mirror the package's layers in subfolders; their shared helpers (the
``synthetic`` results builders, the ``fakes`` provider) live here, beside this file."""

from __future__ import annotations

import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent))


@pytest.fixture(autouse=True)
def _guard_off_in_process() -> Iterator[None]:
    """eager+optimus prepared in this process runs without the measured guard (its verdict
    depends on timing, which these tests must not); tests/harness/run/test_mode_guard.py checks
    the guard's default and plumbing. Cells run in their own processes keep the harness default."""
    from harness.modes import builtin

    with builtin.optimus_guard("off"):
        yield
