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

A rewrite that adds live bytes (``Candidate.live_delta`` > 0) passes ``memory_gate.MemoryGate``
too: where it lifts the graph's estimated peak it must save more than ``memory_margin`` of its
own time, and it may never lift the peak above ``memory_budget_bytes`` nor past
``memory_ceiling`` (a fraction of the captured graph's parameters, buffers and peak); refusals are counted by
reason in ``report.declined_reasons``. ``report.live_peak_before``/``live_peak_after`` hold the
estimate for the graph as captured and as optimized. While the gate is active, the candidates
that form a vertical chain (``optimus.engine.vertical``: a fused group and the per-member chain after
it) are applied and judged together first (``_apply_chain``); a chain refused as a whole is
undone and its links are judged one by one.

Rewrites the engine refuses for safety (grouping across a grad-mode/autocast region, merging a
random op, ...) are counted by reason in ``report.declined_reasons`` (see docs/optimus.md,
"Regions and effects").
"""

from __future__ import annotations

import itertools
import logging
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import torch
from torch import fx

from optimus.engine.builder import Builder
from optimus.engine.candidate import Candidate
from optimus.engine.context import Applied, RewriteContext
from optimus.engine.memory_gate import MemoryGate
from optimus.engine.param_layout import RuntimeStack
from optimus.engine.rule import HorizontalRule, Rule
from optimus.engine.verify import Verifier
from optimus.engine.vertical import Chain, ProbeLayout, chains
from optimus.memory.live import ceiling_budget, static_bytes
from optimus.report import OptimusReport, RoundRecord, StopReason
from optimus.semantics.graph_index import CycleError, stable_toposort
from optimus.semantics.regions import describe

if TYPE_CHECKING:
    from optimus.config import OptimusConfig

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


@dataclass
class _Run:
    """What one ``run`` carries from round to round."""

    gm: fx.GraphModule
    config: OptimusConfig
    report: OptimusReport
    verifier: Verifier | None
    rules: list[Any]
    max_nodes: int
    start: float
    blocked: set[tuple[str, tuple[fx.Node, ...]]] = field(default_factory=set)  # rolled back: never retried
    unchanged_peak: float | None = None  # estimated peak of a round that changed nothing (final graph)
    ceiling: float | None = None  # live bytes memory_ceiling allows (set in the first round)

    def context(self) -> RewriteContext:
        return RewriteContext(self.gm, self.config.cost_model, self.config.layout)


def run(
    gm: fx.GraphModule,
    config: OptimusConfig,
    rules: Sequence[Rule],
    report: OptimusReport,
    verifier: Verifier | None = None,
) -> None:
    """Optimize ``gm`` in place with ``rules`` (instances, in registry order), filling ``report``.

    The caller resolves the rules (``optimus.rules.resolve``): the engine knows rule kinds, not
    the registry of concrete rules above it."""
    start = time.perf_counter()
    report.nodes_before = len(gm.graph.nodes)
    state = _Run(
        gm,
        config,
        report,
        verifier,
        list(rules),
        config.max_nodes or 4 * report.nodes_before + 1000,
        start,
    )
    stop = StopReason.iteration_limit(config.max_iterations)
    for iteration in range(config.max_iterations):
        report.iterations = iteration + 1
        limit = _limit_reached(state)
        if limit is not None:
            stop = limit
            break
        record = RoundRecord(iteration)
        report.rounds.append(record)
        if not _round(state, iteration, record):
            stop = StopReason.saturated()
            break
    gm.recompile()
    # a round that changed nothing estimated the final graph already; else (a limit) once more
    final = state.unchanged_peak
    report.live_peak_after = final if final is not None else state.context().live.peak
    _note_unchanged(report)
    report.nodes_after = len(gm.graph.nodes)
    report.stop_reason = stop
    report.seconds = time.perf_counter() - state.start
    report.graphs = max(report.graphs, 1)


def _limit_reached(state: _Run) -> StopReason | None:
    if time.perf_counter() - state.start > state.config.time_limit_s:
        return StopReason.time_limit(state.config.time_limit_s)
    if len(state.gm.graph.nodes) > state.max_nodes:
        return StopReason.node_limit(state.max_nodes)
    return None


def _round(state: _Run, iteration: int, record: RoundRecord) -> bool:
    """One driver round (see the module docstring); False when it changed nothing or broke the
    graph (its rewrites then rolled back), which ends the run."""
    report = state.report
    t0 = time.perf_counter()
    ctx = state.context()
    if iteration == 0:
        report.live_peak_before = ctx.live.peak  # the graph as captured (one O(n) pass)
        if state.config.memory_ceiling is not None:
            static = static_bytes(state.gm) + state.config.memory_outside_bytes
            state.ceiling = ceiling_budget(static, ctx.live.peak, state.config.memory_ceiling)
        for node in ctx.index.regions.unknown:
            report.notes.append(
                f"unknown context node {describe(node)}: treated as a region boundary, no rewrite crosses it"
            )
    t1 = time.perf_counter()
    declines: dict[str, int] = {}
    ctx, changed = _run_cleanup(state, ctx, declines, record)
    t2 = time.perf_counter()
    candidates = _collect(state, ctx)
    t3 = time.perf_counter()
    round_order = list(state.gm.graph.nodes)
    applied_round = _apply_candidates(state, ctx, candidates)
    if not changed and not applied_round:
        state.unchanged_peak = ctx.live.peak
    ok = _finish_round(state, ctx, iteration, applied_round, round_order)
    if ok:
        _merge_declines(declines, ctx.declines)
        for reason, n in declines.items():  # the same refusal recurs each round: keep the largest
            report.declined_reasons[reason] = max(report.declined_reasons.get(reason, 0), n)
        for applied in applied_round:
            report.fired(applied.cand.rule)
            _count(record.applied, applied.cand.rule)
        _tidy_stacks(ctx, applied_round)
        ctx.erase_leftovers()
        changed += len(applied_round)
    record.match_s = (t1 - t0) + (t3 - t2)
    record.apply_s = (t2 - t1) + (time.perf_counter() - t3)
    return ok and changed > 0


def _run_cleanup(
    state: _Run, ctx: RewriteContext, declines: dict[str, int], record: RoundRecord
) -> tuple[RewriteContext, int]:
    """The cleanup rules, each on a fresh context after one that changed the graph."""
    changed = 0
    for rule in (r for r in state.rules if r.kind == "cleanup"):
        n = rule.run(ctx)
        if n:
            state.report.fired(rule.name, n)
            record.applied[rule.name] = record.applied.get(rule.name, 0) + n
            changed += n
            _merge_declines(declines, ctx.declines)
            ctx = state.context()
    return ctx, changed


def _collect(state: _Run, ctx: RewriteContext) -> list[Candidate]:
    return collect(ctx, state.rules, state.config.cost_model)


def collect(ctx: RewriteContext, rules: Sequence[Rule], cost_model: Any) -> list[Candidate]:
    """Every rewrite rule's candidates, priced, best first (ties: rule order, graph position).

    The one candidate order: the driver applies candidates in it, and ``optimus.dry_run`` lists
    them in it, so what a dry run shows is what a run would try."""
    candidates: list[Candidate] = []
    for rule in (r for r in rules if r.kind != "cleanup"):
        for cand in rule.match(ctx):
            device = ctx.device_of(cand.nodes)
            before = cost_model.seconds(cand.before, device)
            cand.gain = before - cost_model.seconds(cand.after, device)
            cand.gain_share = cand.gain / before if before > 0 else 0.0
            candidates.append(cand)
    order = {r.name: i for i, r in enumerate(rules)}
    candidates.sort(key=lambda c: (-c.gain, order[c.rule], ctx.index.pos.get(c.nodes[0], 0)))
    return candidates


def _apply_candidates(state: _Run, ctx: RewriteContext, candidates: list[Candidate]) -> list[Applied]:
    """Apply the candidates in order, at most one per node; with a verifier, undo any rewrite
    that changes results."""
    report, graph, verifier = state.report, state.gm.graph, state.verifier
    by_name = {r.name: r for r in state.rules}
    touched: set[fx.Node] = set()
    applied_round: list[Applied] = []
    memory = MemoryGate(ctx, state.config, state.ceiling)
    fusing = [r.name for r in state.rules if isinstance(r, HorizontalRule)]  # not node-set rules
    linked = chains(candidates, fusing, ctx) if memory.active else {}
    tried: set[int] = set()
    for cand in candidates:
        if cand.gain <= 0:
            _count(report.declined, cand.rule)
            continue
        if any(n in touched for n in cand.nodes) or (cand.rule, cand.nodes) in state.blocked:
            continue
        chain = linked.get(cand)
        if chain is not None and id(chain) not in tried:
            tried.add(id(chain))
            taken = _apply_chain(state, ctx, chain, memory, touched)
            if taken:
                touched.update(chain.nodes)
                applied_round.extend(taken)
                continue
            if (cand.rule, cand.nodes) in state.blocked:  # the chain's rewrite of it failed
                continue
        refusal = memory.refusal(cand)
        if refusal is not None:
            ctx.decline(refusal)
            continue
        failures = sum(report.rolled_back.values())
        before = list(graph.nodes) if verifier is not None else None
        applied = _apply(ctx, by_name[cand.rule], cand, report)
        if applied is None:
            if sum(report.rolled_back.values()) > failures:
                state.blocked.add((cand.rule, cand.nodes))
            continue
        if verifier is not None:
            problem = _check(state.gm, ctx, verifier)
            if problem is not None:
                log.warning("optimus: rule %s changed results (%s); rewrite rolled back", cand.rule, problem)
                ctx.undo(applied)
                _restore_order(graph, before or [])
                _count(report.rolled_back, cand.rule)
                state.blocked.add((cand.rule, cand.nodes))
                continue
        touched.update(cand.nodes)
        memory.take(cand)
        applied_round.append(applied)
    return applied_round


def _apply_chain(
    state: _Run, ctx: RewriteContext, chain: Chain, memory: MemoryGate, touched: set[fx.Node]
) -> list[Applied]:
    """Apply a vertical chain's links together, upstream first, and keep them only if the chain
    as a whole passes the memory gate (``MemoryGate.chain_refusal``: the exact estimated peak
    before and after, against the chain's time saved) and, with a verifier, keeps results.
    Otherwise undo every link and put the nodes back in their order: the graph is exactly as
    before, and the caller judges the links one by one. Returns the applied links ([] if not).

    A parameter layout that changes the module when it lays parameters out (``RelayoutParams``
    re-points them into new storage; undoing the graph edit would not undo that) is not used for
    the trial: ``vertical.ProbeLayout`` stands in with the same bytes and no effect, the trial is
    undone after it is judged, and a chain that passes is applied again with the real layout."""
    report, graph = state.report, state.gm.graph
    if any(n in touched for n in chain.nodes) or any((c.rule, c.nodes) in state.blocked for c in chain.links):
        return []
    order = list(graph.nodes)
    try:
        before = memory.exact()
    except CycleError:  # the round's rewrites so far do not sort yet: the end of the round decides
        _restore_order(graph, order)
        return []
    real = ctx.layout
    probing = not isinstance(real, RuntimeStack)
    if probing:
        ctx.layout = ProbeLayout(real)
    try:
        trial = _apply_links(state, ctx, chain)
    finally:
        ctx.layout = real
    after = _exact_or_none(memory) if trial is not None else None
    refusal = "not applied" if after is None else None
    if trial is not None and after is not None:
        saved, spent = trial[1]
        share = saved / spent if spent > 0 else 0.0
        refusal = (
            "no faster" if saved <= 0 else memory.chain_refusal(chain.name, before.peak, after.peak, share)
        )
        log.debug(
            "optimus: %s: estimated peak %.0f -> %.0f bytes, gain share %.3f: %s",
            chain.name,
            before.peak,
            after.peak,
            share,
            refusal or "taken",
        )
        if refusal is not None and refusal.startswith(chain.name):  # the gate's reason
            ctx.decline(refusal)
    applied = trial[0] if trial is not None else []
    if refusal is None and probing:  # judged on the probe: now lay the parameters out for real
        _undo_links(ctx, applied, graph, order)
        again = _apply_links(state, ctx, chain)
        applied = again[0] if again is not None else []
        after = _exact_or_none(memory) if again is not None else None
        refusal = "not applied" if after is None else None
    if refusal is None and state.verifier is not None:
        problem = _check(state.gm, ctx, state.verifier)
        if problem is not None:
            log.warning("optimus: %s changed results (%s); rolled back", chain.name, problem)
            for link in chain.links:
                _count(report.rolled_back, link.rule)
                state.blocked.add((link.rule, link.nodes))
            refusal = "changed results"
    if refusal is None and after is not None:
        memory.adopt(after)
        _count(report.chains, chain.name)
        return applied
    _undo_links(ctx, applied, graph, order)
    return []


def _apply_links(
    state: _Run, ctx: RewriteContext, chain: Chain
) -> tuple[list[Applied], tuple[float, float]] | None:
    """Apply every link of ``chain`` upstream first: (the applied links, (seconds saved, the
    links' seconds before)), or None (nothing left applied) when one cannot be applied."""
    by_name = {r.name: r for r in state.rules}
    report = state.report
    applied: list[Applied] = []
    saved = spent = 0.0
    for link in chain.links:
        rule = by_name[link.rule]
        before, after = _chain_link_seconds(state, ctx, rule, link)
        saved, spent = saved + before - after, spent + before
        failures = sum(report.rolled_back.values())
        done = _apply(ctx, rule, link, report)
        if done is None:
            if sum(report.rolled_back.values()) > failures:
                state.blocked.add((link.rule, link.nodes))
            for prior in reversed(applied):
                ctx.undo(prior)
            return None
        applied.append(done)
    return applied, (saved, spent)


def _undo_links(ctx: RewriteContext, applied: list[Applied], graph: fx.Graph, order: list[fx.Node]) -> None:
    """Undo applied links (last first) and put the nodes back in ``order``."""
    for done in reversed(applied):
        ctx.undo(done)
    _restore_order(graph, order)


def _exact_or_none(memory: MemoryGate) -> Any:
    """The gate's exact estimate of the graph now, or None when it does not sort (a cycle)."""
    try:
        return memory.exact()
    except CycleError:
        return None


def _chain_link_seconds(state: _Run, ctx: RewriteContext, rule: Any, link: Candidate) -> tuple[float, float]:
    """(before, after) seconds of one link, priced again now that the links feeding it are
    applied: a plain horizontal rule then stacks its inputs as a view of the previous fused
    output, so the seam copy it priced alone is not charged. Other rules keep their price."""
    cm = state.config.cost_model
    device = ctx.device_of(link.nodes)
    first = (cm.seconds(link.before, device), cm.seconds(link.after, device))
    if not isinstance(rule, HorizontalRule) or type(rule).match is not HorizontalRule.match:
        return first
    try:
        before, after = rule.cost(link.nodes, ctx)
    except Exception:  # priced alone already; a failure here only loses the seam's credit
        return first
    return cm.seconds(before, device), cm.seconds(after, device)


def _finish_round(
    state: _Run, ctx: RewriteContext, iteration: int, applied_round: list[Applied], round_order: list[fx.Node]
) -> bool:
    """Restore topological order and lint; if the round broke the graph, undo all its rewrites,
    put the nodes back in ``round_order`` (the graph is then exactly as the round found it) and
    return False."""
    graph = state.gm.graph
    try:
        stable_toposort(graph, ctx.index.chained)
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
            _count(state.report.rolled_back, applied.cand.rule)
        _restore_order(graph, round_order)
        state.report.notes.append(f"round {iteration} rolled back: {exc}")
        ctx.erase_leftovers()
        return False
    return True


def _note_unchanged(report: OptimusReport) -> None:
    """Say why, when no rule fired."""
    if report.rules_fired:
        return
    if report.declined:
        report.notes.append(f"unchanged: the cost model rated every candidate no faster ({report.declined})")
    elif report.rolled_back:
        report.notes.append(f"unchanged: every rewrite was rolled back ({report.rolled_back})")
    else:
        report.notes.append("unchanged: no rule found a candidate in this graph")


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
        stable_toposort(gm.graph, ctx.index.chained)
        gm.graph.lint()
    except (CycleError, RuntimeError) as exc:
        return f"graph invalid: {exc}"
    return verifier.check(gm)
