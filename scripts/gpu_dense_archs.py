"""One-shot GPU check of the real dense archs: each model family's ``b.module.dense`` on CUDA.

WHY: ``scripts/gpu_check.py`` measures Optimus on a synthetic tower model; the benchmark's real
subjects are the dense archs of ``models/`` (towers, mmoe, dcn, dlrm). The borrowed GPU machine
(one H200, torch + triton) has NO torchrec and NO fbgemm_gpu, so ``import models`` fails there
(``models/sparse.py``, ``models/data.py`` and ``models/types.py`` do ``from torchrec import ...``).
The dense archs themselves are plain torch, so this script:

1. installs a stub ``torchrec`` module (placeholder classes that raise a clear RuntimeError when
   used) if ``importlib.util.find_spec("torchrec") is None`` (or ``--force-stub``), then imports
   ``models``; ``stub.used`` in the JSON says which happened;
2. builds the dense arch the way ``models.builder.build`` does, minus the EBC and the batches:
   ``cfg = presets.resolve(family, scale)``, ``lay = sparse.layout(cfg)``, then under a forked RNG
   seeded with ``--seed`` and ``with torch.device(dev)``, ``registry.family(family).build_dense(cfg,
   lay)``. Parameter shapes equal those of ``models.build(family, scale).module.dense``; the values
   do not (``models.build`` builds the EBC first, which draws from the same seeded RNG);
3. feeds it seeded inputs ``dense_features = randn(B, num_dense_features)`` and ``pooled =
   randn(B, num_features * embedding_dim)`` (B = the preset's batch size; pooled does not require
   grad, as in ``Built.dense_inputs``);
4. measures it with ``scripts/gpu_check.py``'s machinery (imported, not copied): modes eager,
   eager+optimus, compile, compile+peer, compile+optimus; phases infer and train (loss
   ``dense(*inputs).square().mean()``, SGD); interleaved CUDA-synchronized rounds; parity against
   eager; compile seconds; one step's peak memory; Optimus's nodes before/after and rules fired.
   The settings are gpu_check's (TF32 off, FX graph cache off, a Dynamo reset per group, one entry
   code object per compiled mode); see its docstring.

Order of work, most valuable first: towers and mmoe over the scales (``medium`` then ``large`` by
default), then dcn and dlrm over the scales if asked for; per (family, scale) infer then train.
Everything obeys ``--budget-s`` (what is left is recorded as ``"skipped: budget"``) and the JSON is
rewritten atomically after every measurement, so a kill loses nothing that was finished.

    python3 scripts/gpu_dense_archs.py --out $OUT/gpu_dense_archs.json
    PYTHONPATH=. python scripts/gpu_dense_archs.py --device cpu --families towers --scales tiny \\
        --rounds 3 --iters 3 --threads 1 --out /tmp/gda.json [--force-stub]   # dry run
"""

from __future__ import annotations

import argparse
import importlib
import importlib.machinery
import importlib.util
import os
import sys
import time
import types
from dataclasses import dataclass
from typing import Any, NoReturn

import torch
from torch import nn

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))

import gpu_check

FAMILIES = ("towers", "mmoe", "dcn", "dlrm")  # models.registry.FAMILIES, in priority order
PRIORITY_FAMILIES = ("towers", "mmoe")  # over every scale before the other families
SCALES = ("tiny", "small", "medium", "large", "xl", "medium-hetero")  # models.presets.SCALES
TORCHREC_NAMES = ("KeyedJaggedTensor", "EmbeddingBagCollection", "EmbeddingBagConfig", "PoolingType")
STUB_MARK = "__gpu_dense_archs_stub__"


# ----------------------------------------------------------------------------- the torchrec stub


def _stub_error(name: str, what: str) -> NoReturn:
    raise RuntimeError(
        f"torchrec.{name}{what}: torchrec is not installed here; this is the placeholder that "
        "scripts/gpu_dense_archs.py installs so that `import models` works for the dense archs only"
    )


class _StubMeta(type):
    """Metaclass of the placeholders: instantiating one, or reading an attribute of it that it does
    not define (``PoolingType.SUM``), raises RuntimeError."""

    def __call__(cls, *args: Any, **kwargs: Any) -> NoReturn:
        _stub_error(cls.__name__, "(...)")

    def __getattr__(cls, attr: str) -> NoReturn:
        if attr.startswith("__"):
            raise AttributeError(attr)
        _stub_error(cls.__name__, f".{attr}")


def make_torchrec_stub() -> types.ModuleType:
    """A ``torchrec`` module whose only contents are placeholder classes for ``TORCHREC_NAMES``
    (every name ``models/`` imports from torchrec)."""
    stub = types.ModuleType("torchrec", "placeholder installed by scripts/gpu_dense_archs.py")
    stub.__spec__ = importlib.machinery.ModuleSpec("torchrec", None)
    setattr(stub, STUB_MARK, True)
    for name in TORCHREC_NAMES:
        setattr(stub, name, _StubMeta(name, (), {"__module__": "torchrec", "__qualname__": name}))
    return stub


def load_models(force_stub: bool = False) -> tuple[types.ModuleType, dict[str, Any]]:
    """Import ``models`` (with the torchrec stub first if torchrec is missing or ``force_stub``);
    returns it and what was done, for the JSON."""
    missing = importlib.util.find_spec("torchrec") is None
    use_stub = missing or force_stub
    if use_stub and not getattr(sys.modules.get("torchrec"), STUB_MARK, False):
        if "models" in sys.modules or sys.modules.get("torchrec") is not None:
            raise RuntimeError("--force-stub: models or torchrec is already imported in this process")
        sys.modules["torchrec"] = make_torchrec_stub()
    models = importlib.import_module("models")
    for sub in ("presets", "sparse", "registry"):
        importlib.import_module(f"models.{sub}")
    if set(models.FAMILIES) != set(FAMILIES):
        raise RuntimeError(f"models.FAMILIES {models.FAMILIES} != this script's {FAMILIES}")
    if tuple(models.SCALES) != SCALES:
        raise RuntimeError(f"models.SCALES {models.SCALES} != this script's {SCALES}")
    info = {
        "used": use_stub,
        "torchrec_missing": missing,
        "forced": force_stub,
        "names": list(TORCHREC_NAMES),
    }
    return models, info


# ----------------------------------------------------------------------------- the dense archs


@dataclass(frozen=True)
class DenseConfig:
    """One (family, scale) group; ``name`` keys its cells."""

    family: str
    scale: str

    @property
    def name(self) -> str:
        return f"{self.family}/{self.scale}"


def work_order(families: list[str], scales: list[str]) -> list[DenseConfig]:
    """Priority families (towers, mmoe) over every scale, then the others over every scale."""
    tiers = (
        [f for f in families if f in PRIORITY_FAMILIES],
        [f for f in families if f not in PRIORITY_FAMILIES],
    )
    return [DenseConfig(f, s) for tier in tiers for s in scales for f in tier]


def build_dense_arch(
    models: types.ModuleType, family: str, scale: str, device: torch.device, seed: int = 0
) -> tuple[nn.Module, tuple[torch.Tensor, torch.Tensor], dict[str, Any]]:
    """The dense arch as ``models.build`` makes it (no EBC, no batches), its seeded inputs
    ``(dense_features, pooled)`` on ``device``, and a few facts about it."""
    cfg = models.presets.resolve(family, scale, None)
    lay = models.sparse.layout(cfg)
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        with device:
            dense: nn.Module = models.registry.family(family).build_dense(cfg, lay)
    batch = int(cfg["batch_size"])
    gen = torch.Generator().manual_seed(seed + 1)
    dense_features = torch.randn(batch, int(cfg["num_dense_features"]), generator=gen).to(device)
    pooled = torch.randn(batch, lay.pooled_dim, generator=gen).to(device)
    facts = {
        "family": family,
        "scale": scale,
        "seed": seed,
        "batch_size": batch,
        "num_tasks": int(cfg["num_tasks"]),
        "num_features": lay.num_features,
        "num_dense_features": int(cfg["num_dense_features"]),
        "embedding_dim": lay.embedding_dim,
        "pooled_dim": lay.pooled_dim,
        "dense_params": sum(p.numel() for p in dense.parameters()),
        "input_shapes": [list(dense_features.shape), list(pooled.shape)],
        "config": cfg,
    }
    return dense, (dense_features, pooled), facts


class DenseRun(gpu_check.Run):
    """gpu_check's run state; cells also carry ``family`` and ``scale``."""

    def cell(self, cfg: gpu_check.GroupConfig, phase: str, mode: str) -> dict[str, Any]:
        c = super().cell(cfg, phase, mode)
        if "family" not in c:
            c["family"], c["scale"] = getattr(cfg, "family", None), getattr(cfg, "scale", None)
        return c


def base_maker(run: DenseRun, models: types.ModuleType, seed: int) -> gpu_check.MakeBase:
    """``Run.make_base`` for the dense archs: builds on the device (like ``models.build``), sets
    train/eval, and records the arch's facts (and build seconds) in ``payload["archs"]``."""

    def make(cfg: DenseConfig, device: torch.device, train: bool) -> tuple[nn.Module, gpu_check.Inputs]:
        t0 = time.perf_counter()
        dense, inputs, facts = build_dense_arch(models, cfg.family, cfg.scale, device, seed)
        gpu_check.sync(device)
        facts["build_s"] = time.perf_counter() - t0
        run.payload["archs"].setdefault(cfg.name, facts)
        return dense.train(train), inputs

    return make


# ----------------------------------------------------------------------------- main


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    """Command line; validates and normalizes lists; adds what gpu_check's run machinery reads."""
    default_out = (
        os.path.join(os.environ["OUT"], "gpu_dense_archs.json")
        if os.environ.get("OUT")
        else "gpu_dense_archs.json"
    )
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--device", default="cuda")
    parser.add_argument("--families", default="towers,mmoe", help=f"comma list of {','.join(FAMILIES)}")
    parser.add_argument("--scales", default="medium,large", help=f"comma list of {','.join(SCALES)}")
    parser.add_argument("--modes", default=",".join(gpu_check.MODES))
    parser.add_argument("--phases", default=",".join(gpu_check.PHASES))
    parser.add_argument("--rounds", type=int, default=7, help="interleaved timing rounds per mode")
    parser.add_argument("--iters", type=int, default=20, help="calls per round")
    parser.add_argument("--warmup", type=int, default=3, help="untimed calls per mode before the rounds")
    parser.add_argument("--budget-s", type=float, default=420.0, help="skip work that would start later")
    parser.add_argument("--lr", type=float, default=0.1, help="SGD learning rate (train phase)")
    parser.add_argument("--seed", type=int, default=0, help="weights seed (inputs: seed + 1)")
    parser.add_argument("--threads", type=int, default=0, help="torch intra-op threads (0: leave as is)")
    parser.add_argument(
        "--force-stub", action="store_true", help="use the torchrec stub even where torchrec is installed"
    )
    parser.add_argument("--out", default=default_out)
    args = parser.parse_args(argv)
    try:
        args.families = gpu_check.parse_list(args.families, FAMILIES, "families")
        args.scales = gpu_check.parse_list(args.scales, SCALES, "scales")
        args.modes = gpu_check.parse_list(args.modes, gpu_check.MODES, "modes")
        args.phases = gpu_check.parse_list(args.phases, gpu_check.PHASES, "phases")
    except ValueError as exc:
        parser.error(str(exc))
    gpu_check.check_run_args(parser, args)
    if args.seed < 0:
        parser.error("--seed must be >= 0")
    args.no_cost_models, args.cost_reserve_s = True, 0.0  # gpu_check.Run reads these
    return args


def main(argv: list[str] | None = None) -> dict[str, Any]:
    """Run every (family, scale, phase) group in priority order; returns the payload (also written to
    ``--out``)."""
    budget = gpu_check.Budget(0.0)
    args = parse_args(argv)
    budget.seconds = args.budget_s
    device = torch.device(args.device)
    if device.type == "cuda" and not torch.cuda.is_available():
        raise SystemExit("--device cuda but torch.cuda.is_available() is False")
    models, stub = load_models(args.force_stub)
    with gpu_check.precision_settings(args.threads) as precision:
        return run_all(args, device, budget, precision, models, stub)


def run_all(
    args: argparse.Namespace,
    device: torch.device,
    budget: gpu_check.Budget,
    precision: dict[str, Any],
    models: types.ModuleType,
    stub: dict[str, Any],
) -> dict[str, Any]:
    """The groups, then the final table; the JSON is rewritten after every measurement."""
    env = gpu_check.environment(device)
    env["start"] = gpu_check.now_iso()
    order = work_order(args.families, args.scales)
    settings = {
        "families": args.families,
        "scales": args.scales,
        "order": [c.name for c in order],
        **gpu_check.base_settings(args),
        "seed": args.seed,
        "model": "models.registry.family(f).build_dense(presets.resolve(f, scale), sparse.layout(cfg)) built "
        "under fork_rng + manual_seed(seed) inside `with device`: the shapes of models.build(f, scale)"
        ".module.dense, not its values (models.build draws the EBC from the RNG first)",
        "inputs": "(dense_features randn[B, num_dense_features], pooled randn[B, pooled_dim]) from a CPU "
        "generator seeded seed + 1, moved to the device; pooled does not require grad",
        "loss": "dense(*inputs).square().mean(); SGD(lr)",
        "parity": f"infer: outputs vs eager; train: parameters after {gpu_check.PARITY_STEPS} identical SGD "
        "steps vs eager (parity_ok: allclose), update_rel_diff, and gradients of one more fwd+bwd (grad_ok)",
        "dynamo_reset": "before each (family/scale, phase) group; each compiled mode has its own entry code object",
        "optimus_config": "OptimusConfig(layout=RelayoutParams()) for eager+optimus and compile+optimus",
        "compile": "torch.compile(fullgraph=True, dynamic=False) of a per-mode entry function; "
        "a tiny compile runs first (env.inductor_warmup_s) so no mode pays Inductor's start-up",
        "peer_options": gpu_check.peer_options(),
        **precision,
    }
    payload: dict[str, Any] = {
        "schema": 1,
        "env": env,
        "settings": settings,
        "torchrec_stub": stub,
        "archs": {},
        "cells": [],
    }
    run = DenseRun(args, device, budget, payload)
    run.make_base = base_maker(run, models, args.seed)
    run.save()
    env["inductor_warmup_s"] = None
    if any(m in gpu_check.COMPILED for m in args.modes):
        try:
            env["inductor_warmup_s"] = gpu_check.warm_inductor(device)
        except Exception as exc:  # the compiled modes will say what is wrong
            env["inductor_warmup_error"] = gpu_check.short_error(exc)
        run.save()
    print(
        f"gpu_dense_archs: torch {env['torch']} cuda {env['cuda']} gpu {env['gpu']} "
        f"torchrec stub {stub['used']} -> {args.out}",
        flush=True,
    )
    print(gpu_check.TABLE_HEAD, flush=True)
    for cfg in order:
        for phase in args.phases:
            if run.left_for_groups() <= 0:  # do not even build the arch
                for mode in args.modes:
                    gpu_check.skip_cell(run, run.cell(cfg, phase, mode), "budget spent before the group")
                continue
            try:
                gpu_check.run_group(run, cfg, phase)
            except Exception as exc:  # a whole group failing (e.g. building the arch) skips to the next
                gpu_check.log(f"group {cfg.name} {phase} failed: {gpu_check.short_error(exc)}")
                payload.setdefault("group_errors", []).append(
                    {"config": cfg.name, "phase": phase, "error": gpu_check.short_error(exc)}
                )
                run.save()
    env["end"] = gpu_check.now_iso()
    payload["finished"] = True
    run.save()
    print("\nFinal results:\n" + gpu_check.TABLE_HEAD, flush=True)
    for c in payload["cells"]:
        print(gpu_check.table_row(c), flush=True)
    print(f"elapsed {budget.elapsed():.1f}s; JSON: {args.out}", flush=True)
    return payload


if __name__ == "__main__":
    main()
