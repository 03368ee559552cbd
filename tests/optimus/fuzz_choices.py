"""Where a program generator's decisions come from: hypothesis (which can shrink them) or a seeded
``random.Random`` (the same seed is the same program on any machine and any hypothesis version).

Generators (:mod:`fuzz_programs`, :mod:`split_cat_dags`) take a :class:`Choices`, so the
property tests draw through hypothesis while the fuzz runner and the "exercises the rules" tests
use fixed seeds, independent of hypothesis's example distribution.
"""

from __future__ import annotations

import random
from collections.abc import Sequence
from typing import Any, Protocol, TypeVar

T = TypeVar("T")


class Choices(Protocol):
    def integer(self, lo: int, hi: int) -> int:
        """An int in ``[lo, hi]`` (both included); smaller is simpler (hypothesis shrinks towards lo)."""
        ...

    def choice(self, options: Sequence[T]) -> T:
        """One of ``options``; earlier is simpler."""
        ...


class RandomChoices:
    """Decisions from ``random.Random(seed)``."""

    def __init__(self, seed: int) -> None:
        self.rng = random.Random(seed)

    def integer(self, lo: int, hi: int) -> int:
        return self.rng.randint(lo, hi)

    def choice(self, options: Sequence[T]) -> T:
        return options[self.rng.randrange(len(options))]


class DrawChoices:
    """Decisions from a hypothesis ``draw`` (inside ``st.composite``), through public strategies only."""

    def __init__(self, draw: Any) -> None:
        from hypothesis import strategies as st

        self.draw, self.st = draw, st

    def integer(self, lo: int, hi: int) -> int:
        return int(self.draw(self.st.integers(lo, hi)))

    def choice(self, options: Sequence[T]) -> T:
        return options[self.draw(self.st.integers(0, len(options) - 1))]


def boolean(c: Choices) -> bool:
    return c.integer(0, 1) == 1


def some(c: Choices, options: Sequence[T], lo: int, hi: int) -> list[T]:
    """``lo``..``hi`` picks from ``options`` (with repeats)."""
    return [c.choice(options) for _ in range(c.integer(lo, hi))]
