"""The checks every outside-corpus model passes, whichever zoo wrote it (test_outside_*.py).

- ``check_train_step``: ``optimize()`` with the re-layout against eager on one train step from the
  same RNG seed: the outputs, every parameter's gradient and every buffer (BatchNorm statistics).
- ``check_eval_for_inductor``: eval mode, priced for Inductor, with small chunks, so the
  inference-only pass (optimus/memory/chunked.py, optimus/memory/chunk_slab.py) runs on code this
  repository did not write: outputs equal eager's in values, dtype and strides, and grad mode and
  autocast stay the caller's.
"""

from __future__ import annotations

import warnings
from typing import Any

import torch

import optimus
from harness.diagnose import outside_gain
from models import outside
from optimus.params.relayout import RelayoutParams


def check_train_step(name: str) -> dict[str, Any]:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        found = outside_gain.parity(name)
    assert (found["values"], found["grads"], found["buffers"]) == (True, True, True), found
    assert found["nodes_before"] > 0
    if name.startswith("torchrec."):  # KJT models: one whole graph, the lookup outside it
        assert found["capture"] == "export", found["capture_reason"]
        assert "run eagerly outside it" in found["capture_reason"]
    return found


def check_eval_for_inductor(name: str) -> Any:
    module, inputs = outside.build(name, seed=0)
    module.eval()
    with torch.no_grad():
        ref = module(*inputs)
    config = optimus.OptimusConfig(
        layout=RelayoutParams(),
        cost_model=optimus.AnalyticCostModel(inductor=True),
        inference_chunk_bytes=1024,
    )
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        gm = optimus.optimize(module, inputs, config=config)
    assert torch.is_grad_enabled() and not torch.is_autocast_enabled("cpu")
    with torch.no_grad():
        got = gm(*inputs)
    refs, gots = torch.utils._pytree.tree_leaves(ref), torch.utils._pytree.tree_leaves(got)
    assert len(refs) == len(gots)
    for a, b in zip(refs, gots, strict=True):
        assert (a.dtype, a.shape, a.stride()) == (b.dtype, b.shape, b.stride())
        torch.testing.assert_close(b, a, rtol=1e-5, atol=1e-6)
    return gm.optimus_report
