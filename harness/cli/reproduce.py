"""`optimus-bench reproduce`: the paper-style table, the whole suite in every mode and phase,
with its report, its plots, the dashboard summaries and the published references beside it."""

from __future__ import annotations

import argparse
import time
from dataclasses import replace
from pathlib import Path
from typing import TYPE_CHECKING

from harness import exit_codes
from harness.cli.common import RESULTS_DIR, add_run_options, config_of, print_summary
from harness.outputs import check_output_dir, check_output_file
from harness.spec import RunConfig

if TYPE_CHECKING:  # the report layer is imported when the command runs, not when the CLI starts
    from harness.report.references import ReferenceModel

NAME = "reproduce"
HELP = "the paper-style table: whole suite, every mode and phase, plus plots"
REFERENCE_TIMEOUT_S = 1200.0


def add_arguments(p: argparse.ArgumentParser) -> None:
    add_run_options(p, models=None, scale="tiny", budget_s=1.0, max_iters=300, warmup=3, min_iters=20,
                    timeout_s=300.0, out="results/reproduce.json")  # fmt: skip
    p.add_argument("--out-dir", default=str(RESULTS_DIR), help="where the report goes (default: results/)")
    p.add_argument("--unpaired", action="store_true",
                   help="speedups as ratios of the cells only: skip the side-by-side measurement of the modes")  # fmt: skip
    p.add_argument("--pair-rounds", type=int, default=15,
                   help="rounds of the side-by-side speedup measurement (default: 15)")  # fmt: skip
    p.add_argument("--pair-processes", type=int, default=2,
                   help="worker processes per mode in the side-by-side measurement; a mode whose processes disagree "
                        "by more than 5%% is marked unstable, not measured again (default: 2)")  # fmt: skip
    p.add_argument("--reference", default="", metavar="NAMES",
                   help="comma list of reference models to measure afresh beside our families, each at its own "
                        "scale, in the same modes and phases, into <out stem>-<name>.json and its own report: "
                        "mlperf_dlrmv2 (MLPerf's DLRMv2 at scale cpu). Default: none (their committed runs are "
                        "shown anyway; docs/harness.md 'Reference model')")  # fmt: skip


def reference_config(cfg: RunConfig, ref: ReferenceModel) -> RunConfig:
    """The reference model's run: reproduce's options (modes, phases, device, timing, tolerances),
    its own provider, model and scale. The cell timeout is at least ``REFERENCE_TIMEOUT_S``: its
    compiled training cells compile a 16M-parameter dense arch (minutes on two cores)."""
    return replace(
        cfg,
        provider=ref.provider,
        models=[ref.model],
        scale=ref.scale,
        timeout_s=max(cfg.timeout_s, REFERENCE_TIMEOUT_S),
    ).validate()


def main(args: argparse.Namespace) -> int:
    from harness.report import paper, references, summaries
    from harness.report.markdown import write_report
    from harness.run.runner import run_suite

    cfg = config_of(args)
    check_output_file(args.out)
    out_dir = check_output_dir(args.out_dir)
    check_output_file(out_dir / f"{Path(args.out).stem}.md", "--out-dir")
    extra = [(ref, reference_config(cfg, ref)) for ref in references.reference_models(args.reference)]
    for ref, _ in extra:
        check_output_file(ref.out_path(args.out))
        check_output_file(out_dir / f"{ref.out_path(args.out).stem}.md", "--out-dir")
    t0 = time.perf_counter()
    n = len(cfg.cells())
    print(f"reproduce: {len(cfg.models)} models x {len(cfg.modes)} modes x {len(cfg.phases)} phases = {n} cells "
          f"at scale {cfg.scale} on {cfg.device}", flush=True)  # fmt: skip
    pair_opt = None
    if not args.unpaired:
        from harness.run.paired import PairOptions

        pair_opt = PairOptions(
            rounds=args.pair_rounds, max_rounds=args.pair_rounds, processes=args.pair_processes,
            max_processes=args.pair_processes, compiles=1, device=cfg.device, seed=cfg.seed,
            threads=cfg.threads, provider=cfg.provider,
        )  # fmt: skip
        pair_opt.check()
    doc = run_suite(
        cfg, args.out, resume=args.resume, retry_failed=args.retry_failed, progress=not args.no_progress
    )
    if pair_opt is not None:
        from harness.run.paired_modes import pair_modes
        from harness.store.results import save_atomic

        t_pair = time.perf_counter()
        doc["paired_speedups"] = pair_modes(doc, pair_opt, log=lambda msg: print(msg, flush=True))
        doc["paired_speedups_s"] = time.perf_counter() - t_pair
        save_atomic(args.out, doc)
    paths = write_report(doc, args.out_dir, Path(args.out).stem, title="Optimus reproduction")
    sections = []
    for ref, ref_cfg in extra:
        t_ref = time.perf_counter()
        ref_out = ref.out_path(args.out)
        print(
            f"reproduce: reference model {ref.name}: {len(ref_cfg.cells())} cells at scale {ref_cfg.scale}",
            flush=True,
        )
        ref_doc = run_suite(
            ref_cfg,
            ref_out,
            resume=args.resume,
            retry_failed=args.retry_failed,
            progress=not args.no_progress,
        )
        ref_paths = write_report(ref_doc, args.out_dir, ref_out.stem, title=f"Reference model: {ref.name}")
        paths += ref_paths
        sections.append(references.reference_section(ref, ref_doc, ref_paths[0].name))
        print(f"reproduce: reference model {ref.name} took {time.perf_counter() - t_ref:.0f} s", flush=True)
    beside = references.section()
    with open(paths[0], "a", encoding="utf-8") as md:  # paths[0] is the markdown report
        md.write("".join("\n" + text + "\n" for text in [*sections, beside]))
    print()
    print(paper.format_paper_table(paper.paper_rows(doc)))
    print()
    for text in sections:
        print(text)
        print()
    dashboard = summaries.target_lines(doc)
    if dashboard:
        print("Dashboard summaries (the torch.compile dashboard's definitions; the report has every mode):")
        print("\n".join(f"  {line}" for line in dashboard))
        print()
    print(beside)
    print()
    print_summary(doc, args.out)
    for p in paths:
        print(f"wrote {p}")
    print(f"reproduce took {time.perf_counter() - t0:.0f} s")
    return exit_codes.OK
