"""Shared fixtures: one tiny build per family per test session (builds take ~0.3 s each)."""

from __future__ import annotations

import pytest

import models


@pytest.fixture(scope="session", params=models.FAMILIES)
def tiny(request: pytest.FixtureRequest) -> models.Built:
    return models.build(request.param, scale="tiny", device="cpu", seed=0)
