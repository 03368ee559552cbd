"""Per-call cost of the check optimize()'s result runs before each call (optimus/specialized.py).

    PYTHONPATH=. python scripts/bench_call_check.py [--scale large] [--forward]

Prints the module count, how many modules' ``training`` flags are checked, the cost of the
check alone (input signature + mode tuple) and of checking every module's flag instead; with
``--forward``, also optimizes the dense arch and times a no-grad forward with and without the
check (noisy on a shared CPU: the check is microseconds, the forward milliseconds).
"""

from __future__ import annotations

import argparse
import time
from collections.abc import Callable
from typing import Any

import torch

import models
import optimus
from optimus.call_signature import InputSignature, mode_sensitive_modules, modes
from optimus.specialized import GUARD


def best_us(fn: Callable[[], Any], n: int, repeats: int = 5) -> float:
    for _ in range(min(n, 100)):
        fn()
    best = float("inf")
    for _ in range(repeats):
        start = time.perf_counter()
        for _ in range(n):
            fn()
        best = min(best, (time.perf_counter() - start) / n)
    return best * 1e6


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--family", default="towers")
    parser.add_argument("--scale", default="large")
    parser.add_argument("--forward", action="store_true")
    args = parser.parse_args()
    built = models.build(args.family, scale=args.scale, device="cpu", seed=0)
    dense = built.module.dense
    inputs = tuple(built.dense_inputs(built.batches[0]))
    everything = list(dense.modules())
    sensitive = mode_sensitive_modules(dense)
    signature, captured = InputSignature(inputs), modes(sensitive)
    all_flags = tuple(m.training for m in everything)
    print(
        f"{args.family} {args.scale}: {len(everything)} modules, {len(sensitive)} mode-sensitive, "
        f"{len(inputs)} inputs"
    )
    check = best_us(lambda: captured == modes(sensitive) and signature.matches(inputs), 20000)
    every = best_us(lambda: all_flags == tuple([m.training for m in everything]), 2000)
    print(f"check per call: {check:.2f} us (every module's flag instead: {every:.1f} us)")
    if args.forward:
        gm = optimus.optimize(dense, inputs)
        guard = gm.__dict__[GUARD]
        with torch.no_grad():
            checked = best_us(lambda: gm(*inputs), 20)
            del gm.__dict__[GUARD]
            unchecked = best_us(lambda: gm(*inputs), 20)
            object.__setattr__(gm, GUARD, guard)
        print(f"no-grad forward: {checked:.0f} us checked, {unchecked:.0f} us unchecked")


if __name__ == "__main__":
    main()
