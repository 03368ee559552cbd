"""Random programs over split / chunk / cat / stack / unbind (plus pointwise ops and in-place
mutation) for the split/cat property test.

WHY a generator of its own: the rules only matter on graphs where these ops meet, so the
generator prefers what makes them meet (cats of runs of pieces, permuted runs, splits of pieces,
stacks then unbinds, negative dims, pieces with other readers, mutated values) instead of drawing
ops uniformly. A program is plain data (a list of steps); :class:`Program` runs it as a module,
so ``fx.symbolic_trace`` unrolls it into a graph.

Autograd forbids using a split/unbind piece after its base was written in place; the generator
therefore mutates only fresh values (cat, stack or pointwise results) and retires the pieces
taken from them.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import torch
from fuzz_choices import Choices, DrawChoices, RandomChoices, boolean, some
from hypothesis import strategies as st
from torch import nn


@dataclass
class _Val:
    shape: tuple[int, ...]
    fresh: bool  # not a view: may be mutated in place
    alive: bool = True
    base: int | None = None  # value this is a view (piece) of


@dataclass
class Plan:
    inputs: list[tuple[int, ...]]
    steps: list[tuple[Any, ...]] = field(default_factory=list)
    outputs: list[int] = field(default_factory=list)


def _dim(c: Choices, rank: int, d: int) -> int:
    """``d`` given as is or negative (both are the same dim)."""
    return d - rank if boolean(c) else d


def _fits(shape: tuple[int, ...], like: tuple[int, ...], d: int) -> bool:
    """Same rank and extents as ``like`` except along ``d`` (can be concatenated with it)."""
    return len(shape) == len(like) and all(
        a == b for k, (a, b) in enumerate(zip(shape, like, strict=False)) if k != d
    )


def undo_sizes(cat_widths: dict[int, tuple[int, list[int]]], src: int, d: int) -> list[int] | None:
    """The split sizes that undo cat ``src`` exactly when splitting it along ``d`` (None when ``src``
    is no cat, or was concatenated along another dim: its input extents then mean nothing on ``d``).
    The check is on ``src``'s own cat dim, not on the latest cat's: a split may take an older cat."""
    made = cat_widths.get(src)
    return list(made[1]) if made is not None and made[0] == d else None


@st.composite
def plans(draw: Any, max_steps: int = 10) -> Plan:
    """The hypothesis strategy (shrinkable) of :func:`generate_plan`."""
    return generate_plan(DrawChoices(draw), max_steps)


def random_plan(seed: int, max_steps: int = 10) -> Plan:
    """The plan of a fixed seed (independent of hypothesis's example distribution)."""
    return generate_plan(RandomChoices(seed), max_steps)


def generate_plan(c: Choices, max_steps: int = 10) -> Plan:
    rank = c.integer(2, 3)
    inputs = [tuple(c.integer(2, 6) for _ in range(rank)) for _ in range(2)]
    plan = Plan(inputs)
    vals = [_Val(s, fresh=False) for s in inputs]
    last_split: tuple[int, list[int]] = (0, [])  # (dim, pieces) of the latest split
    last_unbind: tuple[int, list[int]] = (0, [])  # (dim, pieces) of the latest unbind
    last_made: dict[str, tuple[int, int]] = {}  # "cat"/"stack" -> (value, dim) of the latest one
    cat_widths: dict[int, tuple[int, list[int]]] = {}  # cat value -> (its dim, its inputs' extents there)

    def live(pred: Any = lambda v: True) -> list[int]:
        return [i for i, v in enumerate(vals) if v.alive and pred(v)]

    for _ in range(c.integer(1, max_steps)):
        kind = c.choice(["split", "split", "cat", "cat", "stack", "unbind", "pointwise", "mutate"])
        if kind == "split":
            src = c.choice(live())
            shape = vals[src].shape
            d = c.integer(0, len(shape) - 1)
            recent = [(p, last_split[0]) for p in last_split[1] if vals[p].alive]
            if "cat" in last_made and vals[last_made["cat"][0]].alive:
                recent.append(last_made["cat"])
            if recent and boolean(c):  # split a piece or a cat again, on the same dim
                src, d = c.choice(recent)
                shape = vals[src].shape
            n = shape[d]
            form = c.choice(["sizes", "int", "chunk"])
            undo = undo_sizes(cat_widths, src, d)
            if undo is not None and boolean(c):
                form, sizes = "sizes", undo  # undo that cat exactly
                arg: Any = sizes
            elif form == "sizes":
                cuts = sorted(set(some(c, range(1, n), 1, 3))) if n > 1 else []
                sizes = [b - a for a, b in zip([0, *cuts], [*cuts, n], strict=True)]
                arg = sizes
            elif form == "int":
                arg = c.integer(1, n)
                sizes = [min(arg, n - k) for k in range(0, n, arg)]
            else:
                arg = c.integer(1, n)
                size = -(-n // arg)
                sizes = [min(size, n - k) for k in range(0, n, size)]
            plan.steps.append(("split", src, form, arg, _dim(c, len(shape), d)))
            first = len(vals)
            for s in sizes:
                vals.append(_Val((*shape[:d], s, *shape[d + 1 :]), fresh=False, base=src))
            last_split = (d, list(range(first, len(vals))))
            plan.steps[-1] = (*plan.steps[-1], last_split[1])
        elif kind == "cat":
            d, pieces = last_split
            pieces = [p for p in pieces if vals[p].alive]
            unbound = [p for p in last_unbind[1] if vals[p].alive]
            if len(unbound) >= 2 and c.integer(0, 3) == 0:  # a run of unbind pieces
                length = c.integer(2, len(unbound))
                lo = c.integer(0, len(unbound) - length)
                chosen = unbound[lo : lo + length]
                d = c.integer(0, len(vals[chosen[0]].shape) - 1)
            elif len(pieces) >= 2 and c.integer(0, 3) > 0:
                length = c.integer(2, len(pieces))
                lo = c.integer(0, len(pieces) - length)
                chosen = pieces[lo : lo + length]
                if c.integer(0, 4) == 0:
                    chosen = list(reversed(chosen))  # a permuted run must not fire
            else:
                base = c.choice(live())
                shape = vals[base].shape
                d = c.integer(0, len(shape) - 1)
                same = [i for i in live() if _fits(vals[i].shape, shape, d)]
                chosen = some(c, same, 1, 4)
            shape = vals[chosen[0]].shape
            out = (*shape[:d], sum(vals[c].shape[d] for c in chosen), *shape[d + 1 :])
            plan.steps.append(("cat", chosen, _dim(c, len(shape), d)))
            last_made["cat"] = (len(vals), d)
            cat_widths[len(vals)] = (d, [vals[c].shape[d] for c in chosen])
            vals.append(_Val(out, fresh=True))
        elif kind == "stack":
            pieces = [p for p in last_unbind[1] if vals[p].alive]
            # the leading run of equal-size split pieces, in order (what horizontal fusion stacks)
            same_size = []
            for p in last_split[1]:
                if not vals[p].alive or (same_size and vals[p].shape != vals[same_size[0]].shape):
                    break
                same_size.append(p)
            if len(pieces) >= 2 and boolean(c):  # a run of unbind pieces, same dim
                d = last_unbind[0]
                length = c.integer(2, len(pieces))
                lo = c.integer(0, len(pieces) - length)
                chosen = pieces[lo : lo + length]
                shape = vals[chosen[0]].shape
            elif len(same_size) >= 2 and boolean(c):  # equal split pieces (in order)
                chosen = same_size
                shape = vals[chosen[0]].shape
                d = last_split[0] if boolean(c) else c.integer(0, len(shape))
            else:
                shape = vals[c.choice(live())].shape
                if len(shape) >= 4:
                    continue
                same = [i for i in live() if vals[i].shape == shape]
                chosen = some(c, same, 1, 4)
                d = c.integer(0, len(shape))
            plan.steps.append(("stack", chosen, _dim(c, len(shape) + 1, d)))
            last_made["stack"] = (len(vals), d)
            vals.append(_Val((*shape[:d], len(chosen), *shape[d:]), fresh=True))
        elif kind == "unbind":
            candidates = live(lambda v: len(v.shape) >= 2)
            if not candidates:
                continue
            src = c.choice(candidates)
            shape = vals[src].shape
            d = c.integer(0, len(shape) - 1)
            made = last_made.get("stack")
            if made is not None and vals[made[0]].alive and boolean(c):  # unbind a stack
                src, d = made
                shape = vals[src].shape
            first = len(vals)
            for _ in range(shape[d]):
                vals.append(_Val(shape[:d] + shape[d + 1 :], fresh=False, base=src))
            last_unbind = (d, list(range(first, len(vals))))
            plan.steps.append(("unbind", src, _dim(c, len(shape), d), last_unbind[1]))
        elif kind == "pointwise":
            src = c.choice(live())
            # ops whose backward saves no tensor: a later in-place write cannot break autograd
            plan.steps.append(("pointwise", src, c.choice(["neg", "mul", "add"])))
            vals.append(_Val(vals[src].shape, fresh=True))
        else:  # mutate a fresh value in place; pieces taken from it are retired
            fresh = live(lambda v: v.fresh)
            if not fresh:
                continue
            src = c.choice(fresh)
            plan.steps.append(("mutate", src))
            for v in vals:  # views of src, and views of those
                b = v.base
                while b is not None and b != src:
                    b = vals[b].base
                if b == src:
                    v.alive = False
    used: set[int] = set()
    for step in plan.steps:
        if step[0] in ("cat", "stack"):
            used.update(step[1])
        elif step[0] != "mutate":  # split, unbind, pointwise read one value
            used.add(step[1])
    # what nothing else reads, plus a few values that are also read (pieces with other users)
    leaves = [i for i in live() if i not in used]
    extra = some(c, live(), 0, 2) if live() else []
    plan.outputs = sorted(set(leaves) | set(extra)) or live()
    return plan


class Program(nn.Module):
    """Runs a :class:`Plan` (traceable: the plan is constant data)."""

    def __init__(self, plan: Plan, copy_outputs: bool = False) -> None:
        super().__init__()
        self.plan = plan
        # outputs through ``* 1.0``: the caller then cannot see their layout, so rewrites that
        # return a view with other strides than eager's (declined for raw outputs) may fire
        self.copy_outputs = copy_outputs

    def forward(self, x: torch.Tensor, y: torch.Tensor) -> tuple[torch.Tensor, ...]:
        vals: list[Any] = [x * 1.0, y * 1.0]  # inputs are leaves: never mutate those
        for step in self.plan.steps:
            kind = step[0]
            if kind == "split":
                _, src, form, arg, dim, ids = step
                x = vals[src]
                parts = torch.chunk(x, arg, dim) if form == "chunk" else torch.split(x, arg, dim)
                vals.extend(parts[i] for i in range(len(ids)))
            elif kind == "cat":
                vals.append(torch.cat([vals[i] for i in step[1]], step[2]))
            elif kind == "stack":
                vals.append(torch.stack([vals[i] for i in step[1]], step[2]))
            elif kind == "unbind":
                _, src, dim, ids = step
                parts = vals[src].unbind(dim)
                vals.extend(parts[i] for i in range(len(ids)))
            elif kind == "pointwise":
                v = vals[step[1]]
                vals.append({"neg": torch.neg, "mul": lambda t: t * 3.0, "add": lambda t: t + t}[step[2]](v))
            else:
                vals[step[1]].mul_(2.0)
        if self.copy_outputs:
            return tuple(vals[i] * 1.0 for i in self.plan.outputs)
        return tuple(vals[i] for i in self.plan.outputs)
