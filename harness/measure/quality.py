"""The figures of a training-quality cell and its verdict: held-out AUC and logloss, the loss
curve, the parameter drift against eager, and whether the mode trains like eager.

Why a quality gate beside parity: parity checks one step (outputs and gradients within
``--atol/--rtol``), so an error below that tolerance passes it, and a few hundred optimizer steps
can turn it into a model that ends somewhere else. A quality cell (``harness.run.quality``)
trains the mode and an eager copy side by side on the same seeded batches and judges where they
end, here:

- **tolerance**, for every seed: the mode's held-out AUC within ``AUC_TOL`` (absolute) of eager's,
  and its held-out logloss within ``LOGLOSS_RTOL`` (relative) of eager's;
- **seed spread**, over the seeds: the mode's mean AUC and mean logloss stay inside the spread
  (max - min) of eager's own figures across seeds, the change that the seed alone makes. A mode
  that moves further than a different seed would is not training like eager;
- **drift**, for every seed: the largest absolute difference of any parameter from eager's after
  training, over the largest distance any eager parameter moved in training, at most
  ``DRIFT_RTOL``. Why this third rule: held-out figures miss errors that do not change the
  ranking. A gradient 1e-3 too large in one group of towers tiny stays inside the AUC and logloss
  tolerance over 60 steps and is caught by its drift alone (tests/harness/run/test_quality_run.py);
  rounding alone (compile, Optimus) drifts about 1e-6 of training's largest move over 300 steps
  (results/quality-tiny/), so ``DRIFT_RTOL`` = 1e-4 leaves it two orders of magnitude.

- **loss curve**, where the cell compares it step by step (a sharded cell, against the
  single-process reference that trains the same global batches): the training loss at every
  step within ``CURVE_RTOL`` (relative) of the reference's. Why only there: the ranks and the
  reference compute the same sums in another order, so their losses agree to rounding, and a
  rank that drifted shows in the loss at once (the ``drift`` fault, ``harness/run/sharded/faults.py``);
  a single-process mode's loss is read through the drift rule instead.

A cell that fails any is ``quality_mismatch`` (``harness.spec.STATUSES``), which ``compare``
counts as lost data.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass, field
from typing import Any

AUC_TOL = 1e-3  # absolute difference of held-out AUC from eager's
LOGLOSS_RTOL = 1e-3  # relative difference of held-out logloss from eager's
DRIFT_RTOL = 1e-4  # largest parameter difference from eager's over the largest distance eager moved one
CURVE_RTOL = 1e-4  # training loss at every step against the reference's, relative (where checked)


def auc_per_task(logits: Any, labels: Any) -> list[float | None]:
    """ROC AUC of every task (column) on the held-out set; None for a task whose labels are all
    one class (AUC is undefined there). torchmetrics' ``binary_auroc`` (a runtime dependency)."""
    from torchmetrics.functional.classification import binary_auroc

    out: list[float | None] = []
    for t in range(labels.shape[1]):
        y = labels[:, t].long()
        positives = int(y.sum())
        if positives in (0, y.numel()):
            out.append(None)
            continue
        out.append(float(binary_auroc(logits[:, t].detach().float(), y)))
    return out


def mean_auc(per_task: Sequence[float | None]) -> float | None:
    """The tasks' mean AUC (macro average: each task counts once, whatever its base rate)."""
    defined = [a for a in per_task if a is not None]
    return sum(defined) / len(defined) if defined else None


def logloss(logits: Any, labels: Any) -> float:
    """Mean binary cross-entropy over samples and tasks: the training loss, on held-out data."""
    import torch.nn.functional as F

    return float(F.binary_cross_entropy_with_logits(logits.detach().double(), labels.double()))


def loss_curve(losses: Sequence[float], every: int) -> list[list[float]]:
    """``[[step, mean loss of the window ending at step], ...]``: the training loss averaged over
    windows of ``every`` steps (a 16-row batch's loss is too noisy to read step by step); the last
    window may be shorter."""
    if every < 1:
        raise ValueError(f"every: must be >= 1, got {every}")
    curve = []
    for start in range(0, len(losses), every):
        window = losses[start : start + every]
        curve.append([float(start + len(window)), sum(window) / len(window)])
    return curve


def parameter_drift(
    mode: Mapping[str, Any], eager: Mapping[str, Any], eager_start: Mapping[str, Any]
) -> dict[str, Any]:
    """Largest absolute difference of any parameter of ``mode`` from the same-named one of
    ``eager`` after training, which parameter it is, and that over the largest distance any
    eager parameter moved from ``eager_start`` (so a drift reads against how far training went)."""
    worst, where = 0.0, None
    for name, p in eager.items():
        q = mode.get(name)
        if q is None or q.shape != p.shape or p.numel() == 0:
            continue
        d = float((q.detach().double() - p.detach().double()).abs().max())
        if d > worst or where is None:
            worst, where = d, name
    moved = max(
        (float((p.detach().double() - eager_start[n].double()).abs().max()) for n, p in eager.items()
         if n in eager_start and p.numel()),
        default=0.0,
    )  # fmt: skip
    return {
        "drift": worst,
        "drift_param": where,
        "moved": moved,
        "drift_rel": worst / moved if moved else None,
    }


def loss_check(
    losses: Sequence[float], reference: Sequence[float], rtol: float = CURVE_RTOL
) -> dict[str, Any]:
    """The training loss step by step against the reference's: the largest relative difference,
    its step (1-based), and the first step past ``rtol`` (None when every step is within)."""
    if len(losses) != len(reference):
        raise ValueError(f"losses: {len(losses)} steps against {len(reference)} of the reference")
    worst, at, first_off = 0.0, None, None
    for i, (a, r) in enumerate(zip(losses, reference, strict=True), start=1):
        rel = abs(a - r) / max(abs(r), 1e-12) if math.isfinite(a) else math.inf
        if rel > worst or at is None:
            worst, at = rel, i
        if rel > rtol and first_off is None:
            first_off = {"step": i, "loss": a, "reference": r, "rel_diff": rel}
    return {"rtol": rtol, "max_rel_diff": worst, "at_step": at, "first_off": first_off}


@dataclass
class SeedFigures:
    """One seed of a quality cell: the mode and its eager copy, trained on the same batches."""

    seed: int
    auc: float | None
    logloss: float
    eager_auc: float | None
    eager_logloss: float
    eager_auc_start: float | None  # eager's held-out AUC before training (how far training lifted it)
    drift: float
    drift_rel: float | None
    drift_param: str | None
    auc_per_task: list[float | None] = field(default_factory=list)
    curve: list[list[float]] = field(default_factory=list)
    eager_curve: list[list[float]] = field(default_factory=list)
    loss_check: dict[str, Any] | None = None  # ``loss_check``'s figures, where the cell compares steps

    @property
    def auc_diff(self) -> float | None:
        if self.auc is None or self.eager_auc is None:
            return None
        return abs(self.auc - self.eager_auc)

    @property
    def logloss_rel_diff(self) -> float:
        return abs(self.logloss - self.eager_logloss) / max(abs(self.eager_logloss), 1e-12)

    def as_dict(self) -> dict[str, Any]:
        return {**asdict(self), "auc_diff": self.auc_diff, "logloss_rel_diff": self.logloss_rel_diff}


def _mean(xs: Sequence[float]) -> float:
    return sum(xs) / len(xs)


def _spread(xs: Sequence[float]) -> float | None:
    return max(xs) - min(xs) if len(xs) > 1 else None


def judge(
    seeds: Sequence[SeedFigures],
    auc_tol: float = AUC_TOL,
    logloss_rtol: float = LOGLOSS_RTOL,
    drift_rtol: float | None = DRIFT_RTOL,
) -> dict[str, Any]:
    """The cell's ``quality`` summary: means over seeds, the worst difference from eager, eager's
    seed-to-seed spread, the largest drift, and ``verdict`` (``ok`` or ``quality_mismatch``) with
    the ``reasons`` a mismatch has (see the module docstring for the two rules)."""
    if not seeds:
        raise ValueError("seeds: empty; a quality verdict needs at least one trained seed")
    reasons: list[str] = []
    for s in seeds:
        if s.auc is None or s.eager_auc is None:
            reasons.append(f"seed {s.seed}: held-out AUC undefined (mode {s.auc}, eager {s.eager_auc})")
        elif s.auc_diff is not None and s.auc_diff > auc_tol:
            reasons.append(
                f"seed {s.seed}: AUC {s.auc:.5f} vs eager {s.eager_auc:.5f} (|diff| {s.auc_diff:.2e} > {auc_tol:g})"
            )
        if not math.isfinite(s.logloss) or s.logloss_rel_diff > logloss_rtol:
            reasons.append(f"seed {s.seed}: logloss {s.logloss:.5f} vs eager {s.eager_logloss:.5f} "
                           f"(relative diff {s.logloss_rel_diff:.2e} > {logloss_rtol:g})")  # fmt: skip
    within_tolerance = not reasons
    checks = [(s.seed, s.loss_check) for s in seeds if s.loss_check]
    off = [(seed, c["first_off"], c["rtol"]) for seed, c in checks if c["first_off"]]
    # the loss curve's first: it names the step where training left the reference
    reasons[:0] = [f"seed {seed}: training loss at step {o['step']} is {o['loss']:.7g} vs the reference's "
                   f"{o['reference']:.7g} (relative diff {o['rel_diff']:.2e} > {rtol:g})" for seed, o, rtol in off]  # fmt: skip
    # drift_rtol None: the drift is recorded, not judged (a sharded cell, harness/run/sharded/quality_rank.py)
    drifted = [
        s for s in seeds if drift_rtol is not None and s.drift_rel is not None and s.drift_rel > drift_rtol
    ]
    reasons += [f"seed {s.seed}: parameter drift {s.drift:.2e} in {s.drift_param} is {s.drift_rel:.2e} of "
                f"eager's largest move (> {drift_rtol:g})" for s in drifted]  # fmt: skip
    aucs = [s.auc for s in seeds if s.auc is not None]
    eager_aucs = [s.eager_auc for s in seeds if s.eager_auc is not None]
    lls, eager_lls = [s.logloss for s in seeds], [s.eager_logloss for s in seeds]
    spread_auc, spread_ll = _spread(eager_aucs), _spread(eager_lls)
    within_spread: bool | None = None
    if spread_ll is not None and len(aucs) == len(eager_aucs) == len(seeds):
        auc_off = abs(_mean(aucs) - _mean(eager_aucs))
        ll_off = abs(_mean(lls) - _mean(eager_lls))
        within_spread = auc_off <= (spread_auc or 0.0) and ll_off <= spread_ll
        if not within_spread:
            reasons.append(f"mean over seeds left eager's seed-to-seed spread: AUC off by {auc_off:.2e} "
                           f"(spread {spread_auc:.2e}), logloss off by {ll_off:.2e} (spread {spread_ll:.2e})")  # fmt: skip
    starts = [s.eager_auc_start for s in seeds if s.eager_auc_start is not None]
    auc_diffs = [s.auc_diff for s in seeds if s.auc_diff is not None]
    rels = [s.drift_rel for s in seeds if s.drift_rel is not None]
    curve: dict[str, Any] = {}
    if checks:
        curve = {"curve_rtol": checks[0][1]["rtol"], "within_curve": not off,
                 "loss_rel_diff": max(c["max_rel_diff"] for _, c in checks)}  # fmt: skip
    return {
        "verdict": "quality_mismatch" if reasons else "ok",
        **curve,
        "reasons": reasons,
        "auc_tol": auc_tol,
        "logloss_rtol": logloss_rtol,
        "drift_rtol": drift_rtol,
        "auc": _mean(aucs) if aucs else None,
        "eager_auc": _mean(eager_aucs) if eager_aucs else None,
        "eager_auc_start": _mean(starts) if starts else None,
        "logloss": _mean(lls),
        "eager_logloss": _mean(eager_lls),
        "auc_diff": max(auc_diffs) if auc_diffs else None,
        "logloss_rel_diff": max(s.logloss_rel_diff for s in seeds),
        "spread_auc": spread_auc,
        "spread_logloss": spread_ll,
        "within_tolerance": within_tolerance,
        "within_drift": not drifted if drift_rtol is not None else None,
        "within_spread": within_spread,
        "drift": max(s.drift for s in seeds),
        "drift_rel": max(rels) if rels else None,
        "seeds": [s.as_dict() for s in seeds],
    }
