"""The paired nightly policy replayed on synthetic histories, at the paired noise a study measured
(``harness.nightly.noise_study``): ``optimus-bench replay --noise-from STUDY.json``.

Why a model of its own: a paired night does not see the night-to-night noise that the old gate and
the change-point detector fight (both sides share the night), so its noise has two other parts,
both measured by the study:

- ``sd_round``: the spread of the log per-round ratio (load that hits one side of a round);
- ``sd_proc``: the offset of one pair of processes that the rounds do not average away (a process
  that landed on a slower layout), from the A/A pairs' spread between measurements, less the part
  the rounds explain.

A paired night of one cell: the log ratio of the true levels (tonight against the anchor) plus one
``sd_proc`` offset, then ``rounds`` per-round samples around it; the interval of the median is the
normal approximation of its bootstrap (1.2533 sd / sqrt(n), 95%). Slower when the whole interval lies
above the threshold; undecided: more rounds, up to ``max_rounds``, then not flagged (the gate, like
``compare``, flags only an interval wholly above the threshold). A slower
night is paired again in fresh processes (a new offset) and is red only if it is slower again. A red
night is never a base; the anchor is kept for ``anchor_nights`` passing nights (``job.paired_anchor``).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

KINDS = ("none", "step3", "step5", "step10", "creep2")
Z95 = 1.959964
MEDIAN_SE = 1.2533  # se of a normal sample's median over its sd, times sqrt(n)


@dataclass(frozen=True)
class PairedNoise:
    sd_round: float
    sd_proc: float
    rounds: int = 15
    max_rounds: int = 45
    threshold: float = 0.02
    anchor_nights: int = 7
    reruns: int = 1

    @staticmethod
    def from_study(summary: dict[str, Any], threshold: float = 0.02) -> PairedNoise:
        sd_round, sd_pair, rounds = summary.get("sd_round"), summary.get("sd_pair"), summary.get("rounds")
        if not sd_round or sd_pair is None or not rounds:
            raise ValueError("the study has too few pairs for its noise (need two or more A/A measurements)")
        explained = MEDIAN_SE * sd_round / math.sqrt(rounds)
        sd_proc = math.sqrt(max(0.0, sd_pair**2 - explained**2))
        return PairedNoise(sd_round=float(sd_round), sd_proc=sd_proc, rounds=int(rounds), max_rounds=3 * int(rounds),
                           threshold=threshold)  # fmt: skip


def true_levels(kind: str, nights: int, rng: np.random.Generator) -> tuple[np.ndarray, int | None]:
    levels = np.ones(nights)
    if kind == "none":
        return levels, None
    start = int(rng.integers(nights // 2, nights - 10))
    if kind.startswith("step"):
        levels[start:] = 1.0 + int(kind[4:]) / 100
    else:  # creep2: +2% a night for five nights
        for i in range(5):
            levels[start + i :] *= 1.02
    return levels, start


def slower(log_true: float, pn: PairedNoise, rng: np.random.Generator) -> bool:
    """One paired measurement of one cell: is it slower beyond the threshold?"""
    offset = rng.normal(0.0, pn.sd_proc)
    xs = list(log_true + offset + rng.normal(0.0, pn.sd_round, pn.rounds))
    limit = math.log1p(pn.threshold)
    while True:
        med = float(np.median(xs))
        half = Z95 * MEDIAN_SE * float(np.std(xs, ddof=1)) / math.sqrt(len(xs))
        if med - half > limit:
            return True
        if med + half < limit:
            return False
        if len(xs) + pn.rounds > pn.max_rounds:
            return False  # still undecided: the gate flags only a whole interval above (compare)
        xs += list(log_true + offset + rng.normal(0.0, pn.sd_round, pn.rounds))


def replay_series(
    kind: str, nights: int, pn: PairedNoise, rng: np.random.Generator
) -> tuple[int | None, list[int]]:
    """The red nights of one cell's history (and the first changed night)."""
    levels, start = true_levels(kind, nights, rng)
    runs: list[dict[str, Any]] = [{"i": 0, "status": "pass", "anchor": None}]
    red: list[int] = []
    for t in range(1, nights):
        base = next(r for r in reversed(runs) if r["status"] == "pass")
        anchor = base["i"]
        if base["anchor"] is not None:
            passing_since = sum(1 for r in runs if r["status"] == "pass" and r["i"] > base["anchor"])
            if passing_since < pn.anchor_nights:
                anchor = base["anchor"]
        log_true = math.log(levels[t] / levels[anchor])
        is_red = slower(log_true, pn, rng)
        for _ in range(pn.reruns if is_red else 0):
            is_red = slower(log_true, pn, rng)
            if not is_red:
                break
        runs.append({"i": t, "status": "regression" if is_red else "pass", "anchor": anchor})
        if is_red:
            red.append(t)
    return start, red


def summarize(
    outcomes: Sequence[tuple[str, int | None, list[int]]], nights_judged: int, cells_per_night: int
) -> dict[str, Any]:
    """Per kind: the share caught on its first night and within 3; for A/A, the share of cell-nights
    flagged and the chance that 10 nights of ``cells_per_night`` cells stay green."""
    res: dict[str, Any] = {}
    nulls = [red for kind, _, red in outcomes if kind == "none"]
    if nulls:
        per_night = sum(len(r) for r in nulls) / (len(nulls) * nights_judged)
        res["aa_cell_nights_flagged"] = per_night
        res["aa_10_nights_all_green"] = (1.0 - per_night) ** (10 * cells_per_night)
    for kind in KINDS[1:]:
        rows = [(start, red) for k, start, red in outcomes if k == kind]
        if not rows:
            continue
        caught_first = [start in red for start, red in rows if start is not None]
        delays: list[int | None] = []
        for start, red in rows:
            hits = [t for t in red if start is not None and t >= start]
            delays.append(hits[0] - start + 1 if hits and start is not None else None)
        res[f"{kind}_caught_first_night"] = sum(caught_first) / len(rows)
        res[f"{kind}_caught_within_3"] = sum(1 for d in delays if d is not None and d <= 3) / len(rows)
        found = [d for d in delays if d is not None]
        res[f"{kind}_nights_median"] = float(np.median(found)) if found else None
    return res


def run(pn: PairedNoise, series: int, nights: int, seed: int, cells_per_night: int) -> dict[str, Any]:
    rng = np.random.default_rng(seed)
    outcomes = []
    for kind in KINDS:
        for _ in range(series):
            start, red = replay_series(kind, nights, pn, rng)
            outcomes.append((kind, start, red))
    return summarize(outcomes, nights - 1, cells_per_night)  # the first night is the baseline


TARGETS = [
    ("A/A cell-nights flagged", "aa_cell_nights_flagged", "<= 1%", lambda v: v <= 0.01),
    ("10 A/A nights of the default suite all green", "aa_10_nights_all_green", "expected", None),
    ("3% steps caught on their first night", "step3_caught_first_night", ">= 90%", lambda v: v >= 0.90),
    ("5% steps caught on their first night", "step5_caught_first_night", ">= 99%", lambda v: v >= 0.99),
    ("10% steps caught on their first night", "step10_caught_first_night", "-", None),
    ("2%/night creep caught within 3 nights", "creep2_caught_within_3", ">= 95%", lambda v: v >= 0.95),
    ("nights to catch the creep (median)", "creep2_nights_median", "<= 3", lambda v: v <= 3),
]


def format_table(res: dict[str, Any], pn: PairedNoise) -> str:
    lines = [
        f"paired policy: sd per round {pn.sd_round:.2%}, sd per process pair {pn.sd_proc:.2%}, {pn.rounds} rounds "
        f"(up to {pn.max_rounds}), threshold {pn.threshold:.0%}, anchor {pn.anchor_nights} nights, {pn.reruns} rerun",
        "",
        "| figure | target | paired policy |",
        "| --- | --- | --- |",
    ]
    for label, key, target, ok in TARGETS:
        v = res.get(key)
        if v is None:
            text = "-"
        elif "median" in key:
            text = f"{v:g}"
        else:
            text = f"{v:.1%}"
        if ok is not None and v is not None:
            text += " ok" if ok(v) else " **missed**"
        lines.append(f"| {label} | {target} | {text} |")
    return "\n".join(lines)
