"""Fuzz runner: N seeded user programs through every Optimus path, with shrunk repros of failures.

    scripts/fuzz --examples 10000                 # or OPTIMUS_FUZZ_EXAMPLES=10000 scripts/fuzz
    scripts/fuzz --examples 300 --paths optimize,backend --start 5000

Example ``k`` is the program ``fuzz_programs.random_spec(k)`` (a seeded ``random.Random``, so the
same k is the same program on every machine and with any hypothesis version); every 4th one runs
in float64 (tight tolerances), the rest in float32; ``--dtype half`` runs bfloat16 and float16
models (``module.to(dtype)``) by turns. The last lines are the summary
``fuzz: N examples, F failures`` and, for each distinct failure (the check that failed, the
constructs of the shrunk program, and who is responsible: see ``fuzz_checks.blame``), its count
and its minimal program. Exit status 1 when any example failed.
"""

from __future__ import annotations

import argparse
import os
import sys
import time
import warnings
from collections import Counter, defaultdict
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

import torch
from fuzz_checks import FAST_PATHS, PATHS, blame, check, describe, half_dtype, shrink
from fuzz_programs import Spec, features, forward_source, over_arch_spec, random_spec

# what example k is, per --programs
GENERATORS = {"user": random_spec, "over_arch": over_arch_spec}

DTYPES = {
    "float32": torch.float32,
    "float64": torch.float64,
    "bfloat16": torch.bfloat16,
    "float16": torch.float16,
}


def dtype_of(k: int, mode: str, spec: Spec) -> torch.dtype:
    """``mixed``: every 4th example float64, the rest float32; ``half``: float16 and bfloat16
    models by turns (``fuzz_checks.half_dtype``); otherwise the one dtype named."""
    if mode == "mixed":
        return torch.float64 if k % 4 == 3 else torch.float32
    if mode == "half":
        return half_dtype(spec, float16=k % 2 == 1)
    return DTYPES[mode]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--examples", type=int, default=int(os.environ.get("OPTIMUS_FUZZ_EXAMPLES", "100")))
    parser.add_argument("--start", type=int, default=0, help="first example seed")
    parser.add_argument("--paths", default=",".join(FAST_PATHS), help=f"comma list of {sorted(PATHS)}")
    parser.add_argument("--dtype", default="mixed", choices=["mixed", "half", *DTYPES])
    parser.add_argument("--shrink", type=int, default=2, help="failures shrunk per check; 0: none")
    parser.add_argument("--show", type=int, default=40, help="distinct failures printed")
    parser.add_argument(
        "--features",
        default="",
        help="comma list of construct prefixes (fuzz_programs.features, e.g. sliced,lookup_mode): "
        "run only the seeds whose program has one; --examples counts those",
    )
    parser.add_argument(
        "--programs",
        default="user",
        choices=[*sorted(GENERATORS), "sparse"],
        help="user: fuzz_programs.random_spec; over_arch: fuzz_programs.over_arch_spec (slices of "
        "a cat of trainable members of different kinds, trained); sparse: fuzz_sparse.sparse_spec "
        "(torchrec EmbeddingBagCollection lookups under a context, default config; --paths, "
        "--dtype and --features do not apply)",
    )
    args = parser.parse_args(argv)
    if args.programs == "sparse":
        warnings.filterwarnings("ignore")
        import fuzz_sparse

        return 1 if fuzz_sparse.run(args.start, args.examples, args.show) else 0
    paths = [p for p in args.paths.split(",") if p]
    unknown = [p for p in paths if p not in PATHS]
    if unknown:
        parser.error(f"unknown path(s) {unknown}; valid: {sorted(PATHS)}")
    warnings.filterwarnings("ignore")

    seconds: Counter[str] = Counter()
    fired: Counter[str] = Counter()
    by_check: Counter[tuple[str, str]] = Counter()
    shrunk: Counter[str] = Counter()
    classes: dict[tuple[str, str, str], list[str]] = defaultdict(list)  # -> [where seen..., source]
    failures = 0
    invalid: list[str] = []  # "seed/path: eager's error", printed so the generator bug can be found
    start = time.perf_counter()
    wanted = [f for f in args.features.split(",") if f]
    k, done, skipped = args.start - 1, 0, 0
    while done < args.examples:
        k += 1
        spec = GENERATORS[args.programs](k)
        if wanted and not any(f.startswith(w) for f in features(spec) for w in wanted):
            skipped += 1
            continue
        dtype = dtype_of(k, args.dtype, spec)
        results = check(spec, paths, dtype)
        bad = False
        for path, result in results.items():
            seconds[path] += result.seconds
            fired.update(result.fired)
            checks = sorted({m.check for m in result.mismatches})
            if "eager_raises" in checks:
                why = next(m for m in result.mismatches if m.check == "eager_raises")
                invalid.append(f"{k}/{path}: {why}")
                break
            for name in checks:
                bad = True
                by_check[(path, name)] += 1
                if shrunk[name] >= args.shrink or (name == "optimize_state" and path != paths[0]):
                    continue
                shrunk[name] += 1
                small = shrink(spec, path, name, dtype)
                key = (name, describe(small), blame(small, path, name, dtype))
                if not classes[key]:
                    classes[key].append(forward_source(small))
                classes[key].append(f"{k}/{path}/{str(dtype).replace('torch.', '')}")
        failures += bad
        done += 1
        if done % 25 == 0:
            print(
                f"... {done} examples, {failures} failures, {time.perf_counter() - start:.0f} s", flush=True
            )
    total = time.perf_counter() - start
    n = args.examples
    print(
        "per example (s): "
        + ", ".join(f"{p} {seconds[p] / max(n, 1):.3f}" for p in paths)
        + f"; wall {total / max(n, 1):.3f} incl. eager, shrinking and blame"
    )
    print("rules fired: " + ", ".join(f"{r} {c}" for r, c in fired.most_common()))
    print("failing checks: " + ", ".join(f"{p}/{c} {v}" for (p, c), v in by_check.most_common()))
    for i, ((name, feats, who), entries) in enumerate(sorted(classes.items())):
        if i >= args.show:
            break
        print(f"\n--- {name} | blame: {who} | constructs: {feats} | seen: {' '.join(entries[1:6])}")
        print(entries[0])
    if invalid:
        print(f"\n{len(invalid)} invalid programs (eager raised): a generator bug")
        for line in invalid[: args.show]:
            print(f"  {line}")
    if wanted:
        print(f"\nseeds {args.start}..{k}: {skipped} without {','.join(wanted)} skipped")
    print(f"\nfuzz: {n} examples, {failures} failures")
    return 1 if failures or invalid else 0


if __name__ == "__main__":
    raise SystemExit(main())
