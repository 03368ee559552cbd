"""Side by side: an Optimus mode with the re-layout's gradient-buffer reuse on, and off.

Why: the reuse (``optimus.layout_relayout``, small groups keep their gradient buffer so its
views are made once) saves microseconds per fused member per backward. On a whole model that is
about 1% of a step, below what two cells timed minutes apart can resolve, so this builds both
variants in one process and times them in turns (``harness.interleaved``), reporting the median
per-round speedup of ``reuse`` over ``no-reuse`` with a bootstrap 95% interval.

    PYTHONPATH=. python scripts/ab_grad_reuse.py --model towers --scale large \
        --mode compile+optimus --rounds 15
"""

from __future__ import annotations

import argparse
import json
import os
import sys

sys.path.insert(0, os.path.join(os.path.dirname(__file__), ".."))

OPTIMUS_MODES = ("eager+optimus", "compile+optimus")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="towers")
    parser.add_argument("--scale", default="medium")
    parser.add_argument("--mode", default="compile+optimus", choices=OPTIMUS_MODES)
    parser.add_argument("--rounds", type=int, default=15)
    parser.add_argument("--steps", type=int, default=5, help="training steps per round")
    parser.add_argument("--threads", type=int, default=1)
    args = parser.parse_args()
    if args.rounds < 2 or args.steps < 1 or args.threads < 1:
        parser.error("--rounds must be >= 2, --steps and --threads >= 1")

    import torch

    import optimus.layout_relayout as relayout
    from harness import interleaved, modes
    from harness.spec import DEFAULT_PROVIDER

    torch.set_num_threads(args.threads)
    modes.disable_compile_caches()
    limit = relayout.REUSE_MAX_MEMBER_BYTES
    contenders = []
    try:
        for name, max_bytes in (("reuse", limit), ("no-reuse", 0)):
            relayout.REUSE_MAX_MEMBER_BYTES = max_bytes  # read when a group is laid out
            c = interleaved.contender(
                args.model, args.scale, args.mode, "train", device="cpu", seed=0, provider=DEFAULT_PROVIDER
            )
            c.mode = name
            print(f"{name}: first call {c.first_call_s:.1f} s", flush=True)
            contenders.append(c)
    finally:
        relayout.REUSE_MAX_MEMBER_BYTES = limit
    diff = (contenders[0].first_out - contenders[1].first_out).abs().max().item()
    if diff > 1e-5:
        raise SystemExit(f"the two variants' first outputs differ by {diff}")
    samples = interleaved.interleave(contenders, rounds=args.rounds, steps=args.steps, warmup=2)
    summary = interleaved.summarize(samples, "no-reuse")
    print(json.dumps({"args": vars(args), "max_abs_diff": diff, "modes": summary}, indent=1))


if __name__ == "__main__":
    main()
