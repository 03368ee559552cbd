"""The outside corpus (models.outside): models this repository did not write, optimized with the
re-layout, match eager on a train step (outputs, every gradient, every buffer), and the gain
measurement keeps going past a model that fails."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from outside_checks import check_eval_for_inductor, check_train_step

from harness.diagnose import outside_gain
from models import outside
from models.outside import deepctr_zoo, recbole_zoo, rechub_zoo, torchrec_zoo

NAMES = outside.names()
ZOOS = {zoo.PREFIX: zoo for zoo in (deepctr_zoo, recbole_zoo, rechub_zoo, torchrec_zoo)}


def test_the_corpus_has_four_zoos() -> None:
    missing = [prefix for prefix, zoo in ZOOS.items() if not zoo.available()]
    if missing:
        pytest.skip(f"not installed: {', '.join(missing)} (scripts/install-deps PYTHON --dev installs them)")
    assert len(NAMES) >= 12, NAMES
    assert {outside.zoo_of(n) for n in NAMES} == set(outside.zoos()) == set(ZOOS)


def test_each_architecture_is_written_by_distinct_zoos() -> None:
    """The architecture map names real corpus entries, one per zoo; the architectures the
    corpus's rules target most (DeepFM, Wide&Deep, DCN, DCN-V2, AutoInt) have three or more."""
    for arch, names in outside.ARCHITECTURES.items():
        zoos = [outside.zoo_of(n) for n in names]
        assert len(set(zoos)) == len(zoos) >= 2, (arch, names)
        for name in names:
            assert name.split(".", 1)[1] in ZOOS[outside.zoo_of(name)].MODELS, name
    three = {a for a, names in outside.ARCHITECTURES.items() if len(names) >= 3}
    assert three == {"DeepFM", "Wide&Deep", "DCN", "DCN-V2", "AutoInt"}


# torch-rechub's and RecBole's models have their own files (test_outside_rechub.py,
# test_outside_recbole.py), so the suite's workers share the corpus.
HERE = [n for n in NAMES if outside.zoo_of(n) in ("deepctr", "torchrec")]


@pytest.mark.parametrize("name", HERE)
def test_optimized_outside_models_match_eager_on_a_train_step(name: str) -> None:
    check_train_step(name)


def test_unknown_names_say_what_is_installed() -> None:
    with pytest.raises(outside.OutsideModelError, match="unknown outside model 'nope'"):
        outside.build("nope")
    assert outside_gain.main(["--out-dir", "/nonexistent-never-written", "--models", "nope"]) == 2
    assert outside_gain.main(["--out-dir", "/nonexistent-never-written", "--zoos", "nope"]) == 2
    assert outside_gain.main(["--models", "deepctr.DCN"]) == 2  # neither --out-dir nor --from-json


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


@pytest.mark.parametrize("name", HERE)
def test_outside_models_in_eval_for_inductor_match_eager(name: str) -> None:
    """Eval mode, priced for Inductor, with small chunks (outside_checks.check_eval_for_inductor).
    DeepCTR's MMOE is where it cuts a group: its experts' first layers, merged with the gates,
    computed per chunk."""
    report = check_eval_for_inductor(name)
    if name == "deepctr.MMOE":
        assert report.chunked_groups >= 1, report.notes
        assert any("linear computed per chunk" in n for n in report.notes), report.notes
