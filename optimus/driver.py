"""The greedy driver: rules to a fixed point under the cost model.

Each round: rebuild the graph index (O(n)); run the cleanup rules; collect every candidate of
every rule against that index; price them; apply the best-rated first, skipping any that touches
a node already rewritten this round or that can no longer be placed (see
``RewriteContext.placeable``); then restore topological order and erase what was replaced.
Candidates that depend on this round's results are found next round. It stops when a round
changes nothing (``saturated``) or at the iteration / node / time limit. Ties are broken by rule
order in the registry, then graph position, so runs are deterministic.

A rule that raises, yields an unplaceable rewrite, breaks the graph, or (with ``verify``) changes
results is undone, logged on the ``optimus`` logger and counted in ``report.rolled_back``. Undoing
restores the graph exactly as it was before the rewrite (edges and node order).

Rewrites the engine refuses for safety (grouping across a grad-mode/autocast region, merging a
random op, ...) are counted by reason in ``report.declined_reasons`` (see docs/optimus.md,
"Regions and effects").
"""

from __future__ import annotations

import itertools
import logging
import time

import torch
from torch import fx

from .builder import Builder
from .candidate import Candidate
from .config import OptimusConfig
from .context import Applied, RewriteContext
from .graph_index import CycleError, stable_toposort
from .regions import describe
from .report import OptimusReport
from .rules import resolve
from .verify import Verifier

log = logging.getLogger("optimus")


def _count(table: dict[str, int], name: str) -> None:
    table[name] = table.get(name, 0) + 1


def _apply(ctx: RewriteContext, rule: object, cand: Candidate, report: OptimusReport) -> Applied | None:
    horizontal = getattr(rule, "kind", "") == "horizontal"
    if not ctx.placeable(cand, horizontal):
        return None
    anchor = min(cand.nodes if horizontal else cand.nodes[:1], key=lambda n: ctx.index.pos.get(n, 0))
    b = Builder(ctx, anchor)
    try:
        replacements = rule.apply(cand, b)  # type: ignore[attr-defined]
        if replacements is None:
            ctx.discard(b.created)
            return None
        expected = len(cand.nodes) if horizontal else 1
        if len(replacements) != expected:
            raise ValueError(f"returned {len(replacements)} replacements for {expected} nodes")
    except Exception as exc:
        ctx.discard(b.created)
        log.warning("optimus: rule %s raised %s: %s; rewrite rolled back", cand.rule, type(exc).__name__, exc)
        _count(report.rolled_back, cand.rule)
        return None
    applied = ctx.commit(cand, replacements, b)
    if applied is None:
        ctx.discard(b.created)
        log.debug("optimus: %s rewrite not placeable, skipped", cand.rule)
    return applied


def run(
    gm: fx.GraphModule, config: OptimusConfig, report: OptimusReport, verifier: Verifier | None = None
) -> None:
    """Optimize ``gm`` in place, filling ``report``."""
    start = time.perf_counter()
    rules = resolve(config.rules)
    order = {r.name: i for i, r in enumerate(rules)}
    by_name = {r.name: r for r in rules}
    cleanup = [r for r in rules if r.kind == "cleanup"]
    rewrite = [r for r in rules if r.kind != "cleanup"]
    graph = gm.graph
    report.nodes_before = len(graph.nodes)
    max_nodes = config.max_nodes or 4 * report.nodes_before + 1000
    stop = "iteration_limit"
    blocked: set[tuple[str, tuple[fx.Node, ...]]] = set()  # rolled-back rewrites: never retried
    for iteration in range(config.max_iterations):
        report.iterations = iteration + 1
        if time.perf_counter() - start > config.time_limit_s:
            stop = "time_limit"
            break
        if len(graph.nodes) > max_nodes:
            stop = "node_limit"
            break
        changed = 0
        ctx = RewriteContext(gm, config.cost_model, config.layout)
        if iteration == 0:
            for node in ctx.index.regions.unknown:
                report.notes.append(
                    f"unknown context node {describe(node)}: treated as a region boundary, no rewrite crosses it"
                )
        declines: dict[str, int] = {}
        for rule in cleanup:
            n = rule.run(ctx)  # type: ignore[attr-defined]
            if n:
                report.fired(rule.name, n)
                changed += n
                _merge_declines(declines, ctx.declines)
                ctx = RewriteContext(gm, config.cost_model, config.layout)
        candidates: list[Candidate] = []
        for rule in rewrite:
            for cand in rule.match(ctx):
                device = ctx.device_of(cand.nodes)
                cm = config.cost_model
                cand.gain = cm.seconds(cand.before, device) - cm.seconds(cand.after, device)
                candidates.append(cand)
        candidates.sort(key=lambda c: (-c.gain, order[c.rule], ctx.index.pos.get(c.nodes[0], 0)))
        touched: set[fx.Node] = set()
        applied_round: list[Applied] = []
        round_order = list(graph.nodes)
        for cand in candidates:
            if cand.gain <= 0:
                _count(report.declined, cand.rule)
                continue
            if any(n in touched for n in cand.nodes) or (cand.rule, cand.nodes) in blocked:
                continue
            failures = sum(report.rolled_back.values())
            before = list(graph.nodes) if verifier is not None else None
            applied = _apply(ctx, by_name[cand.rule], cand, report)
            if applied is None:
                if sum(report.rolled_back.values()) > failures:
                    blocked.add((cand.rule, cand.nodes))
                continue
            if verifier is not None:
                problem = _check(gm, ctx, verifier)
                if problem is not None:
                    log.warning(
                        "optimus: rule %s changed results (%s); rewrite rolled back", cand.rule, problem
                    )
                    ctx.undo(applied)
                    _restore_order(graph, before or [])
                    _count(report.rolled_back, cand.rule)
                    blocked.add((cand.rule, cand.nodes))
                    continue
            touched.update(cand.nodes)
            applied_round.append(applied)
        try:
            stable_toposort(graph, ctx.index.ordered)
            if applied_round:
                graph.lint()
        except (CycleError, RuntimeError) as exc:
            log.warning(
                "optimus: round %d broke the graph (%s); its %d rewrites rolled back",
                iteration,
                exc,
                len(applied_round),
            )
            for applied in reversed(applied_round):
                ctx.undo(applied)
                _count(report.rolled_back, applied.cand.rule)
            _restore_order(graph, round_order)
            applied_round = []
            stop = "saturated"
            report.notes.append(f"round {iteration} rolled back: {exc}")
            ctx.erase_leftovers()
            break
        _merge_declines(declines, ctx.declines)
        for reason, n in declines.items():  # the same refusal recurs each round: keep the largest
            report.declined_reasons[reason] = max(report.declined_reasons.get(reason, 0), n)
        for applied in applied_round:
            report.fired(applied.cand.rule)
        _tidy_stacks(ctx, applied_round)
        ctx.erase_leftovers()
        changed += len(applied_round)
        if not changed:
            stop = "saturated"
            break
    gm.recompile()
    if not report.rules_fired:
        if report.declined:
            report.notes.append(
                f"unchanged: the cost model rated every candidate no faster ({report.declined})"
            )
        elif report.rolled_back:
            report.notes.append(f"unchanged: every rewrite was rolled back ({report.rolled_back})")
        else:
            report.notes.append("unchanged: no rule found a candidate in this graph")
    report.nodes_after = len(graph.nodes)
    report.stop_reason = stop
    report.seconds = time.perf_counter() - start
    report.graphs = max(report.graphs, 1)


def _merge_declines(into: dict[str, int], new: dict[str, int]) -> None:
    for reason, n in new.items():
        into[reason] = into.get(reason, 0) + n


def _restore_order(graph: fx.Graph, order: list[fx.Node]) -> None:
    """Put the surviving nodes back in ``order`` (a rollback leaves the graph as it was: the
    same nodes, edges and order). Nodes not in ``order`` (none after an undo) keep their place
    after their predecessor."""
    alive = [n for n in order if not getattr(n, "_erased", False) and n.graph is graph]
    if not alive:
        return
    first = next(iter(graph.nodes))
    if first is not alive[0]:
        first.prepend(alive[0])
    for prev, node in itertools.pairwise(alive):
        if node.prev is not prev:
            prev.append(node)


def _tidy_stacks(ctx: RewriteContext, applied_round: list[Applied]) -> None:
    """A fused op stacks its inputs; when they turned out to be the pieces of another fused op
    applied later in the same round, read that op's output directly (no copy), or the ``cat`` of
    several such outputs when the pieces are all of one, then all of the next. Engine-made
    stacks only: user graphs are the split/cat rules' business."""
    probe = Builder.__new__(Builder)
    probe.ctx = ctx
    for applied in applied_round:
        for node in applied.created:
            if node.target is not torch.stack or getattr(node, "_erased", False):
                continue
            values = node.args[0]
            dim = node.args[1] if len(node.args) > 1 else node.kwargs.get("dim", 0)
            if not isinstance(values, (list, tuple)) or not all(isinstance(v, fx.Node) for v in values):
                continue
            if not isinstance(dim, int):
                continue
            pieces = [v for v in values if isinstance(v, fx.Node)]
            whole = probe.unstacked_source(pieces, dim)
            if whole is None:
                runs = probe.unbound_runs(pieces, dim)  # pieces of several fused ops, in order
                if runs is not None:
                    whole = Builder(ctx, node).call(torch.cat, runs, 0)
            if whole is not None and whole is not node:
                node.replace_all_uses_with(whole)
                ctx.leftovers.append(node)


def _check(gm: fx.GraphModule, ctx: RewriteContext, verifier: Verifier) -> str | None:
    try:
        stable_toposort(gm.graph, ctx.index.ordered)
        gm.graph.lint()
    except (CycleError, RuntimeError) as exc:
        return f"graph invalid: {exc}"
    return verifier.check(gm)
