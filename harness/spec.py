"""What a benchmark run is made of: phases, cells and the run configuration (modes: ``mode_registry``).

Why one module: the CLI, the cell subprocess, the results validator and the asv suite all
need the same names and the same validation, and a typo must fail with the allowed values
instead of silently producing an empty run.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass, field
from typing import Any

from harness import provider
from harness.modes import mode_registry

PHASES: tuple[str, ...] = ("infer", "train")
DEVICES: tuple[str, ...] = ("cpu", "cuda")
# quality_mismatch: a quality run's mode trained to another held-out quality than eager
# (harness/measure/quality.py); like every status but ok, the gate counts it as lost data.
STATUSES: tuple[str, ...] = ("ok", "failed", "timeout", "mismatch", "quality_mismatch")
DEFAULT_PROVIDER = "models:build"
# How a sharded cell (``--nproc`` > 1) splits its tables; "auto": torchrec's planner chooses.
SHARDINGS: tuple[str, ...] = ("table_wise", "column_wise", "table_column_wise", "data_parallel", "auto")
# run --optimus-guard: optimus.config.GUARD_MODES (spec does not import torch; a test checks they match)
OPTIMUS_GUARDS: tuple[str, ...] = ("off", "graph", "rules")


def __getattr__(name: str) -> Any:
    """``spec.MODES``: the registered mode names, read when asked (``harness.modes.mode_registry``),
    so a mode registered at run time is allowed too."""
    if name == "MODES":
        return mode_registry.names()
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def parse_list(
    text: str | list[str] | tuple[str, ...], field_name: str, allowed: tuple[str, ...]
) -> list[str]:
    """Split a comma list (or take a list), check every item against ``allowed``, keep order."""
    items = [s.strip() for s in text.split(",")] if isinstance(text, str) else [str(s) for s in text]
    items = [s for s in items if s]
    if not items:
        raise ValueError(f"{field_name}: empty; allowed values: {', '.join(allowed)}")
    bad = [s for s in items if s not in allowed]
    if bad:
        raise ValueError(
            f"{field_name}: unknown {', '.join(map(repr, bad))}; allowed values: {', '.join(allowed)}"
        )
    seen: list[str] = []
    for s in items:
        if s not in seen:
            seen.append(s)
    return seen


def resolve_device(device: str) -> str:
    """``auto`` -> cuda if torch sees a GPU, else cpu; ``cuda`` on a host without one is refused.

    Why refuse up front: every cell would fail on its first CUDA call and the run would still
    "finish", minutes later, with nothing measured."""
    if device not in (*DEVICES, "auto"):
        raise ValueError(f"device: unknown {device!r}; allowed values: {', '.join(DEVICES)}, auto")
    if device == "cpu":
        return device
    import torch

    if torch.cuda.is_available():
        return "cuda"
    if device == "cuda":
        raise ValueError(
            f"device: 'cuda' requested, but torch {torch.__version__} sees no CUDA device on this host "
            "(torch.cuda.is_available() is False); use --device cpu"
        )
    return "cpu"


# The provider half lives in harness/provider.py; these names stay for the cell and the CLI.
provider_module = provider.module
load_provider = provider.load
provider_families = provider.families
provider_scales = provider.scales


@dataclass
class RunConfig:
    """Everything that decides which cells run and how they are measured."""

    models: list[str]
    scale: str = "tiny"
    modes: list[str] = field(default_factory=lambda: list(mode_registry.names()))
    phases: list[str] = field(default_factory=lambda: list(PHASES))
    device: str = "cpu"
    seed: int = 0
    warmup: int = 3
    min_iters: int = 5
    max_iters: int = 200
    budget_s: float = 2.0
    timeout_s: float = 600.0
    threads: int = 1  # torch intra-op (and OpenMP) threads per cell; 0: leave torch's default
    atol: float = 1e-4
    rtol: float = 1e-3
    provider: str = DEFAULT_PROVIDER
    nproc: int = 1  # > 1: each cell is one torchrun job of nproc ranks (harness/run/sharded, docs/sharded.md)
    sharding: str = "auto"  # with nproc > 1: the sharding type every table is constrained to
    pg_timeout_s: float = 120.0  # with nproc > 1: process-group timeout (a peer of a hung rank fails)
    limit: bool = False  # the compile cells also measure the limit (harness/measure/limit.py)
    memory_margin: float | None = None  # the Optimus modes' OptimusConfig.memory_margin; None: its default
    # the Optimus modes' OptimusConfig.guard (off | graph | rules); None: each mode's default
    # (rules for eager+optimus, off for compile+optimus: harness/modes/builtin.py:optimus_guard)
    optimus_guard: str | None = None
    # > 0: a training-quality run (harness/run/quality.py): each cell trains this many steps per seed
    # instead of timing, over ``quality_seeds`` seeds from ``seed`` on, and is judged against eager
    # (with nproc > 1, harness/run/sharded/quality_rank.py: against the single-process reference).
    quality_steps: int = 0
    quality_seeds: int = 3
    quality_every: int = 10  # the loss curve: mean training loss per window of this many steps
    quality_heldout: int = 128  # held-out batches after the training ones
    quality_lr: float = 0.5  # SGD learning rate of the mode and of eager

    def validate(self, check_models: bool = True) -> RunConfig:
        """Check every field; raise ValueError naming the field and the allowed values."""
        self.modes = parse_list(self.modes, "modes", mode_registry.names())
        self.phases = parse_list(self.phases, "phases", PHASES)
        if self.device not in DEVICES:
            raise ValueError(f"device: unknown {self.device!r}; allowed values: {', '.join(DEVICES)}")
        for name in ("warmup", "min_iters", "max_iters", "threads"):
            v = getattr(self, name)
            if not isinstance(v, int) or v < 0:
                raise ValueError(f"{name}: must be an integer >= 0, got {v!r}")
        if self.min_iters < 1:
            raise ValueError(f"min_iters: must be >= 1, got {self.min_iters}")
        if self.max_iters < self.min_iters:
            raise ValueError(f"max_iters: must be >= min_iters ({self.min_iters}), got {self.max_iters}")
        for name in ("budget_s", "timeout_s", "atol", "rtol"):
            v = getattr(self, name)
            if isinstance(v, bool) or not isinstance(v, int | float) or not math.isfinite(v) or v < 0:
                raise ValueError(f"{name}: must be a finite number >= 0, got {v!r}")
        if isinstance(self.nproc, bool) or not isinstance(self.nproc, int) or self.nproc < 1:
            raise ValueError(f"nproc: must be an integer >= 1, got {self.nproc!r}")
        if self.sharding not in SHARDINGS:
            raise ValueError(f"sharding: unknown {self.sharding!r}; allowed values: {', '.join(SHARDINGS)}")
        v = self.pg_timeout_s
        if isinstance(v, bool) or not isinstance(v, int | float) or not math.isfinite(v) or v <= 0:
            raise ValueError(f"pg_timeout_s: must be a finite number > 0, got {v!r}")
        if not isinstance(self.limit, bool):
            raise ValueError(f"limit: must be true or false, got {self.limit!r}")
        v = self.memory_margin
        if v is not None and (
            isinstance(v, bool) or not isinstance(v, int | float) or not math.isfinite(v) or v < 0
        ):
            raise ValueError(f"memory_margin: must be a finite number >= 0, got {v!r}")
        if self.optimus_guard is not None and self.optimus_guard not in OPTIMUS_GUARDS:
            raise ValueError(
                f"optimus_guard: unknown {self.optimus_guard!r}; allowed values: {', '.join(OPTIMUS_GUARDS)}"
            )
        self._validate_quality(check_models)
        if check_models:
            families = provider_families(self.provider)
            self.models = parse_list(self.models, "models", families) if families else list(self.models)
            scales = provider_scales(self.provider)
            if self.scale not in scales:
                raise ValueError(f"scale: unknown {self.scale!r}; allowed values: {', '.join(scales)}")
        return self

    def _validate_quality(self, check_provider: bool) -> None:
        for name, low in (
            ("quality_steps", 0),
            ("quality_seeds", 1),
            ("quality_every", 1),
            ("quality_heldout", 1),
        ):
            v = getattr(self, name)
            if isinstance(v, bool) or not isinstance(v, int) or v < low:
                raise ValueError(f"{name}: must be an integer >= {low}, got {v!r}")
        v = self.quality_lr
        if isinstance(v, bool) or not isinstance(v, int | float) or not math.isfinite(v) or v <= 0:
            raise ValueError(f"quality_lr: must be a finite number > 0, got {v!r}")
        if not self.quality_steps:
            return
        if self.phases != ["train"]:
            raise ValueError(
                f"phases: a quality run trains, so its phases are train only, got {','.join(self.phases)}"
            )
        if check_provider and not provider.accepts_overrides(provider.load(self.provider)):
            raise ValueError(
                f"provider: {self.provider} takes no overrides=; a quality run asks the builder for "
                "overrides={'num_batches': steps + held-out batches} (as models.build does)"
            )

    def cells(self) -> list[CellKey]:
        """Cells in run order: per model and phase, all modes back to back (less drift between them)."""
        return [
            CellKey(m, self.scale, mode, ph) for m in self.models for ph in self.phases for mode in self.modes
        ]

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


@dataclass(frozen=True)
class CellKey:
    """Identity of one cell; a results file holds at most one cell per key."""

    model: str
    scale: str
    mode: str
    phase: str

    @staticmethod
    def of(cell: dict[str, Any]) -> CellKey:
        return CellKey(cell["model"], cell["scale"], cell["mode"], cell["phase"])

    def label(self) -> str:
        return f"{self.model}/{self.scale}/{self.mode}/{self.phase}"
