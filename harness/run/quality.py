"""One training-quality cell (``optimus-bench run --quality STEPS``), in the cell's own process.

Why the mode and eager train side by side in one process: the question is whether the mode's
model ends where eager's does, so both must see the same weights, the same batches in the same
order and the same optimizer, and the drift between their parameters can only be read with both
in memory. For each seed the provider builds the model (its weights and its learnable task: the
first STEPS batches train, the next ``heldout`` batches are the held-out set), that build is the
eager copy, and its weights are copied into the one model the mode prepared (prepared once, so a
compiled mode compiles once per cell, not once per seed). Both take STEPS optimizer steps, each
with its own SGD over its own parameters (the mode's step is the cell's step, ``step_fn``), then
both are scored on the held-out set. ``harness.measure.quality`` judges the seeds.

The cell also checks the mode's first step against eager's (outputs within the run's
``atol/rtol``), so a mode that did not pick up a seed's weights is a ``mismatch``, not a quality
figure, and its latency is the mode's training steps (the first call, which compiles, left out).
"""

from __future__ import annotations

import inspect
import time
from collections.abc import Callable
from typing import Any

from harness.measure import quality, timing
from harness.modes import builtin, mode_registry
from harness.run import cell as cellmod
from harness.spec import load_provider

Prepare = Callable[[Any, tuple[Any, ...]], Any]  # (dense, example inputs) -> builtin.Prepared


def build_task(provider: str, model: str, scale: str, device: str, seed: int, num_batches: int) -> Any:
    """The provider's model for ``seed`` with ``num_batches`` batches of its task."""
    builder = load_provider(provider)
    kwargs: dict[str, Any] = {"overrides": {"num_batches": num_batches}}
    if "count_nodes" in inspect.signature(builder).parameters:
        kwargs["count_nodes"] = False
    return builder(model, scale=scale, device=device, seed=seed, **kwargs)


def _load_weights(targets: dict[str, Any], source: Any) -> None:
    """Copy ``source``'s parameters and buffers into the tensors of ``targets`` in place (the
    objects the prepared mode computes with: a compiled module and Optimus's re-laid-out views
    keep using them)."""
    import torch

    with torch.no_grad():
        for name, t in [*source.named_parameters(), *source.named_buffers()]:
            if name in targets:
                targets[name].copy_(t)


def heldout_logits(module: Any, batches: list[Any]) -> tuple[Any, Any]:
    """(logits, labels) of ``module`` over ``batches``, scored with the forward it trained with:
    train mode, grad enabled, the autograd graph dropped with each batch. Why not eval mode under
    ``no_grad``: it is another graph for a compiled mode (one more compile per cell), and
    switching compile+optimus to eval re-captures the Optimus module, which
    ``torch.compile(fullgraph=True)`` cannot trace (it stops with Optimus's reason; found by the
    first quality run). The families have no dropout or batch norm, so both forwards compute the
    same; a provider's model with dropout would be scored with it on. A sharded rank calls it
    with its share of the held-out batches and gathers both (``harness.run.sharded.quality_rank``)."""
    import torch

    with torch.enable_grad():
        logits = torch.cat([module(*batch.inputs).detach().float() for batch in batches])
    return logits, torch.cat([batch.labels for batch in batches])


def heldout_scores(logits: Any, labels: Any) -> tuple[list[float | None], float]:
    """(AUC per task, logloss) of held-out logits."""
    return quality.auc_per_task(logits, labels), quality.logloss(logits, labels)


def params(module: Any) -> dict[str, Any]:
    """Parameters by name, compile's wrapper prefix stripped (names match eager's)."""
    return {cellmod._param_name(n): p for n, p in module.named_parameters()}


def train_seed(
    b: Any,
    seed: int,
    module: Any,
    targets: dict[str, Any],
    steps: int,
    heldout: int,
    lr: float,
    every: int,
    sync: Callable[[], None],
    check_first: Callable[[Any, Any], str | None],
) -> tuple[quality.SeedFigures | None, list[float], str | None]:
    """Train the prepared ``module`` (weights loaded from ``b``) and ``b.module`` (eager) for
    ``steps`` steps; return the seed's figures, the mode's step times (ms) and a first-step
    mismatch (then no figures)."""
    import torch

    batches = list(b.batches)
    if len(batches) < steps + heldout:
        raise RuntimeError(
            f"the provider built {len(batches)} batches; the quality run needs {steps} to train and "
            f"{heldout} held out (it asks for num_batches={steps + heldout})"
        )
    train, held = batches[:steps], batches[steps : steps + heldout]
    eager = b.module
    _load_weights(targets, eager)
    start = {n: p.detach().clone() for n, p in params(eager).items()}
    start_tasks, _ = heldout_scores(*heldout_logits(eager, held))  # untrained: how far training lifts AUC
    module.train()
    eager.train()
    forward = cellmod.forward_fn(b, True)
    step_mode = cellmod.step_fn(module, train, torch.optim.SGD(module.parameters(), lr=lr), forward)
    step_eager = cellmod.step_fn(eager, train, torch.optim.SGD(eager.parameters(), lr=lr), forward)
    losses: list[float] = []
    eager_losses: list[float] = []
    times: list[float] = []
    for i, batch in enumerate(train):
        t0 = time.perf_counter()
        out = step_mode()
        sync()
        times.append((time.perf_counter() - t0) * 1e3)
        ref = step_eager()
        if i == 0:
            problem = check_first(out, ref)
            if problem:
                return None, times, problem
        with torch.no_grad():
            losses.append(float(b.loss(out.detach().float(), batch.labels)))
            eager_losses.append(float(b.loss(ref.detach().float(), batch.labels)))
    auc_tasks, ll = heldout_scores(*heldout_logits(module, held))
    eager_tasks, eager_ll = heldout_scores(*heldout_logits(eager, held))
    mode_params = {n: targets[n] for n in start if n in targets}
    drift = quality.parameter_drift(mode_params, params(eager), start)
    figures = quality.SeedFigures(
        seed=seed,
        auc=quality.mean_auc(auc_tasks),
        logloss=ll,
        eager_auc=quality.mean_auc(eager_tasks),
        eager_logloss=eager_ll,
        eager_auc_start=quality.mean_auc(start_tasks),
        drift=drift["drift"],
        drift_rel=drift["drift_rel"],
        drift_param=drift["drift_param"],
        auc_per_task=auc_tasks,
        curve=quality.loss_curve(losses, every),
        eager_curve=quality.loss_curve(eager_losses, every),
    )
    return figures, times, None


def record_verdict(
    cell: dict[str, Any],
    figures: list[quality.SeedFigures],
    cfg: dict[str, Any],
    against: str,
    drift_rtol: float | None = quality.DRIFT_RTOL,
) -> None:
    """The cell's ``quality`` (the run's settings and ``quality.judge``'s summary), its status and,
    for a mismatch, its one-line error naming every reason; ``against``: what the mode trained beside.
    The single-process and the sharded quality cell both end here."""
    summary = quality.judge(figures, drift_rtol=drift_rtol)
    cell["quality"] = {"steps": int(cfg["quality_steps"]), "heldout_batches": int(cfg["quality_heldout"]),
                       "every": int(cfg["quality_every"]), "lr": float(cfg["quality_lr"]), "optimizer": "SGD",
                       **summary}  # fmt: skip
    cell["status"] = summary["verdict"]
    if summary["reasons"]:
        cell["error"] = f"quality differs from {against}: " + "; ".join(summary["reasons"])


def run_quality_cell(spec: dict[str, Any], prepare: Prepare | None = None) -> dict[str, Any]:
    """The quality cell of ``spec`` (the runner starts this module instead of ``harness.run.cell``
    when the run's config has ``quality_steps``). ``prepare``: the mode's preparation (default: the mode registry's; a test
    passes one that injects an error)."""
    key, cfg, cell, device = cellmod.begin(spec)
    import torch

    steps, heldout = int(cfg["quality_steps"]), int(cfg["quality_heldout"])
    every, lr = int(cfg["quality_every"]), float(cfg["quality_lr"])
    seeds = [int(cfg["seed"]) + i for i in range(int(cfg["quality_seeds"]))]
    atol, rtol = float(cfg["atol"]), float(cfg["rtol"])
    sync: Callable[[], None] = torch.cuda.synchronize if device == "cuda" else (lambda: None)

    def build(seed: int) -> Any:
        return build_task(cfg["provider"], key.model, key.scale, device, seed, steps + heldout)

    t_build = time.perf_counter()
    host = build(seeds[0])  # the model the mode prepares once; every seed's weights are copied in
    cell["build_s"] = time.perf_counter() - t_build
    meta = dict(getattr(host, "meta", {}) or {})
    cell["meta"] = {
        k: v for k, v in meta.items() if isinstance(v, int | float | str) and not isinstance(v, bool)
    }
    module = host.module
    module.train()
    targets = {**dict(module.named_parameters()), **dict(module.named_buffers())}
    example = cellmod.example_inputs(host, list(host.batches))
    prepared = (prepare or (lambda d, e: mode_registry.prepare(key.mode, d, e, beside=module)))(
        module.dense, example
    )
    module.dense = prepared.module
    cell.update({k: v for k, v in prepared.info.items() if v is not None})
    cell["prepare_s"] = prepared.prepare_s

    def check_first(out: Any, ref: Any) -> str | None:
        cell["max_abs_err"] = cellmod.max_err(ref, out) if ref.shape == out.shape else None
        if cellmod.close(ref, out, atol, rtol):
            return None
        return f"first training step differs from eager: max abs err {cell['max_abs_err']}"

    figures: list[quality.SeedFigures] = []
    samples: list[float] = []
    first_call_ms = None
    for seed in seeds:
        fig, times, problem = train_seed(build(seed), seed, module, targets, steps, heldout, lr, every, sync,
                                         check_first)  # fmt: skip
        if first_call_ms is None:
            first_call_ms, times = times[0], times[1:]
        samples += times
        if problem:
            cell["status"], cell["error"] = "mismatch", f"seed {seed}: {problem}"
            cell["parity"] = {"reference": mode_registry.REFERENCE, "atol": atol, "rtol": rtol}
            if samples:
                cell["latency_ms"] = timing.summarize(samples)
            return cell
        assert fig is not None
        figures.append(fig)
    if prepared.reports:
        cell.update(builtin.merge_reports(prepared.reports))
    cell["parity"] = {"reference": mode_registry.REFERENCE, "atol": atol, "rtol": rtol}
    cell["latency_ms"] = timing.summarize(samples or [first_call_ms or 0.0])
    cell["first_call_s"] = (first_call_ms or 0.0) / 1e3
    cellmod.record_compile_time(
        cell, prepared.prepare_s, cell["first_call_s"], mode_registry.get(key.mode).compiled
    )
    record_verdict(cell, figures, cfg, "eager")
    return cell


def main(argv: list[str] | None = None) -> int:
    """``python -m harness.run.quality SPEC.json OUT.json`` (the runner starts it for a quality run)."""
    return cellmod.serve(argv, run_quality_cell)


if __name__ == "__main__":
    import sys

    sys.exit(main())
