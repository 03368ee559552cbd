"""Change points of a nightly series and the alert policy, on seeded synthetic nights.

The detector is Apache Otava's (installed by scripts/install-deps); the rules on top of it
(where a change starts, its size and interval, direction, when it alerts) are checked exactly.
"""

from __future__ import annotations

import numpy as np
import pytest

from harness.nightly.alert_policy import AlertPolicy, Tracker
from harness.nightly.changepoints import Change, OtavaDetector, describe, detect
from harness.nightly.changes import ChangeConfig, analyse, build_series, commit_range, config_from

pytest.importorskip("otava.analysis", reason="apache-otava is installed by scripts/install-deps")


def _series(n: int, step_at: int | None, step: float, seed: int, noise: float = 0.045) -> list[float]:
    rng = np.random.default_rng(seed)
    level = np.ones(n)
    if step_at is not None:
        level[step_at:] *= 1.0 + step
    return [float(v) for v in 5.0 * level * np.exp(rng.normal(0.0, noise, n))]


def test_describe_gives_start_size_interval_and_direction() -> None:
    xs = [1.0, 1.02, 0.98, 1.0, 1.1, 1.12, 1.08, 1.1]
    (c,) = describe(xs, [4])
    assert c.index == 4 and c.direction == "up" and c.regression
    assert c.change == pytest.approx(0.10, abs=1e-9)
    assert c.ci[0] < 0.10 < c.ci[1] and c.ci[0] > 0.0
    assert c.nights_after == 4
    (faster,) = describe(xs, [4], higher_is_better=True)
    assert not faster.regression  # a speedup figure that rose is an improvement
    with pytest.raises(ValueError, match="finite number > 0"):
        describe([1.0, float("nan"), 1.0], [1])


@pytest.mark.parametrize("seed", range(5))
def test_otava_finds_a_ten_percent_step_where_it_is(seed: int) -> None:
    xs = _series(50, 30, 0.10, seed, noise=0.02)
    changes = detect(xs, OtavaDetector())
    assert [c.index for c in changes] == [30]
    c = changes[0]
    assert abs(c.change - 0.10) < 0.03 and c.ci[0] < c.change < c.ci[1] and c.ci[1] - c.ci[0] < 0.05


def test_otava_rarely_finds_a_change_in_a_flat_series() -> None:
    # Measured: 2 of these 40 flat 50-night series at 4.5% noise get a (false) change point.
    # The nightly asks again every night, hence the alert policy on top (and the replay's rates).
    found = sum(bool(detect(_series(50, None, 0.0, seed), OtavaDetector())) for seed in range(40))
    assert found <= 4


def _change(index: int, change: float = 0.1, nights_after: int = 5) -> Change:
    return Change(index, 1.0, 1.0 + change, change, (change / 2, change * 2), "up", change > 0, nights_after)


def test_tracker_agree_persist_min_change_and_once_per_change() -> None:
    policy = AlertPolicy(persist_nights=3, agree_nights=2, min_change=0.03, dedupe=3)
    # agree: the pairwise gate flagged the change's first two nights -> alert the first night it is seen
    t = Tracker(policy)
    assert [(c.index, why) for c, why in t.night([_change(10)], [False] * 10 + [True, True])] == [
        (10, "agree")
    ]
    assert t.night([_change(11)], [False] * 10 + [True, True, True]) == []  # the same change: once
    assert t.night([_change(16)], [False] * 10 + [True] * 8) == []  # moved by 6, nothing between: same
    flags = [False] * 10 + [True] * 2 + [False] * 8 + [True] * 2
    assert [(c.index, why) for c, why in t.night([_change(10), _change(20)], flags)] == [(20, "agree")]
    # persist: seen on three consecutive nights (its place may move by up to `dedupe`)
    t = Tracker(policy)
    flags = [False] * 20
    assert t.night([_change(10)], flags) == []
    assert t.night([_change(12)], flags) == []
    assert [why for _, why in t.night([_change(11)], flags)] == ["persist"]
    # a gap resets the streak; a small change never alerts; an improvement never alerts
    t = Tracker(policy)
    assert (
        t.night([_change(10)], flags) == []
        and t.night([], flags) == []
        and t.night([_change(10)], flags) == []
    )
    t = Tracker(policy)
    for _ in range(5):
        assert t.night([_change(10, 0.02), _change(15, -0.2)], [True] * 20) == []


def test_policy_and_config_validation_name_the_field() -> None:
    with pytest.raises(ValueError, match=r"alert\.persist_nights: must be an integer >= 1"):
        AlertPolicy(persist_nights=0).validate()
    with pytest.raises(ValueError, match=r"cfg: alert\.min_change: must be a finite number"):
        config_from({"min_change": float("nan")}, "cfg")
    with pytest.raises(ValueError, match=r"cfg.detector: unknown 'cusum'"):
        config_from({"detector": "cusum"}, "cfg")
    with pytest.raises(ValueError, match=r"cfg: unknown field\(s\) \['windw'\]"):
        config_from({"windw": 30}, "cfg")


def test_history_series_locate_the_commit_range(tmp_path) -> None:  # type: ignore[no-untyped-def]
    from harness.nightly.replay import Noise, write_demo_history
    from harness.store import history_store

    path = tmp_path / "history.jsonl"
    write_demo_history(str(path), nights=40, step_at=26, step=0.12, seed=3, noise=Noise(night=0.02))
    nights = history_store.read(path)
    found = {(s.cell, s.metric): analyse(s, ChangeConfig()) for s in build_series(nights)}
    towers = found[("towers/tiny/compile/infer", "latency_ms")]
    (c,) = towers.changes
    assert c.index == 25 and c.regression  # night 26 is the first at the new level
    assert (
        commit_range(towers.series, c.index)
        == f"{nights[24].night['sha'][:10]}..{nights[25].night['sha'][:10]}"
    )
    assert [t for t, ch, _ in towers.alerts if abs(ch.index - 25) <= 3], "the step was alerted"
    assert found[("dlrm/tiny/compile/infer", "latency_ms")].changes == []


def test_replay_and_changes_commands_run(tmp_path, capsys) -> None:  # type: ignore[no-untyped-def]
    import json

    from harness import cli, exit_codes

    out = tmp_path / "replay.json"
    assert cli.main(["replay", "--series", "1", "--nights", "30", "--out", str(out)]) == exit_codes.OK
    doc = json.loads(out.read_text())
    assert {"old", "new", "noise"} <= set(doc) and "false_alert_series" in doc["new"]
    assert "| figure | target | old gate (pairwise only) | new policy (otava) |" in capsys.readouterr().out
    assert cli.main(["replay", "--series", "0"]) == exit_codes.BAD_INPUT
    assert cli.main(["replay", "--max-pvalue", "nan"]) == exit_codes.BAD_INPUT
    hist = tmp_path / "h.jsonl"
    assert cli.main(["replay", "--demo-history", str(hist)]) == exit_codes.OK
    assert (
        cli.main(["replay", "--demo-history", str(hist)]) == exit_codes.BAD_INPUT
    )  # appends to a new file only
    assert cli.main(["changes", str(hist), "--out-dir", str(tmp_path / "c")]) == exit_codes.OK
    assert (tmp_path / "c" / "changes.png").stat().st_size > 10_000
    assert "| towers/tiny/compile/infer | latency_ms |" in (tmp_path / "c" / "changes.md").read_text()


def test_noise_measured_from_the_committed_tiny_runs() -> None:
    from harness.nightly.replay import noise_from_results
    from harness.store import results

    a = results.load("results/tiny/at-32c82f5.json")
    b = results.load("results/tiny/at-855119b.json")
    noise, cells = noise_from_results(a, b)
    assert cells == 40 and 0.03 < noise < 0.06  # 4.8%: the 4.5% is in range
