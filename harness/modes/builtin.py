"""Turn a model's dense arch into what one mode runs, and set compile caches off.

Why here and nowhere else: each mode is one way of handing ``b.module.dense`` to a
compiler; the EmbeddingBagCollection always stays eager. Keeping that choice in one
function means the harness, asv and nightly compare exactly the same configurations.
"""

from __future__ import annotations

import contextlib
import os
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field, replace
from typing import Any

CACHE_ENV = {
    # Compile time is measured with every compile cache off (the caller also points
    # TORCHINDUCTOR_CACHE_DIR at a fresh directory, so not even compiled C++ is reused).
    "TORCHINDUCTOR_FX_GRAPH_CACHE": "0",
    "TORCHINDUCTOR_AUTOGRAD_CACHE": "0",
    "TORCHINDUCTOR_FORCE_DISABLE_CACHES": "1",
    "TORCHINDUCTOR_AUTOTUNE_REMOTE_CACHE": "0",
    "TORCHINDUCTOR_FX_GRAPH_REMOTE_CACHE": "0",
}


def disable_compile_caches() -> None:
    """Switch the FX graph cache, AOT autograd cache and the rest off in this process."""
    for k, v in CACHE_ENV.items():
        os.environ.setdefault(k, v)
    import torch._functorch.config as functorch_config
    import torch._inductor.config as inductor_config
    import torch.compiler.config as compiler_config

    compiler_config.force_disable_caches = True
    inductor_config.fx_graph_cache = False
    inductor_config.autotune_local_cache = False
    functorch_config.enable_autograd_cache = False


def peer_fusion_options() -> dict[str, dict[str, Any]]:
    """Every pre-grad fusion and split/cat pattern of the installed Inductor, default options.

    Read at run time (not hard-coded) so the peer is whatever this torch ships; the keys are
    recorded in the results file.
    """
    from torch._inductor.fx_passes import group_batch_fusion, split_cat

    keys = list(group_batch_fusion.PRE_GRAD_FUSIONS) + list(split_cat.PRE_GRAD_PATTERNS)
    return {k: {} for k in keys}


@dataclass
class Prepared:
    """The dense arch as the mode runs it, and what preparing it cost before the first call."""

    module: Any
    prepare_s: float = 0.0
    info: dict[str, Any] = field(default_factory=dict)
    # the optimus reports behind ``module`` (a backend's own list fills at the first call); the
    # cell reads them here, not from a module global of optimus
    reports: list[Any] = field(default_factory=list)


def _optimus() -> Any:
    try:
        import optimus
    except ImportError as e:  # the core is built on another branch; say so instead of crashing
        raise RuntimeError(f"this mode needs the optimus package, which is not importable: {e}") from e
    if not hasattr(optimus, "optimize"):
        raise RuntimeError("this mode needs optimus.optimize, which this checkout's optimus package lacks")
    return optimus


def report_fields(report: Any) -> dict[str, Any]:
    """Pick the figures the harness records from an ``optimus_report``."""
    if report is None:
        return {}
    d = report.as_dict() if hasattr(report, "as_dict") else dict(vars(report))
    return {
        "optimus_s": d.get("seconds"),
        "nodes_before": d.get("nodes_before"),
        "nodes_after": d.get("nodes_after"),
        "rules_fired": d.get("rules_fired"),
        "stop_reason": d.get("stop_reason"),
        "chunked_groups": d.get("chunked_groups", 0),
        **guard_fields(report),
    }


def guard_fields(report: Any) -> dict[str, Any]:
    """The measured guard's verdict (``optimus.guard``), when it ran: the verdict, the whole
    rewrite's paired speedup over plain capture with its 95% interval, what it took out, its time."""
    verdict = getattr(report, "guard", "off")
    if verdict == "off":
        return {}
    trials = getattr(report, "guard_trials", [])
    whole = trials[0] if trials else None
    return {
        "optimus_guard": verdict,
        "guard_speedup": None if whole is None else whole.speedup,
        "guard_interval": None if whole is None else [whole.low, whole.high],
        "guard_rejected": dict(getattr(report, "guard_rejected", {})),
        "guard_s": getattr(report, "guard_seconds", 0.0),
    }


def merge_reports(reports: list[Any]) -> dict[str, Any]:
    """Sum the per-graph reports of one torch.compile (several graphs if it recompiled)."""
    if not reports:
        return {}
    fields = [report_fields(r) for r in reports]
    fired: dict[str, int] = {}
    for f in fields:
        for k, v in (f.get("rules_fired") or {}).items():
            fired[k] = fired.get(k, 0) + v
    return {
        "optimus_s": sum(f.get("optimus_s") or 0.0 for f in fields),
        "nodes_before": sum(f.get("nodes_before") or 0 for f in fields),
        "nodes_after": sum(f.get("nodes_after") or 0 for f in fields),
        "rules_fired": fired,
        "chunked_groups": sum(f.get("chunked_groups") or 0 for f in fields),
        "stop_reason": ",".join(sorted({str(f.get("stop_reason")) for f in fields})),
        "optimus_graphs": len(reports),
    }


def prepare_eager(dense: Any, example_inputs: Sequence[Any]) -> Prepared:
    return Prepared(dense)


def prepare_eager_optimus(dense: Any, example_inputs: Sequence[Any]) -> Prepared:
    # Same rewrite as compile+optimus (parameters re-laid out once), run without a compiler:
    # with runtime stacking every call re-stacks the fused weights, which costs more than
    # the fusion saves in a training step (dlrm tiny train was 0.72x of eager that way).
    gm, dt, fields = _optimize_relayout(dense, example_inputs, guard=guard_for(compiled=False))
    return Prepared(gm, dt, fields, _reports_of(gm))


def prepare_compile(dense: Any, example_inputs: Sequence[Any]) -> Prepared:
    import torch

    return Prepared(torch.compile(dense, fullgraph=True, dynamic=False))


def prepare_compile_peer(dense: Any, example_inputs: Sequence[Any]) -> Prepared:
    import torch
    import torch._inductor.config as inductor_config

    options = peer_fusion_options()
    inductor_config.pre_grad_fusion_options = options
    return Prepared(
        torch.compile(dense, fullgraph=True, dynamic=False), info={"peer_options": sorted(options)}
    )


def prepare_compile_optimus(dense: Any, example_inputs: Sequence[Any]) -> Prepared:
    # Optimus rewrites the dense arch once, storing each fused group's parameters re-laid out
    # in one stacked tensor (optimus.params.relayout), then Inductor compiles the result.
    # Why not torch.compile(backend="optimus"): there Dynamo hands parameters in as graph inputs, so
    # fused weights must be stacked on every call; side by side (docs/perf.md) that reached
    # 0.94-1.14x of compile on towers/mmoe small, this path 1.27-1.75x. Optimizing is counted in
    # compile time (prepare_s).
    import torch

    gm, dt, fields = _optimize_relayout(dense, example_inputs, inductor=True, guard=guard_for(compiled=True))
    how = "relayout" if fields["optimus_layout"] == "RelayoutParams" else "runtime stack"
    fields["optimus_path"] = f"optimize+{how}, then Inductor"
    return Prepared(torch.compile(gm, fullgraph=True, dynamic=False), dt, fields, _reports_of(gm))


def _reports_of(gm: Any) -> list[Any]:
    report = getattr(gm, "optimus_report", None)
    return [] if report is None else [report]


def peer_run_info() -> dict[str, Any]:
    """What a run with compile+peer records once in its config: the peer's pattern keys."""
    return {"peer_options": sorted(peer_fusion_options())}


@dataclass(frozen=True)
class OptimusSettings:
    """What the Optimus modes prepare with beyond their defaults, set for a block by the context
    managers below (``run``'s options, the cell's tables) and read when a mode is prepared.

    WHY process-wide and not arguments: the modes are called through one small interface,
    ``prepare(dense, example_inputs)`` (``mode_registry``), shared by every mode, and these
    settings concern only the Optimus ones. Process-wide and not a context variable: a thread
    that prepares a mode sees them too."""

    memory_margin: float | None = None  # memory_margin(): the memory gate's margin
    outside_bytes: int = 0  # outside_bytes(): the model's memory beside the dense arch
    cost_model: str | None = None  # cost_model(): "analytic" (the default) or "measured"
    guard: str | None = None  # optimus_guard(): None, each mode's default


_SETTINGS = OptimusSettings()


def settings() -> OptimusSettings:
    """The settings the Optimus modes would prepare with now."""
    return _SETTINGS


@contextlib.contextmanager
def _setting(**changes: Any) -> Iterator[None]:
    """Inside the block, ``changes`` on top of the settings around it; restored after."""
    global _SETTINGS
    before = _SETTINGS
    _SETTINGS = replace(before, **changes)
    try:
        yield
    finally:
        _SETTINGS = before


# The Optimus modes' OptimusConfig.guard (optimus.guard) when ``run --optimus-guard`` is not
# given: eager+optimus measures, compile+optimus does not (each measurement there is a compile)
EAGER_GUARD_DEFAULT = "rules"
COMPILE_GUARD_DEFAULT = "off"
# ``ab --optimus-guard``: its worker processes (of any checkout) read the choice from here
GUARD_ENV = "OPTIMUS_BENCH_OPTIMUS_GUARD"
GUARDS = ("off", "graph", "rules")


def guard_for(compiled: bool) -> str:
    """The guard an Optimus mode prepares with: ``optimus_guard``'s, else ``GUARD_ENV``'s, else
    the mode's default (see ``optimus_guard``)."""
    guard = _SETTINGS.guard
    chosen = guard if guard is not None else os.environ.get(GUARD_ENV) or None
    if chosen is not None:
        if chosen not in GUARDS:
            raise ValueError(f"{GUARD_ENV}: unknown {chosen!r}; allowed: {', '.join(GUARDS)}")
        return chosen
    return COMPILE_GUARD_DEFAULT if compiled else EAGER_GUARD_DEFAULT


def compile_for_guard(gm: Any) -> Any:
    """How compile+optimus runs its graph, for the guard to time (``OptimusConfig.guard_compile``):
    the same ``torch.compile`` call as the mode's, so Dynamo's cache entry made for the rewritten
    graph is the one the mode's own compile then finds."""
    import torch

    return torch.compile(gm, fullgraph=True, dynamic=False)


@contextlib.contextmanager
def optimus_guard(mode: str | None) -> Iterator[None]:
    """Optimus modes prepared inside this block run ``optimus.optimize`` with
    ``OptimusConfig(guard=mode)`` (``run --optimus-guard``); ``None`` leaves each mode's default:
    ``"rules"`` for eager+optimus, ``"off"`` for compile+optimus.

    WHY on by default in eager+optimus and off in ``optimize``: a cell measures a model for many
    steps, so the guard's paired rounds on the example inputs (tens of milliseconds at ``small``,
    plus a driver run per rule it leaves out, within ``guard_time_limit_s``) are a small price for
    never reporting a rewrite that is slower than the plain capture on this device; its time counts
    in ``optimus_s`` and so in ``prepare_s``. compile+optimus times what Inductor makes of both
    graphs (``compile_for_guard``): one more compile per cell (the plain graph's; the rewritten
    graph's compile is reused by the mode), and one per variant under ``"rules"``, so it is off
    unless asked for (docs/optimus.md, "The measured guard").
    """
    if mode is not None and mode not in GUARDS:
        raise ValueError(f"optimus guard: unknown {mode!r}; allowed: {', '.join(GUARDS)}")
    with _setting(guard=mode):
        yield


@contextlib.contextmanager
def cost_model(name: str | None) -> Iterator[None]:
    """Optimus modes prepared inside this block price candidates with the named cost model
    (``"analytic"``, the default, or ``"measured"``: constants timed on this device,
    optimus.cost.measured); ``None`` leaves the default.

    WHY: the rules should fire only where they are faster on the device at hand; on a GPU the
    analytic constants are a guess, and ``harness.diagnose.profile_cell`` compares both to show which
    rewrites the measured constants would keep.
    """
    if name not in (None, "analytic", "measured"):
        raise ValueError(f"cost model: unknown {name!r}; allowed: analytic, measured")
    with _setting(cost_model=name):
        yield


@contextlib.contextmanager
def memory_margin(margin: float | None) -> Iterator[None]:
    """Optimus modes prepared inside this block use ``OptimusConfig(memory_margin=margin)``
    (``run --memory-margin``); ``None`` leaves Optimus's own default.

    WHY a harness setting: the memory gate trades step time for peak memory (docs/optimus.md,
    "Memory is a cost"), and which side of that trade a user wants is theirs to measure, cell by
    cell, with the same harness that measures the default.
    """
    with _setting(memory_margin=margin):
        yield


@contextlib.contextmanager
def outside_bytes(nbytes: int) -> Iterator[None]:
    """Optimus modes prepared inside this block count ``nbytes`` (the model's parameters and
    buffers outside the dense arch: its embedding tables) in the whole their memory ceiling is a
    fraction of (``OptimusConfig.memory_outside_bytes``), as the cell's peak-memory figure does."""
    with _setting(outside_bytes=int(nbytes)):
        yield


def bytes_outside(model: Any, dense: Any) -> int:
    """Bytes of ``model``'s parameters and buffers that ``dense`` does not hold (0 without a model)."""
    if model is None:
        return 0
    from optimus.memory.live import storage_bytes

    inside = {t.untyped_storage().data_ptr() for t in [*dense.parameters(), *dense.buffers()]}
    rest = [
        t for t in [*model.parameters(), *model.buffers()] if t.untyped_storage().data_ptr() not in inside
    ]
    return storage_bytes(rest)


def relaid_groups(gm: Any) -> int:
    """Groups of parameters ``gm`` reads re-laid out in one storage (the rest stack per call)."""
    from optimus.params.relayout import PREFIX

    return sum(1 for name, _ in gm.named_parameters() if name.rpartition(".")[2].startswith(PREFIX))


def _optimize_relayout(
    dense: Any, example_inputs: Sequence[Any], inductor: bool = False, guard: str = "off"
) -> tuple[Any, float, dict[str, Any]]:
    """``optimus.optimize`` with fused parameters stored re-laid out once; (module, seconds, report).

    ``inductor``: the result goes to torch.compile, so the cost model prices for Inductor.
    ``guard``: ``OptimusConfig.guard`` (eager+optimus passes the harness's, see ``optimus_guard``).
    Under a process group of two or more ranks (a sharded cell's rank, before DMP wraps the
    model) the re-laid-out members are the autograd leaves, so DDP all-reduces them
    (``RelayoutParams(gradients="auto")``, optimus/params/attach.py); the report records which
    way ran (``optimus_gradients``) and why. Groups the re-layout declines stack per call.
    """
    optimus = _optimus()
    from optimus.memory.live import MEMORY_CEILING
    from optimus.params.relayout import RelayoutParams

    # gradient buffers kept between steps lift the training peak by their bytes (RelayoutParams)
    layout = RelayoutParams(keep_gradient_buffers=False)
    settings = _SETTINGS
    if settings.cost_model == "measured":
        from optimus.cost.measured import MeasuredCostModel

        model: Any = MeasuredCostModel(inductor=inductor)
    else:
        model = optimus.AnalyticCostModel(inductor=inductor)
    # The ceiling keeps the program's estimated peak within 2% of the captured graph's (the
    # harness's memory target against compile); docs/optimus.md, "Memory is a cost".
    config = optimus.OptimusConfig(
        layout=layout,
        cost_model=model,
        guard=guard,
        memory_ceiling=MEMORY_CEILING,
        memory_outside_bytes=settings.outside_bytes,
    )
    if inductor and guard != "off":
        config = config.with_(guard_compile=compile_for_guard)
    if settings.memory_margin is not None:
        config = config.with_(memory_margin=settings.memory_margin)
    t0 = time.perf_counter()
    gm = optimus.optimize(dense, tuple(example_inputs), config=config)
    dt = time.perf_counter() - t0
    fields = report_fields(getattr(gm, "optimus_report", None))
    fields["optimus_layout"] = type(layout).__name__
    fields["optimus_gradients"] = layout.gradients_in_use()
    fields["relaid_groups"] = relaid_groups(gm)
    return gm, dt, fields
