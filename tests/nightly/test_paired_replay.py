"""The paired policy replayed (harness.nightly.paired_replay): its verdicts follow the noise."""

from __future__ import annotations

import numpy as np
import pytest

from harness.nightly import paired_replay
from harness.nightly.paired_replay import PairedNoise


def test_quiet_pairs_catch_steps_and_creeps_and_never_flag_a_a() -> None:
    res = paired_replay.run(
        PairedNoise(sd_round=0.002, sd_proc=0.0), series=20, nights=40, seed=0, cells_per_night=8
    )
    assert res["aa_cell_nights_flagged"] == 0.0 and res["aa_10_nights_all_green"] == 1.0
    assert res["step3_caught_first_night"] == res["step5_caught_first_night"] == 1.0
    assert res["creep2_caught_within_3"] == 1.0  # against the anchor the creep adds up


def test_without_an_anchor_a_creep_is_a_coin_toss() -> None:
    """Paired only with the night before, 2% a night sits on a 2% threshold every night: only the
    median of an undecided interval can flag it (about half the time)."""
    pn = PairedNoise(sd_round=0.002, sd_proc=0.0, anchor_nights=1)
    res = paired_replay.run(pn, series=20, nights=40, seed=0, cells_per_night=8)
    assert res["creep2_caught_within_3"] <= 0.7


def test_noise_between_processes_costs_recall_and_false_alerts() -> None:
    quiet = paired_replay.run(PairedNoise(0.01, 0.0), series=40, nights=40, seed=1, cells_per_night=8)
    noisy = paired_replay.run(PairedNoise(0.01, 0.03), series=40, nights=40, seed=1, cells_per_night=8)
    assert noisy["aa_cell_nights_flagged"] > quiet["aa_cell_nights_flagged"]
    assert noisy["step3_caught_first_night"] < quiet["step3_caught_first_night"]


def test_from_study_takes_out_what_the_rounds_explain() -> None:
    pn = PairedNoise.from_study({"sd_round": 0.03, "sd_pair": 0.02, "rounds": 15})
    explained = 1.2533 * 0.03 / np.sqrt(15)
    assert pn.sd_proc == pytest.approx(np.sqrt(0.02**2 - explained**2))
    with pytest.raises(ValueError, match="too few pairs"):
        PairedNoise.from_study({"sd_round": None, "sd_pair": None, "rounds": 15})
