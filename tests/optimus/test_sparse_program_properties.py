"""Property: generated torchrec models (:mod:`fuzz_sparse`: an EmbeddingBagCollection looked up
under ``no_grad``, ``inference_mode``, ``autocast``, ``set_grad_enabled(False)`` or none, its
KeyedTensor read inside or outside that block, then a dense head) train through ``optimize``
(default config, the sparse boundary running the lookup outside the graph) exactly as in eager:
outputs, which parameters get a gradient, and the parameters after AdamW and SGD-with-momentum
steps. More examples with ``scripts/fuzz --programs sparse --examples N``."""

from __future__ import annotations

import os

import pytest
from fuzz_choices import DrawChoices
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

pytest.importorskip("torchrec")

from fuzz_sparse import SparseSpec, check, generate

EXAMPLES = max(int(os.environ.get("OPTIMUS_FUZZ_PROPERTY_EXAMPLES", "25")) // 6, 3)


@st.composite
def sparse_specs(draw: st.DrawFn) -> SparseSpec:
    return generate(DrawChoices(draw))


@settings(
    max_examples=EXAMPLES,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)
@given(sparse_specs())
def test_sparse_models_train_as_in_eager(spec: SparseSpec) -> None:
    result = check(spec)
    assert result.mismatches == []
    assert result.boundary, "the sparse boundary was not used: the lookup's context went untested"


@pytest.mark.parametrize("context", ["inference_mode", "autocast_no_grad"])
def test_frozen_lookups_read_outside_their_block_stay_frozen(context: str) -> None:
    """Only the lookup in the block, its KeyedTensor read after it: no op of the graph runs in
    the context, so only the boundary's replay keeps the tables frozen (with it switched off,
    the tables get gradients and move: ``grad_presence``, ``output``, ``trained``). The plain
    ``no_grad`` and ``set_grad_enabled`` forms are drawn by the property above and the fuzzer."""
    result = check(SparseSpec(features=2, context=context, read="kt", head="towers"))
    assert result.boundary
    assert result.mismatches == []
