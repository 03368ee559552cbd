"""Heterogeneous widths: per-table embedding dims and per-tower/expert widths, drawn from a seed.

WHY: real ranking models are not uniform. Tables get embedding dims by cardinality and
importance (powers of two from 8 to 128 are the usual range: small dims for low-cardinality
features, 64-128 for ids), per-feature projections and adapters therefore read different widths,
and task towers and experts are sized per task. Uniform presets only exercise *batch* fusion
(same-shape ops); these widths exercise *group* fusion (``group_linear``: different shapes).

Where the numbers come from: a synthetic draw, not a real model's config. With the config field
``hetero_seed`` set (absent: every width is the preset's single number, as before), each width is
drawn uniformly from a short list of powers of two:

* table embedding dims: ``EMBEDDING_DIMS`` = 8, 16, 32, 64, 128;
* tower, adapter, expert and task-tower widths: ``around(base)`` = base/2, base, 2*base (at least 8),
  where base is the preset's uniform width, so the model keeps roughly its size.

Draws use Python's ``random.Random`` seeded with ``"{seed}/{what}"`` (a string seed is hashed with
SHA-512, stable across Python versions and platforms), one stream per kind of width, so adding
one kind never shifts another.
"""

from __future__ import annotations

import random
from collections.abc import Mapping
from typing import Any

EMBEDDING_DIMS: tuple[int, ...] = (8, 16, 32, 64, 128)
SEED_FIELD = "hetero_seed"


def hetero_seed(cfg: Mapping[str, Any]) -> int | None:
    """The config's width seed, or None for uniform widths (the field is absent)."""
    seed = cfg.get(SEED_FIELD)
    return None if seed is None else int(seed)


def around(base: int) -> tuple[int, ...]:
    """base/2, base, 2*base (each at least 8; duplicates dropped)."""
    return tuple(sorted({max(8, base // 2), max(8, base), max(8, 2 * base)}))


def draw(count: int, seed: int, what: str, choices: tuple[int, ...]) -> tuple[int, ...]:
    """``count`` widths from ``choices``, uniform, from the stream named ``what`` of ``seed``."""
    rng = random.Random(f"{seed}/{what}")
    return tuple(rng.choice(choices) for _ in range(count))


def widths(cfg: Mapping[str, Any], count: int, what: str, base: int) -> tuple[int, ...]:
    """``count`` copies of ``base`` (uniform config), or ``count`` draws around it (hetero)."""
    seed = hetero_seed(cfg)
    return (base,) * count if seed is None else draw(count, seed, what, around(base))
