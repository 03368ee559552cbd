"""The outside corpus (models.outside): models this repository did not write, optimized with the
re-layout, match eager on a train step (outputs, every gradient, every buffer), and the gain
measurement keeps going past a model that fails."""

from __future__ import annotations

import json
import warnings
from pathlib import Path

import pytest

from harness.diagnose import outside_gain
from models import outside
from models.outside import deepctr_zoo, rechub_zoo, torchrec_zoo

NAMES = outside.names()


def test_the_corpus_has_at_least_twelve_architectures_from_three_zoos() -> None:
    if not (deepctr_zoo.available() and rechub_zoo.available()):
        pytest.skip("deepctr-torch or torch-rechub is not installed (scripts/install-deps PYTHON --dev)")
    assert len(NAMES) >= 12, NAMES
    assert {outside.zoo_of(n) for n in NAMES} == set(outside.zoos()) == {"deepctr", "rechub", "torchrec"}


def test_most_architectures_have_independent_implementations_in_two_zoos() -> None:
    """The same architecture written by another zoo: what keeps a rule from fitting one style."""
    if not rechub_zoo.available():
        pytest.skip("torch-rechub is not installed (scripts/install-deps PYTHON --dev installs it)")
    shared = {"DeepFM", "DCN", "AutoInt", "MMOE", "PLE", "ESMM", "SharedBottom"}
    assert shared <= set(rechub_zoo.MODELS) and shared <= set(deepctr_zoo.MODELS)


@pytest.mark.parametrize("name", NAMES)
def test_optimized_outside_models_match_eager_on_a_train_step(name: str) -> None:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        found = outside_gain.parity(name)
    assert (found["values"], found["grads"], found["buffers"]) == (True, True, True), found
    assert found["nodes_before"] > 0
    if name.startswith("torchrec."):  # KJT models: one whole graph, the lookup outside it
        assert found["capture"] == "export", found["capture_reason"]
        assert "run eagerly outside it" in found["capture_reason"]


def test_unknown_names_say_what_is_installed() -> None:
    with pytest.raises(outside.OutsideModelError, match="unknown outside model 'nope'"):
        outside.build("nope")
    assert outside_gain.main(["--out-dir", "/nonexistent-never-written", "--models", "nope"]) == 2


def test_a_model_that_fails_is_a_row_and_the_others_are_measured(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    if not (deepctr_zoo.available() and torchrec_zoo.available()):
        pytest.skip("deepctr-torch or torchrec is not installed")
    real = outside.build

    def build(name: str, seed: int = 0):  # type: ignore[no-untyped-def]
        if name == "deepctr.DCN":
            raise RuntimeError("boom")
        return real(name, seed)

    monkeypatch.setattr(outside, "build", build)
    names = "deepctr.DCN,deepctr.PNN,deepctr.AutoInt"
    code = outside_gain.main(["--out-dir", str(tmp_path), "--models", names, "--rounds", "1", "--steps", "1"])
    assert code == 0
    doc = json.loads((tmp_path / "outside-gain.json").read_text())
    assert doc["models"]["deepctr.DCN"] == {"error": "RuntimeError: boom"}
    measured = doc["models"]["deepctr.PNN"]
    assert measured["gain"]["forward"]["speedup"] > 0 and measured["parity"]["values"] is True
    # AutoInt's forward has Python side effects, so it takes the per-call Dynamo path: timed there,
    # the two contenders would share Dynamo's cache, so the row says why it has no figure instead
    per_call = doc["models"]["deepctr.AutoInt"]
    assert per_call["parity"]["capture"] == "dynamo-subgraphs"
    assert "not comparable" in per_call["gain"]["skipped"]
    assert "error: RuntimeError: boom" in (tmp_path / "outside-gain.md").read_text()


@pytest.mark.parametrize("name", NAMES)
def test_outside_models_in_eval_for_inductor_match_eager(name: str) -> None:
    """Eval mode, priced for Inductor, with small chunks: the inference-only pass
    (optimus/memory/chunked.py, optimus/memory/chunk_slab.py) runs on code this repository did not write.
    Outputs equal eager's in values, dtype and strides; grad mode and autocast are the caller's.
    DeepCTR's MMOE is where it cuts a group: its experts' first layers, merged with the gates,
    computed per chunk."""
    import torch

    import optimus
    from optimus.params.relayout import RelayoutParams

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
    if name == "deepctr.MMOE":
        report = gm.optimus_report
        assert report.chunked_groups >= 1, report.notes
        assert any("linear computed per chunk" in n for n in report.notes), report.notes
