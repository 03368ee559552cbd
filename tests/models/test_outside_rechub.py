"""torch-rechub's models in the outside corpus (models/outside/rechub_zoo.py): optimized, they
match eager on a train step (outputs, gradients, BatchNorm statistics) and in eval for Inductor.
Its MLPs, experts included, are Linear -> BatchNorm1d -> activation -> Dropout blocks."""

from __future__ import annotations

import pytest
from outside_checks import check_eval_for_inductor, check_train_step

from models import outside
from models.outside import rechub_zoo

pytestmark = pytest.mark.skipif(
    not rechub_zoo.available(), reason="torch-rechub is not installed (scripts/install-deps PYTHON --dev)"
)
NAMES = [f"{rechub_zoo.PREFIX}.{name}" for name in rechub_zoo.MODELS]


@pytest.mark.parametrize("name", NAMES)
def test_rechub_models_match_eager_on_a_train_step(name: str) -> None:
    found = check_train_step(name)
    # one whole graph: the gain measurement can time these side by side
    assert found["capture"] == "export", found["capture_reason"]


@pytest.mark.parametrize("name", NAMES)
def test_rechub_models_in_eval_for_inductor_match_eager(name: str) -> None:
    check_eval_for_inductor(name)


def test_every_rechub_model_is_in_the_catalog() -> None:
    assert set(NAMES) <= set(outside.names())
