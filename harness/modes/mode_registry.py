"""The modes: the one place that says what a mode is.

Why a registry: a mode used to be a name in ``spec.MODES``, a branch in ``modes.prepare``, a
colour in ``plots``, a ``startswith("compile")`` in ``cell`` and a literal in ``benchmarks/``
and the nightly, so adding one touched six files. Now each mode is one ``Mode`` here, and the
spec, the cell subprocess, compare, report, plots, the asv suite, the nightly and ``ab``
iterate over ``modes()``. Adding a mode is one ``register(Mode(...))`` (docs/harness.md).

The roles below (``REFERENCE``, ``TARGET``, ...) name the modes the paper table compares; a new
mode does not need one to be run, reported and plotted.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from harness.modes import builtin as prep


@dataclass(frozen=True)
class Mode:
    """One way of handing the dense arch to a compiler (the sparse part always stays eager)."""

    name: str
    prepare: Callable[[Any, Sequence[Any]], prep.Prepared]  # (dense, example inputs) -> Prepared
    compiled: bool  # torch.compile runs lazily on the first call: compile time = first call - one step
    label: str  # one line for people (``optimus-bench list``, docs)
    color: str  # its colour in every plot
    optimus: bool = False  # runs optimus.optimize (so it has an optimize time and node counts)
    asv: bool = False  # in the asv suite's compiled grid and the nightly's asv reruns
    run_info: Callable[[], dict[str, Any]] | None = None  # recorded once in a run's config

    @property
    def has_compile_time(self) -> bool:
        """Whether its cells have a compile time worth plotting (compiled, or optimized first)."""
        return self.compiled or self.optimus


_REGISTRY: dict[str, Mode] = {}

REFERENCE = "eager"  # parity reference of every other mode
TARGET = "compile+optimus"  # the paper's mode
BASELINES = ("compile", "compile+peer")  # what TARGET is compared against
EAGER_TARGET = "eager+optimus"  # compared against REFERENCE without a compiler


def register(mode: Mode, replace: bool = False) -> Mode:
    """Add ``mode`` (at the end of the order); a second mode of the same name is refused."""
    if not mode.name or "," in mode.name or "/" in mode.name:
        raise ValueError(f"mode: name {mode.name!r} must be non-empty without ',' or '/'")
    if mode.name in _REGISTRY and not replace:
        raise ValueError(f"mode: {mode.name!r} is already registered")
    _REGISTRY[mode.name] = mode
    return mode


def unregister(name: str) -> None:
    """Remove a mode (tests that register a scratch one)."""
    get(name)
    del _REGISTRY[name]


def get(name: str) -> Mode:
    try:
        return _REGISTRY[name]
    except KeyError:
        raise ValueError(f"mode: unknown {name!r}; allowed values: {', '.join(_REGISTRY)}") from None


def names() -> tuple[str, ...]:
    """Mode names in their order (report columns, plot bars, the default run)."""
    return tuple(_REGISTRY)


def modes() -> tuple[Mode, ...]:
    return tuple(_REGISTRY.values())


def asv_modes() -> tuple[str, ...]:
    """The modes the asv suite's compiled benchmarks and the nightly's asv reruns measure."""
    return tuple(m.name for m in _REGISTRY.values() if m.asv)


def color(name: str) -> str | None:
    """Plot colour of ``name`` (None for a name this registry does not know)."""
    m = _REGISTRY.get(name)
    return None if m is None else m.color


for _m in (
    Mode("eager", prep.prepare_eager, False, "the dense arch as written, no compiler", "#9e9e9e"),
    Mode("eager+optimus", prep.prepare_eager_optimus, False,
         "optimus.optimize (parameters re-laid out once), no compiler", "#616161", optimus=True),
    Mode("compile", prep.prepare_compile, True, "torch.compile (Inductor), default passes", "#1f77b4", asv=True),
    Mode("compile+peer", prep.prepare_compile_peer, True,
         "torch.compile with every Inductor pre-grad fusion and split/cat pattern on", "#ff7f0e",
         run_info=prep.peer_run_info),
    Mode("compile+optimus", prep.prepare_compile_optimus, True,
         "optimus.optimize priced for Inductor, parameters re-laid out once, then torch.compile",
         "#2ca02c", optimus=True, asv=True),
):  # fmt: skip
    register(_m)


def prepare(
    mode: str, dense: Any, example_inputs: Sequence[Any], beside: Any = None, outside_bytes: int | None = None
) -> prep.Prepared:
    """Return the module that ``mode`` runs in place of ``dense``.

    Compiling is lazy (first call); ``prepare_s`` counts only work done here
    (``optimus.optimize`` for eager+optimus). ``beside``: the whole model ``dense`` runs in (its
    other parameters and buffers, the embedding tables, are part of the memory the Optimus modes'
    ceiling is a fraction of: ``builtin.outside_bytes``). ``outside_bytes``: that memory given
    directly, where the process will not hold all of ``beside`` (a sharded rank holds its shards).
    """
    nbytes = prep.bytes_outside(beside, dense) if outside_bytes is None else outside_bytes
    with prep.outside_bytes(nbytes):
        return get(mode).prepare(dense, example_inputs)
