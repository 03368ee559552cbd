"""`optimus-bench`: the command line of the harness.

Why one entry point: nightly CI, asv and people at a terminal all drive the same code, so a
figure printed by one is the figure measured by the others.

    optimus-bench list | models | run | compare | report | reproduce | nightly
"""

from __future__ import annotations

import argparse
import math
import sys
import time
from importlib import metadata
from pathlib import Path

from harness import exit_codes
from harness.modes import mode_registry
from harness.outputs import check_output_dir, check_output_file, check_stem
from harness.spec import (
    DEFAULT_PROVIDER,
    PHASES,
    RunConfig,
    load_provider,
    provider_families,
    provider_scales,
    resolve_device,
)
from harness.store.results import NonFiniteError, ResultsError

RESULTS_DIR = Path("results")


def _version() -> str:
    try:
        return metadata.version("optimus-bench")
    except metadata.PackageNotFoundError:
        return "0.0.0+unknown"


def finite_float(text: str) -> float:
    """argparse type: a finite number (``float`` alone accepts 'nan' and 'inf')."""
    try:
        v = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a number: {text!r}") from None
    if not math.isfinite(v):
        raise argparse.ArgumentTypeError(f"must be a finite number, got {text!r}")
    return v


def _add_run_options(p: argparse.ArgumentParser, *, models: str | None, scale: str, budget_s: float,
                     max_iters: int, warmup: int, min_iters: int, timeout_s: float, out: str) -> None:  # fmt: skip
    p.add_argument("--models", default=models, help="comma list of model families (default: all)")
    p.add_argument("--scale", default=scale, help=f"model scale preset (default: {scale})")
    p.add_argument(
        "--modes",
        default=",".join(mode_registry.names()),
        help=f"comma list of modes (default: all: {','.join(mode_registry.names())})",
    )
    p.add_argument("--phases", default=",".join(PHASES), help="comma list of phases (default: infer,train)")
    p.add_argument("--device", default="auto", help="cpu, cuda or auto (default: cuda if available)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--warmup", type=int, default=warmup, help=f"untimed steps per cell (default: {warmup})")
    p.add_argument(
        "--min-iters", type=int, default=min_iters, help=f"fewest timed steps (default: {min_iters})"
    )
    p.add_argument(
        "--max-iters", type=int, default=max_iters, help=f"most timed steps (default: {max_iters})"
    )
    p.add_argument("--budget-s", type=finite_float, default=budget_s,
                   help=f"stop timing after this many seconds once min-iters are done (default: {budget_s})")  # fmt: skip
    p.add_argument(
        "--timeout-s", type=finite_float, default=timeout_s, help=f"per-cell timeout (default: {timeout_s:g})"
    )
    p.add_argument("--threads", type=int, default=1,
                   help="torch/OpenMP threads per cell; 0 = torch's default (default: 1, steadiest on a shared CPU)")  # fmt: skip
    p.add_argument("--atol", type=finite_float, default=1e-4, help="parity tolerance vs eager (absolute)")
    p.add_argument("--rtol", type=finite_float, default=1e-3, help="parity tolerance vs eager (relative)")
    p.add_argument("--out", default=out, help=f"results file (default: {out})")
    p.add_argument("--resume", action="store_true", help="keep cells already in --out and run only the rest")
    p.add_argument(
        "--retry-failed", action="store_true", help="with --resume: rerun failed and timed-out cells"
    )
    p.add_argument("--no-progress", action="store_true", help="no progress bar")
    p.add_argument("--limit", action="store_true",
                   help="the compile cells also measure the limit: the ideal step time with their fusable groups "
                        "as ideal batched kernels (harness/measure/limit.py, docs/harness.md 'The limit'; three extra "
                        "compiles per compile cell)")  # fmt: skip
    p.add_argument("--memory-margin", type=finite_float, default=None, metavar="M",
                   help="the Optimus modes' OptimusConfig.memory_margin: a rewrite that lifts the estimated peak "
                        "memory must save more than this share of its own time (default: Optimus's own, 0.0; "
                        "1.0: never lift it; docs/optimus.md 'Memory is a cost')")  # fmt: skip
    p.add_argument("--nproc", type=int, default=1,
                   help="ranks per cell: > 1 runs each cell as one torchrun job with the tables sharded by "
                        "torchrec's planner (docs/sharded.md; default: 1, a single process)")  # fmt: skip
    p.add_argument("--sharding", default="auto",
                   help="with --nproc: table_wise, column_wise, table_column_wise, data_parallel or auto "
                        "(the planner chooses; default)")  # fmt: skip
    p.add_argument("--pg-timeout-s", type=finite_float, default=120.0,
                   help="with --nproc: process-group timeout, s; a peer of a hung rank fails after it (default: 120)")  # fmt: skip
    _add_provider_option(p)


PROVIDER_HELP = (
    "the model builder, package.module:function, with models.build's contract (docs/harness.md, "
    f"'Your own model'; default: {DEFAULT_PROVIDER}; without torchrec: models.dense_only:build)"
)


def _add_provider_option(p: argparse.ArgumentParser) -> None:
    p.add_argument("--provider", default=DEFAULT_PROVIDER, help=PROVIDER_HELP)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="optimus-bench",
        description="Benchmark and regression harness for the Optimus graph optimizer.",
    )
    parser.add_argument("--version", action="version", version=f"%(prog)s {_version()}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")

    p = sub.add_parser("list", help="models, scales, modes, phases and Optimus rules")
    _add_provider_option(p)
    p = sub.add_parser("models", help="the model catalog: every family at every scale")
    p.add_argument("--families", help="comma list of families (default: all)")
    p.add_argument("--scales", help="comma list of scales (default: all)")
    p.add_argument(
        "--nodes",
        action="store_true",
        help="count dense-graph FX nodes afresh (Dynamo capture, slow at large scales; default: stored counts)",
    )

    p = sub.add_parser(
        "run", help="run models x modes x phases, one subprocess per cell, into one results file"
    )
    _add_run_options(p, models=None, scale="tiny", budget_s=2.0, max_iters=200, warmup=3, min_iters=5,
                     timeout_s=900.0, out="results/run.json")  # fmt: skip

    p = sub.add_parser(
        "compare",
        help="compare two results files; exit 1 on a significant regression, 3 on missing/failed/non-finite cells",
    )
    p.add_argument("base")
    p.add_argument("new")
    p.add_argument(
        "--alpha", type=finite_float, default=0.01, help="significance level of Mann-Whitney U (default 0.01)"
    )
    p.add_argument(
        "--latency-threshold",
        type=finite_float,
        default=0.05,
        help="min relative latency change (default 0.05)",
    )
    p.add_argument(
        "--memory-threshold",
        type=finite_float,
        default=0.03,
        help="min relative peak-memory change (default 0.03)",
    )
    p.add_argument(
        "--compile-threshold",
        type=finite_float,
        default=0.20,
        help="min relative compile-time change (default 0.20)",
    )
    p.add_argument(
        "--compile-abs-s",
        type=finite_float,
        default=1.0,
        help="min absolute compile-time change, s (default 1.0)",
    )
    p.add_argument("--out", help="also write the markdown table here")

    p = sub.add_parser("report", help="markdown tables and PNG plots of a results file")
    p.add_argument("results")
    p.add_argument("--out-dir", default=str(RESULTS_DIR), help="where to write (default: results/)")
    p.add_argument("--stem", help="file name stem (default: the results file's stem)")

    p = sub.add_parser(
        "reproduce", help="the paper-style table: whole suite, every mode and phase, plus plots"
    )
    _add_run_options(p, models=None, scale="tiny", budget_s=1.0, max_iters=300, warmup=3, min_iters=20,
                     timeout_s=300.0, out="results/reproduce.json")  # fmt: skip
    p.add_argument("--out-dir", default=str(RESULTS_DIR), help="where the report goes (default: results/)")

    p = sub.add_parser(
        "targets", help="an issue's performance goals judged from results files (met / missed)"
    )
    p.add_argument("results", nargs="+", help="harness results JSON files")
    p.add_argument(
        "--goals",
        choices=("issue7", "issue16"),
        default="issue7",
        help="whose goals: issue7 (harness/gate/targets.py, the default) or issue16 (harness/gate/targets_wave2.py)",
    )
    p.add_argument("--json", default=None, help="also write the verdicts here (atomically)")

    p = sub.add_parser(
        "ab",
        help="time two or more modes of one model side by side in one process, interleaved round by round",
    )
    p.add_argument("--model", required=True, help="model family")
    p.add_argument("--scale", default="tiny", help="model scale preset (default: tiny)")
    p.add_argument("--phase", default="infer", help="infer or train (default: infer)")
    p.add_argument("--modes", default="compile,compile+optimus",
                   help="comma list; the first is the base of the speedups (default: compile,compile+optimus)")  # fmt: skip
    p.add_argument(
        "--rounds", type=int, default=15, help="rounds; each times every mode in turn (default: 15)"
    )
    p.add_argument("--steps", type=int, default=5, help="steps per mode per round (default: 5)")
    p.add_argument("--warmup", type=int, default=3, help="untimed steps per mode (default: 3)")
    p.add_argument("--device", default="auto", help="cpu, cuda or auto (default: cuda if available)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--threads", type=int, default=1, help="torch threads; 0 = torch's default (default: 1)")
    p.add_argument(
        "--atol", type=finite_float, default=1e-4, help="parity tolerance vs the base mode (absolute)"
    )
    p.add_argument(
        "--rtol", type=finite_float, default=1e-3, help="parity tolerance vs the base mode (relative)"
    )
    p.add_argument("--out", help="also write the result as JSON here (atomically)")
    _add_provider_option(p)

    p = sub.add_parser(
        "nightly", help="run the suite, compare with the last good nightly; exit 1 on a regression"
    )
    from harness.nightly.job import add_arguments as add_nightly_arguments

    add_nightly_arguments(p)

    p = sub.add_parser(
        "replay",
        help="detection quality of the nightly gates on synthetic histories (false alerts, recall, nights to catch)",
    )
    from harness.nightly.replay import add_arguments as add_replay_arguments

    add_replay_arguments(p)

    p = sub.add_parser(
        "headroom", help="micro-benchmark of one fused tower group: separate, runtime stack, ideal, re-layout"
    )
    from harness.diagnose.headroom import add_arguments as add_headroom_arguments

    add_headroom_arguments(p)

    p = sub.add_parser("changes", help="change points of a nightly history (table and plot)")
    from harness.cli.changes import add_arguments as add_changes_arguments

    add_changes_arguments(p)
    return parser


def _config(args: argparse.Namespace) -> RunConfig:
    load_provider(args.provider)  # a bad --provider is one line and BAD_INPUT, before any cell
    # None (not given) means every family; '' (given empty) is an error, not "all".
    models = ",".join(provider_families(args.provider)) if args.models is None else args.models
    if args.models is not None and not args.models.strip(","):
        raise ValueError("models: empty (--models ''); name at least one family, or omit --models for all")
    if not models:
        raise ValueError(f"models: none given and provider {args.provider!r} lists no FAMILIES")
    return RunConfig(
        models=models.split(","),
        scale=args.scale,
        modes=args.modes.split(","),
        phases=args.phases.split(","),
        device=resolve_device(args.device),
        seed=args.seed,
        warmup=args.warmup,
        min_iters=args.min_iters,
        max_iters=args.max_iters,
        budget_s=args.budget_s,
        timeout_s=args.timeout_s,
        threads=args.threads,
        atol=args.atol,
        rtol=args.rtol,
        provider=args.provider,
        nproc=getattr(args, "nproc", 1),
        sharding=getattr(args, "sharding", "auto"),
        pg_timeout_s=getattr(args, "pg_timeout_s", 120.0),
        limit=bool(getattr(args, "limit", False)),
        memory_margin=getattr(args, "memory_margin", None),
    ).validate()


def cmd_list(args: argparse.Namespace) -> int:
    try:
        families, scales = provider_families(args.provider), provider_scales(args.provider)
    except (ImportError, ValueError) as e:  # ProviderError is a ValueError
        families, scales = (), ()
        print(f"models: unavailable ({e})")
    print("models: " + ", ".join(families))
    print("scales: " + ", ".join(scales))
    print("modes:  " + ", ".join(mode_registry.names()))
    print("phases: " + ", ".join(PHASES))
    try:
        import optimus

        print("rules:  " + ", ".join(optimus.RULES))  # type: ignore[attr-defined]
    except (ImportError, AttributeError) as e:
        print(f"rules:  unavailable (optimus: {e})")
    return 0


def cmd_models(args: argparse.Namespace) -> int:
    import models
    from harness.spec import parse_list

    families = parse_list(args.families, "families", models.FAMILIES) if args.families else models.FAMILIES
    scales = parse_list(args.scales, "scales", models.SCALES) if args.scales else models.SCALES
    rows = models.catalog.rows(nodes=True if args.nodes else None, families=families, scales=scales)
    print(models.catalog.format_table(rows))
    return 0


def _print_summary(doc: dict, out: str) -> None:
    counts: dict[str, int] = {}
    for c in doc["cells"]:
        counts[c["status"]] = counts.get(c["status"], 0) + 1
    print(f"wrote {out}: " + ", ".join(f"{n} {s}" for s, n in sorted(counts.items())))


def cmd_run(args: argparse.Namespace) -> int:
    from harness.run.runner import run_suite

    cfg = _config(args)
    check_output_file(args.out)  # before measuring: a bad path must not cost the whole run
    plans = _plan_all(cfg) if cfg.nproc > 1 else None
    doc = run_suite(
        cfg, args.out, resume=args.resume, retry_failed=args.retry_failed, progress=not args.no_progress,
        sharded_plans=plans,
    )  # fmt: skip
    _print_summary(doc, args.out)
    return exit_codes.OK


def _plan_all(cfg: RunConfig) -> dict[str, dict]:
    """Plan every model's tables here, before any rank starts: a planner that cannot place them
    is one line and BAD_INPUT (``harness.run.sharded.plan.PlanError`` is a ValueError)."""
    from harness.run.sharded import launch
    from harness.run.sharded.plan import PlanError

    if cfg.device == "cuda":
        import torch

        if torch.cuda.device_count() < cfg.nproc:
            raise ValueError(
                f"nproc: {cfg.nproc} ranks need {cfg.nproc} GPUs, this host has {torch.cuda.device_count()}"
            )
    config = cfg.as_dict()
    plans = {}
    for model in cfg.models:
        try:
            plans[model] = launch.plan_for(config, model)
        except PlanError as e:
            raise PlanError(f"sharding plan for {model}/{cfg.scale}: {e}") from None
        print(f"plan {model}/{cfg.scale} over {cfg.nproc} ranks: {launch.planmod.describe(plans[model])}",
              file=sys.stderr, flush=True)  # fmt: skip
    return plans


def cmd_compare(args: argparse.Namespace) -> int:
    from harness.gate import compare
    from harness.store import results

    th = compare.Thresholds(
        alpha=args.alpha,
        latency=args.latency_threshold,
        memory=args.memory_threshold,
        compile=args.compile_threshold,
        compile_abs=args.compile_abs_s,
    )
    if args.out:
        check_output_file(args.out)
    rows = compare.compare_docs(results.load(args.base), results.load(args.new), th)
    text = compare.format_rows(rows)
    print(text)
    if args.out:
        results.write_atomic(args.out, text + "\n")
    rc = compare.exit_code(rows)
    if rc == exit_codes.INCOMPLETE:
        lost = compare.incomplete(rows)
        print(f"optimus-bench compare: incomplete: {len(lost)} cell(s) of {args.base} are missing, "
              f"failed or non-finite in {args.new} (first: {lost[0].cell}, {lost[0].verdict})", file=sys.stderr)  # fmt: skip
    return rc


def cmd_report(args: argparse.Namespace) -> int:
    from harness.report.markdown import write_report
    from harness.store import results

    stem = check_stem(args.stem) if args.stem is not None else Path(args.results).stem
    doc = results.load(args.results)
    if not doc["cells"]:
        raise ValueError(f"{args.results}: no cells to report")
    out_dir = check_output_dir(args.out_dir)
    check_output_file(out_dir / f"{stem}.md", "--out-dir/--stem")
    for p in write_report(doc, out_dir, stem):
        print(f"wrote {p}")
    return exit_codes.OK


def cmd_reproduce(args: argparse.Namespace) -> int:
    from harness.report import paper, references
    from harness.report.markdown import write_report
    from harness.run.runner import run_suite

    cfg = _config(args)
    check_output_file(args.out)
    out_dir = check_output_dir(args.out_dir)
    check_output_file(out_dir / f"{Path(args.out).stem}.md", "--out-dir")
    t0 = time.perf_counter()
    n = len(cfg.cells())
    print(f"reproduce: {len(cfg.models)} models x {len(cfg.modes)} modes x {len(cfg.phases)} phases = {n} cells "
          f"at scale {cfg.scale} on {cfg.device}", flush=True)  # fmt: skip
    doc = run_suite(
        cfg, args.out, resume=args.resume, retry_failed=args.retry_failed, progress=not args.no_progress
    )
    paths = write_report(doc, args.out_dir, Path(args.out).stem, title="Optimus reproduction")
    beside = references.section()
    with open(paths[0], "a", encoding="utf-8") as md:  # paths[0] is the markdown report
        md.write("\n" + beside + "\n")
    print()
    print(paper.format_paper_table(paper.paper_rows(doc)))
    print()
    print(beside)
    print()
    _print_summary(doc, args.out)
    for p in paths:
        print(f"wrote {p}")
    print(f"reproduce took {time.perf_counter() - t0:.0f} s")
    return exit_codes.OK


def cmd_targets(args: argparse.Namespace) -> int:
    import json

    from harness.gate import targets, targets_wave2
    from harness.store import results

    if args.json:
        check_output_file(args.json, "--json")
    judge = targets_wave2.verdicts if args.goals == "issue16" else targets.verdicts
    found = judge(results.load(p) for p in args.results)
    print(targets.render(found))
    if args.json:
        results.write_atomic(args.json, json.dumps(targets.as_json(found), indent=1) + "\n")
    return exit_codes.OK


def cmd_ab(args: argparse.Namespace) -> int:
    import json

    from harness.run import interleaved
    from harness.store import results

    names = [m.strip() for m in args.modes.split(",") if m.strip()]
    load_provider(args.provider)  # a bad --provider is one line and BAD_INPUT, before any work
    if args.out:
        check_output_file(args.out)  # before measuring: the measurement takes minutes
    doc = interleaved.run_ab(
        args.model, args.scale, args.phase, names,
        rounds=args.rounds, steps=args.steps, warmup=args.warmup, device=resolve_device(args.device),
        seed=args.seed, threads=args.threads, atol=args.atol, rtol=args.rtol, provider=args.provider,
        log=lambda msg: print(msg, file=sys.stderr, flush=True),
    )  # fmt: skip
    print(interleaved.format_ab(doc))
    if args.out:
        results.write_atomic(args.out, json.dumps(doc, indent=1) + "\n")
        print(f"wrote {args.out}")
    mismatched = [m for m, r in doc["modes"].items() if not r.get("parity_vs_base", {"ok": True})["ok"]]
    return exit_codes.MISMATCH if mismatched else exit_codes.OK


def cmd_nightly(args: argparse.Namespace) -> int:
    from harness.nightly.job import main_from_args

    return main_from_args(args)


def cmd_replay(args: argparse.Namespace) -> int:
    from harness.nightly.replay import main_from_args

    return main_from_args(args)


def cmd_changes(args: argparse.Namespace) -> int:
    from harness.cli.changes import main_from_args

    return main_from_args(args)


def cmd_headroom(args: argparse.Namespace) -> int:
    from harness.diagnose.headroom import main_from_args

    return main_from_args(args)


COMMANDS = {
    "list": cmd_list,
    "models": cmd_models,
    "run": cmd_run,
    "compare": cmd_compare,
    "report": cmd_report,
    "reproduce": cmd_reproduce,
    "targets": cmd_targets,
    "ab": cmd_ab,
    "nightly": cmd_nightly,
    "replay": cmd_replay,
    "changes": cmd_changes,
    "headroom": cmd_headroom,
}


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    if args.command is None:
        parser.print_help()
        return exit_codes.OK
    try:
        return COMMANDS[args.command](args)
    except NonFiniteError as e:  # garbage recorded as a figure: lost data, not a typo
        print(f"optimus-bench {args.command}: incomplete: {e}", file=sys.stderr)
        return exit_codes.INCOMPLETE
    except (ValueError, ResultsError) as e:  # OutputPathError is a ValueError
        print(f"optimus-bench {args.command}: error: {e}", file=sys.stderr)
        return exit_codes.BAD_INPUT
    except KeyboardInterrupt:
        print(
            f"optimus-bench {args.command}: interrupted; finished cells are saved (use --resume)",
            file=sys.stderr,
        )
        return exit_codes.INTERRUPTED
