"""RecBole's context-aware models in the outside corpus (models/outside/recbole_zoo.py):
optimized, they match eager on a train step and in eval for Inductor.

Each keeps its field offsets as a NumPy array that ``forward`` copies into a tensor; the capture
holds those arrays as constants (optimus.capture.numpy_constants), so each is one whole graph."""

from __future__ import annotations

import pytest
from outside_checks import check_eval_for_inductor, check_train_step
from torch import nn

from models import outside
from models.outside import recbole_zoo

pytestmark = [
    pytest.mark.skipif(
        not recbole_zoo.available(), reason="RecBole is not installed (scripts/install-deps PYTHON --dev)"
    ),
    # Dynamo's code for the offsets' torch.tensor(ndarray) call
    pytest.mark.filterwarnings("ignore:To copy construct from a tensor:UserWarning"),
]
NAMES = [f"{recbole_zoo.PREFIX}.{name}" for name in recbole_zoo.MODELS]


@pytest.mark.parametrize("name", NAMES)
def test_recbole_models_match_eager_on_a_train_step(name: str) -> None:
    found = check_train_step(name)
    assert found["capture"] == "export", found["capture_reason"]
    assert "read at each call" in found["capture_reason"]


@pytest.mark.parametrize("name", NAMES)
def test_recbole_models_in_eval_for_inductor_match_eager(name: str) -> None:
    check_eval_for_inductor(name)


def test_every_recbole_model_is_in_the_catalog_with_the_zoos_own_defaults() -> None:
    assert set(NAMES) <= set(outside.names())
    module, (x,) = outside.build("recbole.DeepFM")
    # DeepFM.yaml's embedding_size and mlp_hidden_size, as a RecBole user gets them by default
    assert module.token_embedding_table.embedding.embedding_dim == 10
    widths = [m.out_features for m in module.mlp_layers.modules() if isinstance(m, nn.Linear)]
    assert widths == [128, 128, 128]
    fields = {f"C{i}" for i in range(recbole_zoo.SPARSE)} | {f"I{i}" for i in range(recbole_zoo.DENSE)}
    assert set(x) == fields
    assert x["I0"].shape == (recbole_zoo.BATCH, 2) and bool((x["I0"][:, 1] == 1).all())
