"""The figures and the verdict of a training-quality cell (harness/measure/quality.py), on
figures built by hand: each rule flags what it is for and only that."""

from __future__ import annotations

import dataclasses

import pytest
import torch

from harness.measure import quality


def _seed(seed: int, auc: float = 0.7, ll: float = 0.55, **kw: object) -> quality.SeedFigures:
    fields: dict = dict(seed=seed, auc=auc, logloss=ll, eager_auc=auc, eager_logloss=ll, eager_auc_start=0.5,
                        drift=0.0, drift_rel=0.0, drift_param="w")  # fmt: skip
    fields.update(kw)
    return quality.SeedFigures(**fields)


def _eager_seeds() -> list[quality.SeedFigures]:
    # eager's own spread over seeds: AUC 0.68..0.72, logloss 0.53..0.57
    return [_seed(0, 0.70, 0.55), _seed(1, 0.68, 0.57), _seed(2, 0.72, 0.53)]


def test_a_mode_equal_to_eager_passes() -> None:
    got = quality.judge(_eager_seeds())
    assert got["verdict"] == "ok" and got["reasons"] == []
    assert got["spread_auc"] == pytest.approx(0.04) and got["spread_logloss"] == pytest.approx(0.04)
    assert got["auc"] == pytest.approx(0.70) and got["within_spread"] is True


@pytest.mark.parametrize(
    ("change", "rule"),
    [
        ({"auc": 0.70 + 2e-3}, "AUC"),  # 2e-3 > the 1e-3 AUC tolerance
        ({"logloss": 0.55 * (1 + 2e-3)}, "logloss"),  # relative 2e-3 > 1e-3
        ({"drift": 0.02, "drift_rel": 2e-4}, "parameter drift"),  # 2e-4 > DRIFT_RTOL
    ],
)
def test_one_seed_past_a_tolerance_is_a_quality_mismatch(change: dict, rule: str) -> None:
    seeds = _eager_seeds()
    seeds[0] = dataclasses.replace(seeds[0], **change)
    got = quality.judge(seeds)
    assert got["verdict"] == "quality_mismatch"
    assert len(got["reasons"]) == 1 and got["reasons"][0].startswith("seed 0:") and rule in got["reasons"][0]
    assert got["within_tolerance"] is (rule == "parameter drift")
    assert got["within_drift"] is (rule != "parameter drift")


def test_just_inside_every_tolerance_passes() -> None:
    seeds = _eager_seeds()
    seeds[1] = dataclasses.replace(seeds[1], auc=0.68 + 0.9e-3, logloss=0.57 * (1 + 0.9e-3), drift_rel=0.9e-4)
    assert quality.judge(seeds)["verdict"] == "ok"


def test_a_mean_outside_eagers_seed_spread_is_a_quality_mismatch() -> None:
    """Each seed within tolerance, but eager barely moves from seed to seed and the mode sits off
    it in every seed: it moved further than another seed would."""
    seeds = [_seed(0, 0.7000, 0.5500), _seed(1, 0.7001, 0.5501), _seed(2, 0.7002, 0.5500)]
    seeds = [dataclasses.replace(s, auc=s.eager_auc + 8e-4) for s in seeds]
    got = quality.judge(seeds)
    assert got["within_tolerance"] is True and got["within_spread"] is False
    assert got["verdict"] == "quality_mismatch" and "spread" in got["reasons"][0]


def test_one_seed_has_no_spread() -> None:
    got = quality.judge([_seed(0)])
    assert got["spread_auc"] is None and got["within_spread"] is None and got["verdict"] == "ok"


def test_auc_matches_scikit_learn() -> None:
    from sklearn.metrics import roc_auc_score

    gen = torch.Generator().manual_seed(0)
    labels = torch.bernoulli(torch.full((500, 2), 0.3), generator=gen)
    logits = labels * 0.8 + torch.randn(500, 2, generator=gen)
    got = quality.auc_per_task(logits, labels)
    for t in range(2):
        assert got[t] == pytest.approx(roc_auc_score(labels[:, t].numpy(), logits[:, t].numpy()), abs=1e-6)
    assert quality.mean_auc(got) == pytest.approx(sum(got) / 2)  # type: ignore[arg-type]
    assert quality.auc_per_task(logits, torch.zeros(500, 2)) == [None, None]  # one class: undefined


def test_loss_curve_and_drift() -> None:
    assert quality.loss_curve([1.0, 3.0, 5.0, 7.0, 9.0], 2) == [[2.0, 2.0], [4.0, 6.0], [5.0, 9.0]]
    start = {"a": torch.zeros(3), "b": torch.zeros(2)}
    eager = {"a": torch.tensor([0.0, 2.0, 0.0]), "b": torch.tensor([0.5, 0.0])}
    mode = {"a": torch.tensor([0.0, 2.0, 0.01]), "b": torch.tensor([0.5, -0.03])}
    got = quality.parameter_drift(mode, eager, start)
    assert got["drift_param"] == "b" and got["drift"] == pytest.approx(0.03)
    assert got["moved"] == pytest.approx(2.0) and got["drift_rel"] == pytest.approx(0.015)


def test_the_loss_check_names_the_first_step_past_its_tolerance() -> None:
    ref = [0.70, 0.69, 0.68, 0.67]
    same = quality.loss_check([x * (1 + 5e-5) for x in ref], ref)
    assert same["first_off"] is None and same["max_rel_diff"] == pytest.approx(5e-5)
    off = quality.loss_check([0.70, 0.69 * (1 + 2e-4), 0.68 * (1 + 3e-4), 0.67], ref)
    assert off["first_off"]["step"] == 2 and off["first_off"]["rel_diff"] == pytest.approx(2e-4)
    assert off["at_step"] == 3 and off["max_rel_diff"] == pytest.approx(3e-4)
    assert quality.loss_check([float("nan")], [0.7])["first_off"]["step"] == 1
    with pytest.raises(ValueError, match="2 steps against 1"):
        quality.loss_check([0.7, 0.6], [0.7])


def test_a_loss_curve_off_the_reference_fails_first_in_the_reasons() -> None:
    """Seed 0's loss 2e-4 off at step 2 fails the curve rule, seed 1 the drift rule: the curve's
    reason comes first (it says where training left the reference)."""
    ref = [0.70, 0.69, 0.68]
    ok = quality.judge([_seed(0, loss_check=quality.loss_check(ref, ref))])
    assert ok["verdict"] == "ok" and ok["within_curve"] is True and ok["loss_rel_diff"] == 0.0
    bad = quality.judge([_seed(0, loss_check=quality.loss_check([0.70, 0.69 * (1 + 2e-4), 0.68], ref)),
                         _seed(1, drift=0.02, drift_rel=2e-4)])  # fmt: skip
    assert bad["verdict"] == "quality_mismatch" and bad["within_curve"] is False
    assert bad["reasons"][0].startswith("seed 0: training loss at step 2 is 0.690138 vs the reference's 0.69")
    assert "relative diff 2.00e-04 > 0.0001" in bad["reasons"][0]
    assert len(bad["reasons"]) == 2 and bad["reasons"][1].startswith("seed 1: parameter drift")
    assert "within_curve" not in quality.judge(_eager_seeds())  # no step-by-step check: no such figure


def test_a_drift_recorded_but_not_judged() -> None:
    """``drift_rtol=None`` (a sharded cell): a drift past the rule is a figure, not a reason."""
    seeds = [_seed(0, drift=0.02, drift_rel=2e-4)]
    got = quality.judge(seeds, drift_rtol=None)
    assert got["verdict"] == "ok" and got["within_drift"] is None and got["drift_rel"] == 2e-4
    assert quality.judge(seeds)["verdict"] == "quality_mismatch"


def test_a_diverged_seed_is_a_quality_mismatch_the_results_file_keeps() -> None:
    """A mode whose training diverges has a NaN logloss and NaN losses in its curve. The cell
    writes them as null (``cell.finite``), says quality_mismatch, and the results file validates:
    one diverged cell must not take the run's other cells with it."""
    from harness.run import cell as cellmod
    from harness.run.quality import record_verdict
    from harness.store import results
    from tests.harness import synthetic

    nan = float("nan")
    seeds = _eager_seeds()
    seeds[0] = dataclasses.replace(seeds[0], logloss=nan, drift=nan, curve=[[10.0, 0.6], [20.0, nan]],
                                   eager_curve=[[10.0, 0.6], [20.0, 0.5]])  # fmt: skip
    rec = synthetic.cell("dcn", "eager+optimus", "train", 1.0, seed=0)
    cfg = {"quality_steps": 20, "quality_heldout": 4, "quality_every": 10, "quality_lr": 0.5}
    record_verdict(rec, seeds, cfg, "eager")
    assert rec["status"] == "quality_mismatch" and "seed 0: logloss nan" in rec["error"]
    doc = synthetic.doc([cellmod.finite(rec)])
    checked = results.validate(doc, "diverged.json")
    q = checked["cells"][0]["quality"]
    assert q["logloss"] is None and q["seeds"][0]["curve"][1] == [20.0, None]
    from harness.report import quality as quality_report

    section = quality_report.section(checked)  # the report reads it too
    assert "| eager+optimus |" in section and "**quality_mismatch**" in section
    steps, losses = quality_report._mean_curve(q["seeds"], "curve")
    assert steps == [10.0, 20.0] and losses[1] != losses[1]  # NaN: a gap in the plot
