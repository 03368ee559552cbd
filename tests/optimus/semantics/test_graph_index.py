"""Graph index: depth labels, reachability, group placement, stable topological sort, effects."""

from __future__ import annotations

import operator

import pytest
import torch
from torch import fx

from optimus.semantics.graph_index import CycleError, GraphIndex, stab_groups, stable_toposort


def diamond() -> tuple[fx.Graph, dict[str, fx.Node]]:
    g = fx.Graph()
    x = g.placeholder("x")
    a = g.call_function(torch.tanh, (x,))
    b = g.call_function(torch.relu, (x,))
    c = g.call_function(torch.sigmoid, (a,))
    d = g.call_function(operator.add, (c, b))
    g.output(d)
    return g, {"x": x, "a": a, "b": b, "c": c, "d": d}


def test_depth_increases_along_edges_and_reachability() -> None:
    g, n = diamond()
    idx = GraphIndex(g)
    for node in g.nodes:
        for inp in node.all_input_nodes:
            assert idx.depth[inp] < idx.depth[node]
    assert idx.reaches(n["x"], n["d"]) and idx.reaches(n["a"], n["c"])
    assert not idx.reaches(n["b"], n["c"]) and not idx.reaches(n["c"], n["a"])
    assert idx.independent([n["a"], n["b"]]) and idx.independent([n["c"], n["b"]])
    assert not idx.independent([n["a"], n["c"]])


def test_stab_groups_places_only_compatible_members() -> None:
    # (lo, own, hi): members 0,1,2 can all sit at 3; member 3 only strictly between 5 and 7
    spans = {0: (2, 3, 4), 1: (1, 3, 6), 2: (2, 4, 6), 3: (5, 6, 7)}
    groups = stab_groups([0, 1, 2, 3], lambda i: spans[i], 2, 10)
    assert groups == [(3, [0, 1, 2])]
    for label, members in groups:
        assert all(spans[m][0] < label < spans[m][2] for m in members)
    # max size cuts groups into chunks, min size drops small ones
    many = stab_groups(list(range(7)), lambda i: (0, 1, 2), 3, 3)
    assert [len(m) for _, m in many] == [3, 3]


def test_stable_toposort_keeps_order_and_detects_cycles() -> None:
    g, n = diamond()
    before = list(g.nodes)
    assert stable_toposort(g, set()) is False
    assert list(g.nodes) == before
    # move c before a: the sort must pull a back in front of it
    n["a"].prepend(n["c"])
    assert stable_toposort(g, set()) is True
    g.lint()
    # a real cycle
    n["a"].update_arg(0, n["d"])
    with pytest.raises(CycleError):
        stable_toposort(g, set())


def test_effects_are_ordered_and_mutated_values_unmovable() -> None:
    g = fx.Graph()
    x = g.placeholder("x")
    y = g.call_function(operator.mul, (x, 1.0))
    view = g.call_method("view", (y, -1))
    read_before = g.call_function(torch.tanh, (view,))
    mut = g.call_method("add_", (y, 1.0))
    free = g.call_function(torch.relu, (x,))
    g.output((read_before, mut, free))
    idx = GraphIndex(g)
    assert mut in idx.ordered
    assert {y, view, read_before} <= idx.ordered  # the alias class of the mutated value
    assert free not in idx.ordered and idx.movable(free)
    assert not idx.movable(read_before)


def _batch_norms(calls: list[str]) -> tuple[fx.Graph, list[fx.Node], list[fx.Node]]:
    """Train-mode ``F.batch_norm`` calls, one per entry of ``calls`` (the buffer prefix it reads:
    equal prefixes are one module called twice), each followed by a relu; (graph, norms, relus)."""
    import torch.nn.functional as F

    g = fx.Graph()
    x = g.placeholder("x")
    norms, relus = [], []
    for name in calls:
        rm = g.get_attr(f"{name}_running_mean")
        rv = g.get_attr(f"{name}_running_var")
        bn = g.call_function(F.batch_norm, (x, rm, rv, None, None, True, 0.1, 1e-5))
        norms.append(bn)
        relus.append(g.call_function(torch.relu, (bn,)))
    g.output(tuple(relus))
    return g, norms, relus


def test_private_state_updates_leave_the_chain_of_effects() -> None:
    """A train-mode BatchNorm whose statistics nothing else reads is ordered (kept, never merged)
    but neither chained nor blocked: it and its readers may move. A module called twice is not
    private: both calls stay in order and their readers stay blocked."""
    g, norms, relus = _batch_norms(["a", "b", "c"])
    idx = GraphIndex(g)
    assert set(norms) <= idx.ordered and set(norms) == idx.private
    assert not set(norms) & idx.chained
    assert all(idx.movable(n) for n in [*norms, *relus])
    assert idx.depth[norms[0]] == idx.depth[norms[2]]  # no chain edge between the updates

    g, norms, relus = _batch_norms(["a", "a", "b"])
    idx = GraphIndex(g)
    assert idx.private == {norms[2]}
    assert {norms[0], norms[1]} <= idx.chained
    assert not idx.movable(relus[0]) and not idx.movable(relus[1]) and idx.movable(relus[2])
