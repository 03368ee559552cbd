"""`optimus-bench replay`: how well the nightly gates catch known changes, on synthetic histories.

Why a benchmark and not a unit test: whether a gate is good is a rate (false alerts per
series, share of steps caught, nights to catch a creep), and rates need hundreds of series
at the machine's real night-to-night noise. This replays the same seeded histories through

* the old gate: the nightly's pairwise comparison alone (``harness.gate.compare``'s latency rule,
  Mann-Whitney U p < alpha and a median change above the threshold, against the last night
  that passed, one rerun that must flag again), an alert on every red night;
* the new policy: change points over the history of night medians (``harness.nightly.changepoints``)
  turned into alerts by ``harness.nightly.alert_policy`` (detector and pairwise gate agree, or the
  change persists).

One history: ``--nights`` nights of one cell; each night's level is the true level times a
log-normal night factor (sd ``--noise``, the night-to-night noise), and the night's timed
steps are ``--samples`` log-normal samples around it (sd 5%, 5% slow outliers: the within-run
noise of ``tests.harness.synthetic``). A rerun is a fresh measurement of the same night: same
night factor, fresh samples. Kinds: ``none`` (no change), ``step5`` / ``step10`` (the level
rises 5% / 10% at a night drawn in the last third but one), ``creep2`` (+2% a night for
five nights, then flat).

Scoring: a step is caught when an alert locates it within ``TOLERANCE`` nights (new policy)
or a night at or after it is red (old gate); the located commit of the old gate is the first
red night. Any other alert is false. ``--noise-from A.json B.json`` measures the noise from
two committed runs of the same grid (robust sd of the per-cell log ratio of medians, over
sqrt(2)); it is an upper bound, the code changed between them.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import math
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from harness.gate.compare import Thresholds, latency_verdict
from harness.nightly.alert_policy import AlertPolicy, Tracker
from harness.nightly.changepoints import DETECTORS, Detector, detect

KINDS = ("none", "step5", "step10", "creep2")
TOLERANCE = 5  # nights: an alert this close to the true change is about it (how close: "located within")
BASE_MS = 5.0


@dataclass(frozen=True)
class Noise:
    night: float = 0.045  # sd of the log night factor (night-to-night noise)
    within: float = 0.05  # sd of the log of one timed step around the night's level
    outliers: float = 0.05  # share of slow steps (another process took the core)
    samples: int = 40  # timed steps per night


def noise_from_results(a: dict[str, Any], b: dict[str, Any]) -> tuple[float, int]:
    """Per-run noise from two runs of the same grid: 1.4826 * MAD of the per-cell log ratio of
    median latencies, over sqrt(2); and how many cells it used."""

    def medians(doc: dict[str, Any]) -> dict[tuple[str, ...], float]:
        return {(c["model"], c["scale"], c["mode"], c["phase"]): c["latency_ms"]["median"]
                for c in doc["cells"] if c["status"] == "ok"}  # fmt: skip

    ma, mb = medians(a), medians(b)
    r = np.array([math.log(mb[k] / ma[k]) for k in ma if k in mb])
    if len(r) < 5:
        raise ValueError(f"noise: the two runs share {len(r)} ok cells; need at least 5")
    mad = 1.4826 * float(np.median(np.abs(r - np.median(r))))
    return mad / math.sqrt(2.0), len(r)


def true_levels(kind: str, nights: int, rng: np.random.Generator) -> tuple[np.ndarray, int | None]:
    """The true level of every night (1.0 = no change) and the first changed night."""
    levels = np.ones(nights)
    if kind == "none":
        return levels, None
    start = int(
        rng.integers(nights // 2, max(nights // 2, nights - 20) + 1)
    )  # >= 20 nights after, when there are
    if kind in ("step5", "step10"):
        levels[start:] = 1.05 if kind == "step5" else 1.10
    elif kind == "creep2":
        for j in range(nights - start):
            levels[start + j] = 1.02 ** min(j + 1, 5)
    else:
        raise ValueError(f"kind: unknown {kind!r}; allowed values: {', '.join(KINDS)}")
    return levels, start


def _samples(level: float, noise: Noise, rng: np.random.Generator) -> list[float]:
    xs = BASE_MS * level * rng.lognormal(0.0, noise.within, size=noise.samples)
    hit = rng.random(noise.samples) < noise.outliers
    xs[hit] *= 1.0 + rng.exponential(0.5, size=int(hit.sum()))
    return [float(x) for x in xs]


def pairwise_gate(night_levels: Sequence[float], noise: Noise, th: Thresholds, reruns: int,
                  rng: np.random.Generator) -> tuple[list[bool], list[float]]:  # fmt: skip
    """The old gate night by night: red flags and each night's stored median."""
    base = _samples(night_levels[0], noise, rng)
    flags, medians = [False], [float(np.median(base))]
    for level in night_levels[1:]:
        new = _samples(level, noise, rng)
        red = latency_verdict(base, new, th)[0] == "regression"
        for _ in range(reruns if red else 0):
            new = _samples(level, noise, rng)  # same night, fresh process: same night factor
            red = latency_verdict(base, new, th)[0] == "regression"
            if not red:
                break
        flags.append(red)
        medians.append(float(np.median(new)))
        if not red:
            base = new  # a red night is never a base
    return flags, medians


@dataclass
class Outcome:
    kind: str
    start: int | None
    old_alerts: list[int] = field(default_factory=list)  # red nights
    new_alerts: list[tuple[int, int, str]] = field(default_factory=list)  # (night, located index, reason)


def replay_series(kind: str, nights: int, noise: Noise, th: Thresholds, reruns: int, detector: Detector,
                  policy: AlertPolicy, rng: np.random.Generator, min_nights: int = 6) -> Outcome:  # fmt: skip
    levels, start = true_levels(kind, nights, rng)
    night_levels = levels * np.exp(rng.normal(0.0, noise.night, size=nights))
    flags, medians = pairwise_gate([float(v) for v in night_levels], noise, th, reruns, rng)
    out = Outcome(kind, start, old_alerts=[t for t, red in enumerate(flags) if red])
    tracker = Tracker(policy)
    for t in range(min_nights, nights):
        for change, why in tracker.night(detect(medians[: t + 1], detector), flags[: t + 1]):
            out.new_alerts.append((t, change.index, why))
    return out


def _score_old(o: Outcome) -> tuple[bool, int | None, int | None, int]:
    """caught, nights to catch, located error, false alerts."""
    if o.start is None:
        return False, None, None, len(o.old_alerts)
    hits = [t for t in o.old_alerts if t >= o.start]
    false = len([t for t in o.old_alerts if t < o.start])
    if not hits:
        return False, None, None, false
    return True, hits[0] - o.start + 1, hits[0] - o.start, false


def _score_new(o: Outcome) -> tuple[bool, int | None, int | None, int]:
    if o.start is None:
        return False, None, None, len(o.new_alerts)
    # A creep has no single first night: its change point may sit anywhere in its five nights.
    last = o.start + (4 if o.kind == "creep2" else 0)
    hits = [
        (t, i) for t, i, _ in o.new_alerts if o.start - TOLERANCE <= i <= last + TOLERANCE and t >= o.start
    ]
    false = len(o.new_alerts) - len(hits)
    if not hits:
        return False, None, None, false
    t, i = hits[0]
    return True, t - o.start + 1, abs(i - o.start), false


def summarize(outcomes: Sequence[Outcome], new: bool) -> dict[str, Any]:
    score = _score_new if new else _score_old
    by_kind: dict[str, list[tuple[bool, int | None, int | None, int]]] = {}
    for o in outcomes:
        by_kind.setdefault(o.kind, []).append(score(o))
    res: dict[str, Any] = {}
    nulls = by_kind.get("none", [])
    if nulls:
        res["false_alert_series"] = sum(f > 0 for *_, f in nulls) / len(nulls)
        res["false_alerts_per_series"] = sum(f for *_, f in nulls) / len(nulls)
    for kind in ("step5", "step10", "creep2"):
        rows = by_kind.get(kind, [])
        if not rows:
            continue
        caught = [r for r in rows if r[0]]
        res[f"{kind}_recall"] = len(caught) / len(rows)
        res[f"{kind}_nights_median"] = float(np.median([r[1] for r in caught])) if caught else None
        if kind == "creep2":
            res["creep2_within_5"] = sum(1 for r in caught if r[1] is not None and r[1] <= 5) / len(rows)
        else:
            for within in (1, 3):
                res[f"{kind}_located_within_{within}"] = (
                    sum(1 for r in caught if r[2] is not None and r[2] <= within) / len(caught)
                    if caught
                    else None
                )
        res[f"{kind}_false_alert_series"] = sum(r[3] > 0 for r in rows) / len(rows)
    return res


TARGETS = [
    ("series with a false alert (no change)", "false_alert_series", "<= 5%", lambda v: v <= 0.05),
    (
        "false alerts per 60-night series (no change; old gate: red nights)",
        "false_alerts_per_series",
        "-",
        None,
    ),
    ("10% steps caught", "step10_recall", ">= 95%", lambda v: v >= 0.95),
    ("5% steps caught", "step5_recall", ">= 80%", lambda v: v >= 0.80),
    ("nights to catch a 10% step (median)", "step10_nights_median", "-", None),
    ("nights to catch a 5% step (median)", "step5_nights_median", "-", None),
    ("2%/night creep caught within 5 nights", "creep2_within_5", "all (>= 95%)", lambda v: v >= 0.95),
    ("nights to catch the creep (median)", "creep2_nights_median", "<= 5", lambda v: v <= 5),
    ("10% steps located within 1 night", "step10_located_within_1", ">= 90%", lambda v: v >= 0.90),
    ("5% steps located within 1 night", "step5_located_within_1", ">= 90%", lambda v: v >= 0.90),
    ("10% / 5% steps located within 3 nights", "_within_3", "-", None),
    ("step/creep series with a false alert", "_step_false", "-", None),
]


def _fmt(key: str, v: Any) -> str:
    if v is None:
        return "-"
    if "nights" in key and "per_series" not in key:
        return f"{v:g}"
    if "per_series" in key:
        return f"{v:.2f}"
    return f"{v * 100:.1f}%"


def format_table(old: dict[str, Any], new: dict[str, Any], new_name: str) -> str:
    lines = [
        f"| figure | target | old gate (pairwise only) | new policy ({new_name}) |",
        "| --- | --- | --- | --- |",
    ]
    for label, key, target, ok in TARGETS:
        if key == "_within_3":
            vals = [
                "/".join(_fmt("x", d.get(f"{k}_located_within_3")) for k in ("step10", "step5"))
                for d in (old, new)
            ]
            lines.append(f"| {label} | {target} | {vals[0]} | {vals[1]} |")
            continue
        if key == "_step_false":
            vals = []
            for d in (old, new):
                parts = [d.get(f"{k}_false_alert_series") for k in ("step5", "step10", "creep2")]
                vals.append("/".join(_fmt("x", p) for p in parts))
            lines.append(f"| {label} (5%/10%/creep) | {target} | {vals[0]} | {vals[1]} |")
            continue
        cells = []
        for d in (old, new):
            v = d.get(key)
            mark = "" if ok is None or v is None else (" ok" if ok(v) else " **missed**")
            cells.append(_fmt(key, v) + mark)
        lines.append(f"| {label} | {target} | {cells[0]} | {cells[1]} |")
    return "\n".join(lines)


def write_demo_history(path: str, nights: int = 40, step_at: int = 26, step: float = 0.10, seed: int = 0,
                       noise: Noise | None = None) -> None:  # fmt: skip
    """A synthetic nightly history (``harness.store.history_store``) to look at: towers latency steps up
    ``step`` at night ``step_at`` (1-based), dlrm stays flat; night-to-night noise as the replay.
    The machine is named ``synthetic`` so it never joins a real series."""
    import hashlib

    from harness.measure import timing
    from harness.store import history_store
    from harness.store.results import new_results

    noise, rng, th = noise or Noise(), np.random.default_rng(seed), Thresholds()
    base: dict[str, list[float]] = {}
    for night in range(1, nights + 1):
        sha = hashlib.sha1(f"demo-{seed}-{night}".encode()).hexdigest()
        env = {"git": {"sha": sha, "dirty": False, "branch": "main"}, "cpu": "synthetic", "cpu_count": 2,
               "device": "cpu", "gpu": None, "python": "3.11", "versions": {"torch": "synthetic"}}  # fmt: skip
        doc = new_results(env, {"scale": "tiny"})
        flagged = []
        for model, level in (("towers", 1.0 + (step if night >= step_at else 0.0)), ("dlrm", 1.0)):
            samples = _samples(level * math.exp(rng.normal(0.0, noise.night)), noise, rng)
            label = f"{model}/tiny/compile/infer"
            red = label in base and latency_verdict(base[label], samples, th)[0] == "regression"
            if red:
                flagged.append([label, "latency_ms"])
            else:
                base[label] = samples
            doc["cells"].append({"model": model, "scale": "tiny", "mode": "compile", "phase": "infer", "status": "ok",
                                 "error": None, "latency_ms": timing.summarize(samples), "peak_mem_bytes": None,
                                 "compile_s": None, "optimus_s": None, "nodes_before": None, "nodes_after": None,
                                 "max_abs_err": 0.0})  # fmt: skip
        meta = {
            "sha": sha,
            "date": f"night {night}",
            "status": "flagged" if flagged else "pass",
            "flagged": flagged,
        }
        history_store.append(path, doc, meta)


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--series", type=int, default=200, help="histories per kind (default 200)")
    p.add_argument("--nights", type=int, default=60, help="nights per history (default 60)")
    p.add_argument(
        "--noise", type=float, default=0.045, help="night-to-night noise, sd of the log (default 0.045)"
    )
    p.add_argument("--noise-from", nargs="+", metavar="FILE",
                   help="measure the noise from two results files of the same grid (A.json B.json) instead; or, "
                        "one paired noise study (python -m harness.nightly.noise_study): also replay the paired policy at its noise")  # fmt: skip
    p.add_argument(
        "--config", help="nightly config whose 'alert' section is replayed (default: the repository's)"
    )
    p.add_argument("--detector", help=f"override: one of {', '.join(DETECTORS)}")
    p.add_argument("--max-pvalue", type=float, help="override: the detector's significance level")
    p.add_argument("--persist-nights", type=int, help="override alert.persist_nights")
    p.add_argument("--agree-nights", type=int, help="override alert.agree_nights")
    p.add_argument("--min-change", type=float, help="override alert.min_change")
    p.add_argument("--reruns", type=int, default=1, help="reruns of a red night, as the nightly (default 1)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--out", help="also write the figures as JSON here")
    p.add_argument("--demo-history", metavar="FILE.jsonl",
                   help="instead: write a synthetic 40-night history with a 10%% step at night 26 (for `changes`)")  # fmt: skip


def _paired_policy(path: str, args: argparse.Namespace) -> tuple[str, dict[str, Any]]:
    """The paired policy replayed at the paired noise of a study file (``paired_replay``)."""
    from harness.nightly import paired_replay
    from harness.nightly.job import DEFAULT_CONFIG, load_config

    try:
        with open(path, encoding="utf-8") as f:
            study = json.load(f)
    except (OSError, json.JSONDecodeError) as e:
        raise ValueError(f"--noise-from {path}: cannot read the study ({e})") from None
    if not isinstance(study, dict) or study.get("kind") != "optimus-bench-paired-noise":
        raise ValueError(
            f"--noise-from {path}: not a paired noise study (python -m harness.nightly.noise_study)"
        )
    cfg = load_config(args.config or DEFAULT_CONFIG)
    pn = paired_replay.PairedNoise.from_study(study["summary"], cfg.paired.threshold)
    pn = dataclasses.replace(pn, anchor_nights=cfg.paired.anchor_nights, reruns=args.reruns)
    cells = len(study["config"]["cells"])
    res = paired_replay.run(pn, args.series, args.nights, args.seed, cells)
    return paired_replay.format_table(res, pn), {"noise": dataclasses.asdict(pn), **res}


def main_from_args(args: argparse.Namespace) -> int:
    from harness import exit_codes
    from harness.outputs import check_output_file
    from harness.store import results

    if args.demo_history:
        check_output_file(args.demo_history, "--demo-history")
        if Path(args.demo_history).exists():
            raise ValueError(
                f"--demo-history {args.demo_history}: exists; the demo appends to a new file only"
            )
        write_demo_history(args.demo_history, seed=args.seed, noise=Noise(night=args.noise))
        print(f"wrote {args.demo_history}")
        return exit_codes.OK
    if args.out:
        check_output_file(args.out)
    if args.series < 1 or args.nights < 30:
        raise ValueError(f"--series must be >= 1 and --nights >= 30, got {args.series} and {args.nights}")
    from harness.nightly.job import DEFAULT_CONFIG, load_config

    cfg = load_config(args.config or DEFAULT_CONFIG).changes
    if args.detector is not None and args.detector not in DETECTORS:
        raise ValueError(f"--detector: unknown {args.detector!r}; allowed values: {', '.join(DETECTORS)}")
    if args.max_pvalue is not None and not (math.isfinite(args.max_pvalue) and 0 < args.max_pvalue < 1):
        raise ValueError(f"--max-pvalue: must be in (0, 1), got {args.max_pvalue}")
    if args.detector is not None or args.max_pvalue is not None:
        p = (
            args.max_pvalue
            if args.max_pvalue is not None
            else (0.01 if args.detector == "e-divisive" else cfg.max_pvalue)
        )
        cfg = dataclasses.replace(cfg, detector=args.detector or cfg.detector, max_pvalue=p)
    overrides = {
        k: getattr(args, k)
        for k in ("persist_nights", "agree_nights", "min_change")
        if getattr(args, k) is not None
    }
    policy = dataclasses.replace(cfg.policy, **overrides).validate()
    night, source = args.noise, "--noise"
    paired_text, paired_res = "", None
    if args.noise_from and len(args.noise_from) == 1:
        paired_text, paired_res = _paired_policy(args.noise_from[0], args)
    elif args.noise_from and len(args.noise_from) != 2:
        raise ValueError(f"--noise-from: one study file or two results files, got {len(args.noise_from)}")
    elif args.noise_from:
        night, n_cells = noise_from_results(
            results.load(args.noise_from[0]), results.load(args.noise_from[1])
        )
        source = f"measured from {args.noise_from[0]} and {args.noise_from[1]} ({n_cells} cells)"
    if not (math.isfinite(night) and 0 < night < 1):
        raise ValueError(f"--noise: must be in (0, 1), got {night}")
    detector = cfg.make_detector()
    noise, th = Noise(night=night), Thresholds()
    rng = np.random.default_rng(args.seed)
    t0 = time.perf_counter()
    outcomes = [
        replay_series(kind, args.nights, noise, th, args.reruns, detector, policy, rng)
        for kind in KINDS
        for _ in range(args.series)
    ]
    elapsed = time.perf_counter() - t0
    old, new = summarize(outcomes, new=False), summarize(outcomes, new=True)
    print(f"replay: {args.series} histories x {len(KINDS)} kinds ({', '.join(KINDS)}), {args.nights} nights each, "
          f"night-to-night noise {night:.2%} ({source}), seed {args.seed}; detector {detector}; {policy}; "
          f"{elapsed:.0f} s")  # fmt: skip
    print()
    print(format_table(old, new, detector.name))
    if paired_text:
        print()
        print(paired_text)
    if args.out:
        doc = {"args": {k: v for k, v in vars(args).items() if k != "func"}, "noise": night,
               "detector": repr(detector), "policy": repr(policy), "old": old, "new": new, "elapsed_s": elapsed,
               "paired": paired_res}  # fmt: skip
        results.write_atomic(args.out, json.dumps(doc, indent=1) + "\n")
    return exit_codes.OK
