"""The outside corpus as a provider (harness/providers/outside_corpus.py): the adapter computes
what the zoo's model computes, on the zoo's own inputs (a tensor, a dict of columns, a
KeyedJaggedTensor); building leaves the model's state as the zoo built it; the Optimus mode
matches eager through the harness's own cell code in both phases; bad names are one line."""

from __future__ import annotations

import copy

import pytest
import torch

from harness import cli, exit_codes
from harness.modes import mode_registry
from harness.providers import outside_corpus as corpus
from harness.run import cell
from models import outside

SPEC = "harness.providers.outside_corpus:build"
# one model per zoo, each with its zoo's input structure: DeepCTR a tensor, torch-rechub and
# RecBole a dict of columns, torchrec a KeyedJaggedTensor with absent leaves; MMOE's experts hold
# BatchNorm1d (running statistics) in torch-rechub
EACH_ZOO = ("deepctr.MMOE", "rechub.MMOE", "recbole.DCNV2", "torchrec.DLRM")


def installed(name: str) -> object:
    return pytest.param(
        name,
        marks=pytest.mark.skipif(name not in corpus.FAMILIES, reason=f"{outside.zoo_of(name)} not installed"),
    )


ZOO_PARAMS = [installed(n) for n in EACH_ZOO]


def test_the_families_are_the_installed_corpus() -> None:
    assert tuple(outside.names()) == corpus.FAMILIES
    assert corpus.SCALES == ("small",)


@pytest.mark.parametrize("name", ZOO_PARAMS)
def test_the_adapter_computes_the_zoos_model_on_its_own_inputs(name: str) -> None:
    b = corpus.build(name, "small", seed=3)
    zoo_model, example = outside.build(name, 3)
    b.module.eval()
    zoo_model.eval()
    with torch.no_grad():
        want, got = zoo_model(*example), b.module(*b.batches[0].inputs)
    torch.testing.assert_close(got, want, rtol=0, atol=0)
    dense_inputs = b.dense_inputs(b.batches[0])
    assert dense_inputs and all(isinstance(t, torch.Tensor) for t in dense_inputs)
    with torch.no_grad():
        torch.testing.assert_close(b.module.dense(*dense_inputs), want, rtol=0, atol=0)
    assert 1 <= len(b.batches) <= corpus.BATCHES
    assert all(batch.labels.shape == want.shape for batch in b.batches)
    assert set(b.batches[0].labels.unique().tolist()) <= {0.0, 1.0}
    # every batch has the first's shapes (the modes compile for one), and the batches differ
    shapes = [x.shape for x in dense_inputs]
    assert all([x.shape for x in b.dense_inputs(batch)] == shapes for batch in b.batches)
    if name != "torchrec.DLRM":  # a KJT's values vary in length from seed to seed: one batch
        assert len(b.batches) == corpus.BATCHES
        other = b.dense_inputs(b.batches[1])
        assert any(not torch.equal(x, y) for x, y in zip(dense_inputs, other, strict=True))
    assert b.meta["zoo"] == outside.zoo_of(name) and b.meta["params"] > 0


@pytest.mark.parametrize("name", ZOO_PARAMS)
def test_building_leaves_the_models_state_as_the_zoo_built_it(name: str) -> None:
    """The labels' shape comes from a forward of a copy: the model's BatchNorm statistics and
    its mode are the zoo's, and the global RNG stream is not the provider's concern."""
    b = corpus.build(name, "small", seed=1)
    zoo_model, _ = outside.build(name, 1)
    ours = b.module.dense.model.state_dict()  # type: ignore[union-attr]
    theirs = zoo_model.state_dict()
    assert ours.keys() == theirs.keys()
    for key, value in theirs.items():
        assert torch.equal(ours[key], value), key
    assert b.module.dense.model.training == zoo_model.training  # type: ignore[union-attr]


@pytest.mark.parametrize("name", ZOO_PARAMS)
@pytest.mark.parametrize("phase", ["infer", "train"])
def test_eager_optimus_matches_eager_through_the_cell_code(name: str, phase: str) -> None:
    b = corpus.build(name, "small")
    train = phase == "train"
    module, ref = b.module, copy.deepcopy(b.module)
    module.train(train)
    ref.train(train)
    original = dict(module.named_parameters())
    zoo = module.dense.model
    prepared = mode_registry.prepare("eager+optimus", module.dense, cell.example_inputs(b, b.batches))
    module.dense = prepared.module
    forward = cell.forward_fn(b, train)
    torch.manual_seed(0)
    out = forward(module, b.batches[0])
    torch.manual_seed(0)
    ref_out = forward(ref, b.batches[0])
    assert cell.close(ref_out, out, 1e-5, 1e-4), cell.max_err(ref_out, out)
    if train:
        grads = cell.compare_grads(ref, module, original, 1e-5, 1e-4)
        with_grad = {n for n, p in ref.named_parameters() if p.grad is not None}
        assert grads["bad"] == [] and grads["grads_compared"] == len(with_grad) > 0
        # a parameter the zoo's forward does not use (RecBole keeps some) has no gradient in
        # either: None stays None, and a zero gradient would have been compared above
        assert {n for n, p in original.items() if p.grad is not None} == with_grad
        # the buffers a caller reads on the zoo's own module: BatchNorm's running statistics
        mine, want = dict(zoo.named_buffers()), dict(ref.dense.model.named_buffers())  # type: ignore[union-attr]
        assert mine.keys() == want.keys()
        for key, value in want.items():
            torch.testing.assert_close(mine[key], value, rtol=1e-5, atol=1e-6, msg=key)


@pytest.mark.skipif(not corpus.FAMILIES, reason="no zoo of the corpus installed")
def test_an_unknown_scale_or_model_is_one_line(capsys: pytest.CaptureFixture[str]) -> None:
    model = corpus.FAMILIES[0]
    with pytest.raises(
        ValueError, match=r"^scale: unknown 'tiny' for the outside corpus; allowed values: small$"
    ):
        corpus.build(model, "tiny")
    with pytest.raises(ValueError, match=r"^unknown outside model 'nozoo.Model'"):
        corpus.build("nozoo.Model", "small")
    # through `ab`: refused before any worker starts (a worker's error would be a traceback)
    for option, value in (("--model", "nozoo.Model"), ("--scale", "tiny")):
        argv = ["ab", "--provider", SPEC, "--model", model, "--scale", "small", option, value]
        assert cli.main(argv) == exit_codes.BAD_INPUT
        err = capsys.readouterr().err.strip()
        assert len(err.splitlines()) == 1 and f"unknown {value!r}" in err, err
