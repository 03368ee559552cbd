"""`optimus-bench pair BASE NEW`: two commits measured side by side, cell by cell
(``harness.run.pair_grid``)."""

from __future__ import annotations

import argparse
import sys
from typing import TYPE_CHECKING, Any

from harness import exit_codes
from harness.cli.common import add_provider_option, finite_float
from harness.outputs import check_output_file
from harness.spec import PHASES, load_provider, parse_list, provider_families, resolve_device

if TYPE_CHECKING:
    from harness.run.paired import PairOptions

NAME = "pair"
HELP = "measure two commits side by side: worker processes per commit, timed in alternating rounds"


def add_pair_options(p: argparse.ArgumentParser, *, rounds: int = 15) -> None:
    """The measurement options ``pair``, ``bisect`` and the nightly share."""
    p.add_argument("--rounds", type=int, default=rounds, help=f"timed rounds; each times every worker once (default: {rounds})")  # fmt: skip
    p.add_argument("--max-rounds", type=int, default=3 * rounds,
                   help=f"while the interval straddles the threshold, time more rounds, up to this many (default: {3 * rounds})")  # fmt: skip
    p.add_argument("--steps", type=int, default=5, help="steps per worker per round (default: 5)")
    p.add_argument("--warmup", type=int, default=3, help="untimed steps per worker (default: 3)")
    p.add_argument(
        "--round-warmup-ms",
        type=finite_float,
        default=50.0,
        help="untimed steps at the start of each worker's turn, enough to fill this many ms: a worker that idled while the others took their turns runs its first steps slower (default: 50; 0: none)",
    )
    p.add_argument("--processes", type=int, default=2, help="worker processes per side (default: 2)")
    p.add_argument("--max-processes", type=int, default=4,
                   help="most workers per side when a side's processes disagree (default: 4)")  # fmt: skip
    p.add_argument("--process-spread", type=finite_float, default=0.05,
                   help="a side whose workers' medians differ by more than this fraction is unstable (default: 0.05)")  # fmt: skip
    p.add_argument("--compiles", type=int, default=3, help="cold compiles per side, for compile time (default: 3)")  # fmt: skip
    p.add_argument("--threshold", type=finite_float, default=0.02,
                   help="a cell is slower when its whole 95%% interval is above 1 + this (default: 0.02)")  # fmt: skip
    p.add_argument("--device", default="auto", help="cpu, cuda or auto (default: cuda if available)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--threads", type=int, default=1, help="torch/OpenMP threads per worker (default: 1)")
    p.add_argument("--atol", type=finite_float, default=1e-4, help="parity tolerance, base vs new (absolute)")
    p.add_argument("--rtol", type=finite_float, default=1e-3, help="parity tolerance, base vs new (relative)")
    p.add_argument("--repo", default=".", help="the git repository of BASE and NEW (default: .)")
    add_provider_option(p)


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("base", metavar="BASE", help="base commit (any git revision), or a checkout directory")
    p.add_argument("new", metavar="NEW", help="new commit (any git revision), or a checkout directory")
    p.add_argument("--models", default=None, help="comma list of model families (default: all)")
    p.add_argument(
        "--modes", default="compile+optimus", help="comma list of modes (default: compile+optimus)"
    )
    p.add_argument("--phases", default=",".join(PHASES), help="comma list of phases (default: infer,train)")
    p.add_argument("--scale", default="tiny", help="model scale preset (default: tiny)")
    p.add_argument("--out", help="results file, rewritten atomically after every cell")
    add_pair_options(p)


def options_of(args: argparse.Namespace) -> PairOptions:
    from harness.run.paired import PairOptions

    opt = PairOptions(
        rounds=args.rounds, max_rounds=max(args.max_rounds, args.rounds), steps=args.steps, warmup=args.warmup, processes=args.processes,
        max_processes=args.max_processes, compiles=args.compiles, process_spread=args.process_spread,
        device=resolve_device(args.device), seed=args.seed, threads=args.threads, atol=args.atol,
        rtol=args.rtol, provider=args.provider, round_warmup_ms=args.round_warmup_ms,
    )  # fmt: skip
    opt.check()
    if args.threshold < 0:
        raise ValueError(f"threshold: must be >= 0, got {args.threshold}")
    return opt


def main(args: argparse.Namespace) -> int:
    from harness.modes import mode_registry
    from harness.run import checkouts, pair_grid

    load_provider(args.provider)
    opt = options_of(args)
    families = tuple(provider_families(args.provider))
    models = parse_list(args.models or ",".join(families), "models", families)
    modes = parse_list(args.modes, "modes", tuple(mode_registry.names()))
    phases = parse_list(args.phases, "phases", PHASES)
    if args.out:
        check_output_file(args.out)
    repo = checkouts.repo_root(args.repo)
    cells = [(m, args.scale, mode, ph) for m in models for mode in modes for ph in phases]
    log = lambda msg: print(msg, file=sys.stderr, flush=True)  # noqa: E731
    with checkouts.checked_out(repo, [args.base, args.new]) as (base, new):
        doc = pair_grid.run_grid(base, new, cells, opt, threshold=args.threshold, out=args.out, log=log)
    print(pair_grid.format_grid(doc))
    if args.out:
        print(f"wrote {args.out}")
    return exit_code(doc)


def exit_code(doc: dict[str, Any]) -> int:
    """INCOMPLETE when a cell failed or mismatched; REGRESSION when a cell is slower; else OK."""
    if any(c["status"] != "ok" for c in doc["cells"]):
        return exit_codes.INCOMPLETE
    if any(c["paired"]["verdict"] == "slower" for c in doc["cells"]):
        return exit_codes.REGRESSION
    return exit_codes.OK
