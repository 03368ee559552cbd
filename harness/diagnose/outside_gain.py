"""The rules' own gain on models this repository did not write (``models.outside``).

    python -m harness.diagnose.outside_gain --out-dir results/outside-corpus [--models deepctr.MMOE,...]
        [--zoos rechub,...] [--guard off|graph|rules] [--rounds 9 --steps 5 --block-ms 25]
    python -m harness.diagnose.outside_gain --from-json RUN.json [RUN2.json ...]

WHY: does Optimus find structure in other people's models, not only in its own? The gain of the
rules alone is ``optimize(rules=[])`` (the same Dynamo capture, the same re-layout config, no
rewrite) against ``optimize()`` with every rule, in eager (no compiler), timed interleaved in one
process (``harness.run.interleaved``), in blocks of at least ``--block-ms`` (more steps where a
step is short: a sub-millisecond block is shorter than a scheduler's slice, and one preemption
then decides a round): forward, and forward+backward in train mode. Each model also
gets a parity check against eager (values, every parameter's gradient, every buffer after one
step) and the report's own account: nodes before/after, rules fired, declines, capture path.
A model that fails to build or optimize is a row with its error; the others go on.

The report's first table is per zoo (DeepCTR-Torch, torch-rechub, RecBole, torchrec): the median
gain forward and forward+backward and the lowest row, against the corpus targets, because a pooled
median can hide a zoo the rules do not fit. The second counts, per rule, the models of each zoo it
fired on: a rule that helps one zoo and not the others is fitted to a way of writing a model. The
third puts each zoo's implementation of one architecture side by side.

``--guard graph|rules`` runs the measured guard (``OptimusConfig.guard``, :mod:`optimus.guard`) on
the Optimus side, in the parity step and for each phase's contender: the figure is then that of
what ``optimize`` keeps, and each phase records the guard's verdict. Off by default: the report
is the rules' own gain, comparable with the earlier runs; a guarded run says so in its header
and JSON (``"guard"``), and ``--from-json`` will not join it to a run measured otherwise.
"""

from __future__ import annotations

import argparse
import copy
import json
import sys
import traceback
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch import nn

import optimus
from harness.measure import timing
from harness.run import interleaved
from models import outside
from optimus.atomic import write_atomic
from optimus.config import OptimusConfig
from optimus.params.relayout import RelayoutParams
from optimus.report import OptimusReport

SCHEMA = "optimus-bench/outside-gain/1"
# a timed block lasts at least this long (harness.measure.timing.block_steps): at 5 steps a block,
# torchrec's sub-millisecond steps gave intervals of 0.1-11x on a shared machine
BLOCK_MS = 25.0
GUARDS = ("off", "graph", "rules")  # OptimusConfig.guard
RTOL, ATOL = 1e-4, 1e-5
WHOLE_GRAPH = ("export", "graph")
# On the per-call Dynamo path the two contenders' forwards are one code object to Dynamo: they
# share its cache and recompile limit, so one of them may silently run eager. Not comparable.
SKIP_WHY = "per-call Dynamo path, the two contenders share Dynamo's code cache (not comparable)"
PHASES = ("forward+backward", "forward")
# The corpus targets, per zoo: the median gain of each phase, and the lowest row of either phase.
TARGET_MEDIAN = 1.2
TARGET_LOWEST = 0.98


def _loss(out: Any) -> torch.Tensor:
    outs = out if isinstance(out, (list, tuple)) else (out,)
    return sum(((o.float() * (i + 1)).square().mean() for i, o in enumerate(outs)), torch.zeros(()))


def _step(module: nn.Module, fn: Callable[..., Any], inputs: Sequence[Any], seed: int = 0) -> Any:
    torch.manual_seed(seed)
    out = fn(*inputs)
    _loss(out).backward()
    return out


def _same_grad(a: torch.Tensor | None, b: torch.Tensor | None) -> bool:
    if a is None or b is None:
        return a is None and b is None
    return torch.allclose(b, a, rtol=RTOL, atol=ATOL)


def optimus_config(guard: str = "off") -> OptimusConfig:
    """The Optimus side's config: the re-layout, and the measured guard ``guard``."""
    return OptimusConfig(layout=RelayoutParams(), guard=guard)


def guard_of(doc: dict[str, Any]) -> str:
    """The guard a run was measured with (a run from before the option was unguarded)."""
    return str(doc.get("guard", "off"))


def parity(name: str, seed: int = 0, guard: str = "off") -> dict[str, Any]:
    """Eager against ``optimize(relayout)`` on one train step: outputs, gradients, buffers."""
    model, inputs = outside.build(name, seed)
    ref = copy.deepcopy(model)
    gm = optimus.optimize(model, inputs, config=optimus_config(guard))
    want, got = _step(ref, ref, inputs), _step(model, gm, inputs)
    wants = want if isinstance(want, (list, tuple)) else (want,)
    gots = got if isinstance(got, (list, tuple)) else (got,)
    values = all(torch.allclose(g, w, rtol=RTOL, atol=ATOL) for g, w in zip(gots, wants, strict=True))
    grads = all(_same_grad(p.grad, q.grad) for p, q in zip(ref.parameters(), model.parameters(), strict=True))
    buffers = all(
        torch.allclose(b.float(), c.float(), rtol=RTOL, atol=ATOL)
        for b, c in zip(ref.buffers(), model.buffers(), strict=True)
    )
    report: OptimusReport = gm.optimus_report  # type: ignore[assignment]
    return {
        "values": values,
        "grads": grads,
        "buffers": buffers,
        "nodes_before": report.nodes_before,
        "nodes_after": report.nodes_after,
        "rules_fired": dict(report.rules_fired),
        "declined_reasons": dict(report.declined_reasons),
        "capture": report.capture,
        "capture_reason": report.capture_reason,
        "guard": report.guard,
        "guard_rejected": dict(report.guard_rejected),
    }


def _contender(
    label: str, module: nn.Module, fn: Callable[..., Any], inputs: Sequence[Any], train: bool
) -> Any:
    def forward() -> Any:
        with torch.no_grad():
            return fn(*inputs)

    def train_step() -> Any:
        module.zero_grad(set_to_none=True)
        return _loss(fn(*inputs)).backward()

    step = train_step if train else forward
    return timing.Contender(label, step, 0.0, None)


def gain(
    name: str, rounds: int, steps: int, seed: int = 0, guard: str = "off", block_ms: float = 0.0
) -> dict[str, Any]:
    """Median per-round speedup (and its bootstrap interval) of the rules over plain capture;
    with ``guard`` on, of what the guarded ``optimize`` kept (its verdict is the phase's
    ``guard``). The plain capture side is never guarded: it rewrites nothing. A block is
    ``steps`` steps, or more so that it lasts ``block_ms`` (the phase's ``steps``)."""
    out: dict[str, Any] = {}
    for phase, train in (("forward", False), ("forward+backward", True)):
        contenders = []
        verdict = ""
        for label, rules, config in (
            ("capture", [], optimus_config()),
            ("rules", None, optimus_config(guard)),
        ):
            model, inputs = outside.build(name, seed)
            model.train(train)
            gm = optimus.optimize(model, inputs, rules=rules, config=config)
            report: OptimusReport = gm.optimus_report  # type: ignore[assignment]
            if report.capture not in WHOLE_GRAPH:
                return {"skipped": f"capture {report.capture!r}: {SKIP_WHY}"}
            verdict = report.guard
            contenders.append(_contender(label, model, gm, inputs, train))
        for c in contenders:  # warm, before the block's length is read from them
            for _ in range(3):
                c.step()
        per_block = timing.block_steps([c.step for c in contenders], steps, block_ms / 1e3)
        samples = timing.interleave(contenders, rounds=rounds, steps=per_block, warmup=0)
        summary = interleaved.summarize(samples, "capture")
        out[phase] = {
            "speedup": summary["rules"]["speedup_vs_base"],
            "ci95": summary["rules"]["speedup_ci95"],
            "capture_ms": summary["capture"]["median_ms"],
            "rules_ms": summary["rules"]["median_ms"],
            "steps": per_block,
        }
        if guard != "off":
            out[phase]["guard"] = verdict
    return out


def measure(
    names: Sequence[str], rounds: int, steps: int, guard: str = "off", block_ms: float = 0.0
) -> dict[str, Any]:
    rows: dict[str, Any] = {}
    for i, name in enumerate(names, 1):
        print(f"[{i}/{len(names)}] {name}", file=sys.stderr, flush=True)
        try:
            rows[name] = {
                "parity": parity(name, guard=guard),
                "gain": gain(name, rounds, steps, guard=guard, block_ms=block_ms),
            }
        except Exception as exc:  # one model's failure is its row; the others still run
            rows[name] = {"error": f"{type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else ''}"}
            traceback.print_exc(limit=2)
    doc = {
        "schema": SCHEMA,
        "torch": torch.__version__,
        "threads": torch.get_num_threads(),
        "rounds": rounds,
        "steps": steps,
        "block_ms": block_ms,
        "guard": guard,
        "models": rows,
    }
    return {**doc, "zoos": per_zoo(doc), "rules_by_zoo": rules_by_zoo(doc)}


def per_zoo(doc: dict[str, Any]) -> dict[str, dict[str, Any]]:
    """Per zoo, and ``"all"`` pooled: models measured, the median gain of each phase, the lowest
    row (model, phase, gain) and whether the targets hold. Rows with an error or no figure are
    counted, not measured."""
    groups: dict[str, list[tuple[str, dict[str, Any]]]] = {}
    for name, row in doc["models"].items():
        groups.setdefault(outside.zoo_of(name), []).append((name, row))
    if len(groups) > 1:
        groups["all"] = [(n, r) for rows in list(groups.values()) for n, r in rows]
    out: dict[str, dict[str, Any]] = {}
    for zoo, rows in groups.items():
        timed = [(n, r["gain"]) for n, r in rows if "gain" in r and "skipped" not in r["gain"]]
        per_call = sum(1 for _, r in rows if "skipped" in r.get("gain", {}))
        summary: dict[str, Any] = {"models": len(rows), "measured": len(timed), "per_call": per_call}
        if timed:
            for phase in PHASES:
                summary[phase] = float(np.median([g[phase]["speedup"] for _, g in timed]))
            lowest = min(((g[ph]["speedup"], n, ph) for n, g in timed for ph in PHASES), key=lambda t: t[0])
            summary["lowest"] = {"model": lowest[1], "phase": lowest[2], "speedup": lowest[0]}
            summary["targets_met"] = (
                all(summary[ph] >= TARGET_MEDIAN for ph in PHASES) and lowest[0] >= TARGET_LOWEST
            )
        out[zoo] = summary
    return out


def rules_by_zoo(doc: dict[str, Any]) -> dict[str, dict[str, int]]:
    """``{rule: {zoo: how many of the zoo's models it fired on}}``, from the parity step's report."""
    counts: dict[str, dict[str, int]] = {}
    for name, row in doc["models"].items():
        if "parity" not in row:
            continue
        for rule, times in row["parity"]["rules_fired"].items():
            if times:
                per = counts.setdefault(rule, {})
                per[outside.zoo_of(name)] = per.get(outside.zoo_of(name), 0) + 1
    return dict(sorted(counts.items()))


def _zoo_models(doc: dict[str, Any]) -> dict[str, int]:
    found: dict[str, int] = {}
    for name, row in doc["models"].items():
        if "parity" in row:
            found[outside.zoo_of(name)] = found.get(outside.zoo_of(name), 0) + 1
    return found


def zoo_markdown(doc: dict[str, Any]) -> list[str]:
    """The per-zoo table and the rules x zoos table."""
    lines = [
        f"## Per zoo (targets: median forward+backward and median forward >= {TARGET_MEDIAN}x,"
        f" no row below {TARGET_LOWEST}x)",
        "",
        "| zoo | models (timed) | median forward+backward | median forward | lowest | targets |",
        "| --- | --- | --- | --- | --- | --- |",
    ]
    for zoo, z in per_zoo(doc).items():
        if not z["measured"]:
            why = f"{z['per_call']} on the per-call Dynamo path" if z["per_call"] else "errors"
            lines.append(f"| {zoo} | {z['models']} (0) | - | - | - | no figure ({why}) |")
            continue
        low = z["lowest"]
        lines.append(
            f"| {zoo} | {z['models']} ({z['measured']}) | {z['forward+backward']:.2f}x | {z['forward']:.2f}x"
            f" | {low['speedup']:.2f}x ({low['model']}, {low['phase']}) | {'met' if z['targets_met'] else 'missed'} |"
        )
    zoos = _zoo_models(doc)
    lines += [
        "",
        "## Which rules fire in which zoo (models of the zoo the rule fired on, of those optimized)",
        "",
        "| rule | " + " | ".join(f"{zoo} ({n})" for zoo, n in zoos.items()) + " |",
        "| --- |" + " --- |" * len(zoos),
    ]
    for rule, per in rules_by_zoo(doc).items():
        lines.append(f"| {rule} | " + " | ".join(str(per.get(zoo, 0)) for zoo in zoos) + " |")
    return lines + architecture_markdown(doc)


def architecture_markdown(doc: dict[str, Any]) -> list[str]:
    """One architecture, each zoo's implementation: forward+backward / forward gain, side by side
    (``models.outside.ARCHITECTURES``; an architecture with fewer than two rows here is left out)."""
    rows = []
    for arch, names in outside.ARCHITECTURES.items():
        cells = []
        for name in names:
            row = doc["models"].get(name)
            if row is None:
                continue
            gain = row.get("gain", {})
            if "error" in row:
                fig = "error"
            elif "skipped" in gain:
                fig = "n/a"
            else:
                fig = f"{gain['forward+backward']['speedup']:.2f}x / {gain['forward']['speedup']:.2f}x"
            cells.append(f"{name} {fig}")
        if len(cells) >= 2:
            rows.append(f"| {arch} | " + "; ".join(cells) + " |")
    if not rows:
        return []
    return [
        "",
        "## One architecture, each zoo (forward+backward / forward)",
        "",
        "| architecture | each zoo's implementation |",
        "| --- | --- |",
        *rows,
    ]


def _block(doc: dict[str, Any]) -> str:
    if not doc.get("block_ms"):  # runs before blocks had a length: a fixed count
        return f"{doc['steps']} steps"
    return f"blocks of at least {doc['block_ms']:g} ms (at least {doc['steps']} steps; each phase's count in the JSON)"


def _fmt_gain(g: dict[str, Any]) -> str:
    lo, hi = g["ci95"]
    verdict = f", guard {g['guard']}" if "guard" in g else ""
    return f"{g['speedup']:.2f}x ({lo:.2f}-{hi:.2f}{verdict})"


def _guard_header(doc: dict[str, Any]) -> str:
    guard = guard_of(doc)
    if guard == "off":
        return "Guard: off (the rules' own gain; `--guard graph|rules` measures what the guarded optimize keeps)."
    return (
        f"Guard: {guard} (OptimusConfig(guard={guard!r}) on the Optimus side: the figures are those of"
        " what the guarded optimize kept; each phase's cell gives the guard's verdict)."
    )


def markdown(doc: dict[str, Any]) -> str:
    lines = [
        "# The rules' own gain on the outside corpus",
        "",
        f"torch {doc['torch']}, {doc['threads']} thread(s), eager, re-layout on; optimize() with every rule"
        f" against optimize(rules=[]) (the same capture); medians of {doc['rounds']} interleaved rounds of"
        f" {_block(doc)}, bootstrap 95% interval. Parity: one train step against eager"
        " (outputs, every gradient, every buffer).",
        "",
        _guard_header(doc),
        "",
        f"n/a: {SKIP_WHY}.",
        "",
        *zoo_markdown(doc),
        "",
        "## Per model",
        "",
        "| model | nodes before -> after | rules fired | forward | forward+backward | parity | capture |",
        "| --- | --- | --- | --- | --- | --- | --- |",
    ]
    for name, row in doc["models"].items():
        if "error" in row:
            lines.append(f"| {name} | - | - | - | - | error: {row['error']} | - |")
            continue
        p, g = row["parity"], row["gain"]
        if "skipped" in g:
            fwd = bwd = "n/a"
        else:
            fwd, bwd = _fmt_gain(g["forward"]), _fmt_gain(g["forward+backward"])
        fired = ", ".join(f"{k} {v}" for k, v in sorted(p["rules_fired"].items())) or "none"
        ok = (
            "ok"
            if p["values"] and p["grads"] and p["buffers"]
            else ("MISMATCH: " + ", ".join(k for k in ("values", "grads", "buffers") if not p[k]))
        )
        lines.append(
            f"| {name} | {p['nodes_before']} -> {p['nodes_after']} | {fired} | {fwd} | {bwd} | {ok} |"
            f" {p['capture']} |"
        )
    return "\n".join(lines) + "\n"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--out-dir", type=Path, help="where outside-gain.json and .md go (required to measure)"
    )
    parser.add_argument("--models", default="", help="comma list (default: every installed corpus model)")
    parser.add_argument(
        "--zoos",
        default="",
        help="comma list of zoos (models.outside.zoos(): deepctr, recbole, rechub, torchrec): their models",
    )
    parser.add_argument(
        "--from-json",
        type=Path,
        nargs="+",
        help="print the tables of a run's outside-gain.json (or of runs of disjoint models), measuring nothing",
    )
    parser.add_argument("--rounds", type=int, default=9)
    parser.add_argument("--steps", type=int, default=5, help="steps a block, at least (default: 5)")
    parser.add_argument("--block-ms", type=float, default=BLOCK_MS,
                        help=f"a block lasts at least this long: more steps where they are short; 0: "
                             f"exactly --steps (default: {BLOCK_MS:g})")  # fmt: skip
    parser.add_argument(
        "--threads", type=int, default=1, help="torch intra-op threads (1: steadier on a shared machine)"
    )
    parser.add_argument(
        "--guard",
        choices=GUARDS,
        default="off",
        help="OptimusConfig.guard on the Optimus side (default off: the rules' own gain)",
    )


MEASUREMENT_KEYS = ("torch", "threads", "rounds", "steps", "block_ms", "guard")


def _key(doc: dict[str, Any], key: str) -> Any:
    if key == "block_ms":
        return doc.get(key, 0.0)  # runs before blocks had a length: a fixed count of steps
    return guard_of(doc) if key == "guard" else doc[key]


def _from_json(paths: Sequence[Path]) -> int:
    """Print the tables of one run, or of runs of disjoint models measured alike (one per zoo)."""
    docs = []
    for path in paths:
        try:
            doc = json.loads(path.read_text())
            markdown(doc)
        except (OSError, ValueError, KeyError, TypeError, AttributeError) as exc:
            print(
                f"outside_gain: {path}: not a readable outside-gain run ({type(exc).__name__}: {exc})",
                file=sys.stderr,
            )
            return 2
        docs.append(doc)
    first = docs[0]
    merged = {k: _key(first, k) for k in ("schema", *MEASUREMENT_KEYS)} | {"models": {}}
    for path, doc in zip(paths, docs, strict=True):
        differs = [k for k in MEASUREMENT_KEYS if _key(doc, k) != _key(first, k)]
        both = sorted(set(doc["models"]) & set(merged["models"]))
        if differs or both:
            why = f"measured with another {', '.join(differs)}" if differs else f"{both[0]} is in two runs"
            print(f"outside_gain: {path}: cannot join it to {paths[0]}: {why}", file=sys.stderr)
            return 2
        merged["models"] |= doc["models"]
    print(markdown(merged))
    return 0


def main_from_args(args: argparse.Namespace) -> int:
    if args.from_json is not None:
        return _from_json(args.from_json)
    if args.out_dir is None:
        print(
            "outside_gain: --out-dir is required to measure (or --from-json to print a run)", file=sys.stderr
        )
        return 2
    zoos = [z for z in args.zoos.split(",") if z]
    unknown_zoos = sorted(set(zoos) - set(outside.zoos()))
    if unknown_zoos:
        print(
            f"outside_gain: unknown zoo {', '.join(unknown_zoos)}; zoos: {', '.join(outside.zoos())}",
            file=sys.stderr,
        )
        return 2
    names = [n for n in args.models.split(",") if n] or [
        n for n in outside.names() if not zoos or outside.zoo_of(n) in zoos
    ]
    if not names:
        print(f"outside_gain: no installed model in zoo(s) {', '.join(zoos)}", file=sys.stderr)
        return 2
    unknown = sorted(set(names) - set(outside.names()))
    if unknown:
        print(f"outside_gain: unknown or not installed: {', '.join(unknown)}", file=sys.stderr)
        return 2
    if args.rounds < 1 or args.steps < 1 or not args.block_ms >= 0:
        print("outside_gain: --rounds and --steps must be >= 1, --block-ms >= 0", file=sys.stderr)
        return 2
    torch.set_num_threads(args.threads)
    doc = measure(names, args.rounds, args.steps, args.guard, args.block_ms)
    args.out_dir.mkdir(parents=True, exist_ok=True)
    write_atomic(args.out_dir / "outside-gain.json", json.dumps(doc, indent=1, sort_keys=True) + "\n")
    write_atomic(args.out_dir / "outside-gain.md", markdown(doc))
    print(markdown(doc))
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m harness.diagnose.outside_gain", description=__doc__.splitlines()[0]
    )
    add_arguments(parser)
    return main_from_args(parser.parse_args(argv))


if __name__ == "__main__":
    sys.exit(main())
