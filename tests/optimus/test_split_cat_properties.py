"""Property: random split/chunk/cat/stack/unbind programs (with pointwise readers and in-place
writes) keep their outputs and gradients through the split/cat rules.

Examples: 200 in CI; 3000 with ``--hypothesis-profile=thorough`` (see conftest.py) or any number
with ``OPTIMUS_SPLITCAT_EXAMPLES=N``.
"""

from __future__ import annotations

import os

import torch
from hypothesis import HealthCheck, given, settings
from split_cat_dags import Plan, Program, plans
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


def test_generator_exercises_the_rules() -> None:
    """The property above is only worth something if the rules fire on the programs drawn."""
    fired: dict[str, int] = {}

    @settings(max_examples=60, deadline=None, database=None, derandomize=True)
    @given(plans())
    def collect(plan: Plan) -> None:
        gm = run(Program(plan), _inputs(plan), [*FAMILY, "dce", "cse"])
        for rule, n in gm.optimus_report.rules_fired.items():
            fired[rule] = fired.get(rule, 0) + n

    collect()
    for rule in FAMILY:
        assert fired.get(rule, 0) > 0, (rule, fired)
