"""meta["dense_nodes"] is the node count of a fresh Dynamo capture; KJT lengths never recompile."""

from __future__ import annotations

import torch
from torch._dynamo.testing import CompileCounter

import models
from models import capture, catalog


def _fresh_count(dense: torch.nn.Module, inputs: tuple[torch.Tensor, torch.Tensor]) -> int:
    """Independent of models.capture: compile the module itself, as the harness does."""
    torch._dynamo.reset()
    seen: list[int] = []

    def backend(gm: torch.fx.GraphModule, example_inputs: list[torch.Tensor]):  # type: ignore[no-untyped-def]
        seen.append(len(gm.graph.nodes))
        return gm.forward

    torch.compile(dense, backend=backend, fullgraph=True, dynamic=False)(*inputs)
    torch._dynamo.reset()
    assert len(seen) == 1
    return seen[0]


def test_meta_nodes_match_a_fresh_capture(tiny: models.Built) -> None:
    fresh = _fresh_count(tiny.module.dense, tiny.dense_inputs(tiny.batches[0]))
    assert tiny.meta["dense_nodes"] == fresh


def test_catalog_meta_device_capture_matches_build(tiny: models.Built) -> None:
    assert catalog.dense_nodes(tiny.meta["family"], "tiny") == tiny.meta["dense_nodes"]


def test_count_grows_with_features() -> None:
    small = models.build("towers", "tiny", overrides={"num_sparse_features": 4})
    more = models.build("towers", "tiny", overrides={"num_sparse_features": 8})
    # Each extra gated 2-layer tower: split getitem + 2 x (linear, layer_norm, silu + 4 params)
    # + gate (linear + 2 params, sigmoid, mul) = 20 nodes.
    assert more.meta["dense_nodes"] - small.meta["dense_nodes"] == 4 * 20


def test_repeated_captures_do_not_hit_the_recompile_limit() -> None:
    b = models.build("dlrm", "tiny")
    inputs = b.dense_inputs(b.batches[0])
    limit = torch._dynamo.config.recompile_limit
    counts = {capture.count_dense_nodes(b.module.dense, inputs) for _ in range(limit + 1)}
    assert counts == {b.meta["dense_nodes"]}


def test_capture_keeps_other_compiled_code() -> None:
    b = models.build("dcn", "tiny", count_nodes=False)
    inputs = b.dense_inputs(b.batches[0])
    torch._dynamo.reset()
    counter = CompileCounter()
    compiled = torch.compile(b.module.dense, backend=counter, fullgraph=True)
    compiled(*inputs)
    capture.count_dense_nodes(b.module.dense, inputs)  # must not drop `compiled`'s cache entry
    compiled(*inputs)
    assert counter.frame_count == 1


def test_varying_kjt_lengths_never_recompile_the_dense_arch() -> None:
    for family in models.FAMILIES:
        b = models.build(family, "tiny", overrides={"num_batches": 4}, count_nodes=False)
        totals = {int(batch.inputs[1].values().numel()) for batch in b.batches}
        assert len(totals) > 1, "the batches must differ in KJT lengths for this test to mean anything"
        torch._dynamo.reset()
        counter = CompileCounter()
        compiled = torch.compile(b.module.dense, backend=counter, fullgraph=True)
        for batch in b.batches:
            with torch.no_grad():
                torch.testing.assert_close(
                    compiled(*b.dense_inputs(batch)), b.module(*batch.inputs), rtol=1e-6, atol=1e-6
                )
        assert counter.frame_count == 1, family
    torch._dynamo.reset()
