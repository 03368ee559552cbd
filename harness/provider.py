"""Model providers: `--provider package.module:function` names the builder of every cell's model.

Why by name: cells run in subprocesses, so the builder travels as a string; and a user
benchmarks their own model by writing one function, not by editing the harness. The default,
`models:build`, is this repository's families; `models.dense_only:build` is the same families
without torchrec (the GPU machine); `harness.providers.torchrec_dlrm:build` is torchrec's own
DLRM_DCN, a model this repository did not write; `harness.providers.mlperf_dlrmv2:build` is
MLPerf's DLRMv2 at its own scales (`cpu`, `full`); `harness.providers.outside_corpus:build` is
the outside corpus (models/outside/), each zoo's model as it is.

The contract (the same as `models.build`, docs/harness.md "Your own model"):

    builder(name, scale=..., device=..., seed=..., [count_nodes=False]) -> built

* `built.module`: an `nn.Module` with a `dense` submodule; `built.module(*batch.inputs)` gives
  the logits. The modes prepare `module.dense` only (what is compiled and rewritten), and
  the harness puts the prepared one back in its place.
* `built.dense_inputs(batch)`: the tuple of tensors `module.dense` is called with for `batch`
  (what a mode is prepared and traced with).
* `built.batches`: a non-empty list; each has `.inputs` (a tuple) and `.labels`.
* `built.loss(logits, labels)`: the scalar training loss.
* `built.meta` (optional): a dict; its int/float/str values are copied into every cell.
* The module may define `FAMILIES` (the names `--models` accepts; default: any name) and
  `SCALES` (default: tiny..xl).

A bad spec fails before any cell runs, with one line (ProviderError, a ValueError, so the CLI
exits with exit_codes.BAD_INPUT).
"""

from __future__ import annotations

import importlib
import inspect
from collections.abc import Callable
from types import ModuleType
from typing import Any

SCALES_FALLBACK: tuple[str, ...] = ("tiny", "small", "medium", "large", "xl")


class ProviderError(ValueError):
    """A `--provider` spec that names no usable builder."""


def split(spec: str) -> tuple[str, str]:
    """`package.module:function` -> (module, function), refused unless both halves are there."""
    mod, sep, name = spec.partition(":")
    if not sep or not mod.strip() or not name.strip() or ":" in name:
        raise ProviderError(f"provider: expected 'package.module:function', got {spec!r}")
    return mod.strip(), name.strip()


def module(spec: str) -> ModuleType:
    """Import the module half of `spec`; an import failure is one line naming the module."""
    mod, _ = split(spec)
    try:
        return importlib.import_module(mod)
    except ImportError as e:  # ModuleNotFoundError, or the provider's own dependency missing
        first = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
        raise ProviderError(f"provider {spec!r}: cannot import module {mod!r}: {first}") from None


def load(spec: str) -> Callable[..., Any]:
    """The builder named by `spec` (default provider: `models:build`)."""
    mod = module(spec)
    _, name = split(spec)
    fn = getattr(mod, name, None)
    if fn is None:
        raise ProviderError(f"provider {spec!r}: module {mod.__name__!r} has no attribute {name!r}")
    if not callable(fn):
        raise ProviderError(
            f"provider {spec!r}: {mod.__name__}.{name} is a {type(fn).__name__}, not callable"
        )
    return fn


def accepts_overrides(builder: Callable[..., Any]) -> bool:
    """Whether a builder takes ``overrides=`` (config fields replaced, as ``models.build``): a
    training-quality run asks it for ``num_batches``, its training steps plus held-out batches."""
    params = inspect.signature(builder).parameters
    return "overrides" in params or any(p.kind is inspect.Parameter.VAR_KEYWORD for p in params.values())


def families(spec: str) -> tuple[str, ...]:
    """The provider module's `FAMILIES` (empty: it accepts any model name)."""
    return tuple(getattr(module(spec), "FAMILIES", ()))


def scales(spec: str) -> tuple[str, ...]:
    return tuple(getattr(module(spec), "SCALES", SCALES_FALLBACK))
