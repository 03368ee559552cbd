"""The outside corpus (models.outside): models this repository did not write, optimized with the
re-layout, match eager on a train step (outputs, every gradient, every buffer), and the gain
measurement keeps going past a model that fails."""

from __future__ import annotations

import json
import warnings
from pathlib import Path

import pytest

from harness import outside_gain
from models import outside
from models.outside import deepctr_zoo, torchrec_zoo

NAMES = outside.names()


def test_the_corpus_has_at_least_twelve_architectures_from_two_zoos() -> None:
    if not deepctr_zoo.available():
        pytest.skip("deepctr-torch is not installed (scripts/install-deps PYTHON --dev installs it)")
    assert len(NAMES) >= 12, NAMES
    assert {n.split(".")[0] for n in NAMES} == {"deepctr", "torchrec"}


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
