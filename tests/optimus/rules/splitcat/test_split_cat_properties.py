"""Property: random split/chunk/cat/stack/unbind programs (with pointwise readers and in-place
writes) keep their outputs and gradients through the split/cat rules.

Examples: 200 in CI; 3000 with ``--hypothesis-profile=thorough`` (see conftest.py) or any number
with ``OPTIMUS_SPLITCAT_EXAMPLES=N``.
"""

from __future__ import annotations

import os

import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from split_cat_dags import Plan, Program, plans, random_plan, undo_sizes
from split_cat_helpers import FAMILY, run

_DEFAULT = "3000" if settings.get_current_profile_name() == "thorough" else "200"
EXAMPLES = int(os.environ.get("OPTIMUS_SPLITCAT_EXAMPLES", _DEFAULT))


def _inputs(plan: Plan) -> list[torch.Tensor]:
    gen = torch.Generator().manual_seed(0)
    return [torch.randn(s, generator=gen) for s in plan.inputs]


@settings(max_examples=EXAMPLES, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(plans())
def test_random_programs_keep_outputs_and_gradients(plan: Plan) -> None:
    run(Program(plan), _inputs(plan), [*FAMILY, "dce", "cse"])


@settings(max_examples=max(EXAMPLES // 2, 10), deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(plans())
def test_generated_programs_run_in_eager(plan: Plan) -> None:
    """Every drawn plan is a valid program: its shapes agree, so eager runs it."""
    Program(plan)(*_inputs(plan))


def test_undo_a_cat_only_along_its_own_dim() -> None:
    """Splitting an OLDER cat along the latest cat's dim must not reuse the older cat's input
    extents (they are along another dim: ``torch.split`` would get sizes that do not add up).
    The generator once compared with the latest cat's dim instead of the source's."""
    cats = {5: (0, [2, 3]), 9: (1, [4, 4])}  # value 5: cat on dim 0; value 9 (latest): cat on dim 1
    assert undo_sizes(cats, 5, 1) is None
    assert undo_sizes(cats, 5, 0) == [2, 3]
    assert undo_sizes(cats, 9, 1) == [4, 4]
    assert undo_sizes(cats, 7, 0) is None  # not a cat


# Seeds past the first 120 whose programs nest cats (flatten_cats fires on each of them).
RARE_RULE_SEEDS = (172, 255, 303, 373)


def test_generator_exercises_the_rules() -> None:
    """The property above is only worth something if the rules fire on the programs drawn. The
    programs here come from fixed seeds (``random_plan``), not from hypothesis, so a hypothesis
    upgrade that changes its example distribution cannot break this test."""
    fired: dict[str, int] = {}
    for seed in [*range(120), *RARE_RULE_SEEDS]:
        plan = random_plan(seed)
        gm = run(Program(plan, copy_outputs=True), _inputs(plan), [*FAMILY, "dce", "cse"])
        for rule, n in gm.optimus_report.rules_fired.items():
            fired[rule] = fired.get(rule, 0) + n
    for rule in FAMILY:
        if rule != "stack_pieces":  # pays only from ~10 pieces: covered by the test below
            assert fired.get(rule, 0) > 0, (rule, fired)


@settings(max_examples=max(EXAMPLES // 10, 10), deadline=None)
@given(
    rank=st.integers(2, 3),
    n=st.integers(10, 16),
    width=st.integers(1, 2),
    data=st.data(),
)
def test_reshaping_rules_on_many_pieces(rank: int, n: int, width: int, data: st.DataObject) -> None:
    """stack_pieces and unbind_cat replace n per-piece copies with one reshape: check them on
    random dims, with enough pieces that the cost model takes the rewrite."""
    d = data.draw(st.integers(0, rank - 1))
    e = data.draw(st.integers(-rank - 1, rank))
    u = data.draw(st.integers(0, rank - 1))
    c = data.draw(st.integers(-rank + 1, rank - 2))
    xshape, yshape = [2] * rank, [2] * rank
    xshape[d] = n * width
    yshape[u] = n

    def f(self, x, y):  # type: ignore[no-untyped-def]
        parts = torch.split(x * 2.0, width, d - rank)
        rows = torch.unbind(y * 3.0, u)
        return torch.stack([parts[i] for i in range(n)], e) + 1.0, torch.cat([rows[i] for i in range(n)], c)

    gm = run(f, [torch.randn(xshape), torch.randn(yshape)], [*FAMILY, "dce", "cse"])
    assert gm.optimus_report.rules_fired.get("stack_pieces", 0) == 1
    assert gm.optimus_report.rules_fired.get("unbind_cat", 0) == 1
