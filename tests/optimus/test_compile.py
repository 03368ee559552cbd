"""torch.compile integration: the "optimus" backend and the Inductor pre-grad pass (compiles C++
on CPU: few, tiny, marked ``compile``)."""

from __future__ import annotations

import pytest
import torch
from optimus_helpers import LAUNCH_BOUND, assert_parity
from torch._dynamo.backends.registry import lookup_backend

import optimus
from models.synthetic_towers import Towers
from optimus.backend import OptimusPreGradPass

pytestmark = pytest.mark.compile


def test_backend_matches_eager_on_32_towers() -> None:
    """Acceptance: torch.compile(m, backend="optimus") on the 32-tower model matches eager, and
    Optimus fused the 32 linears inside it."""
    torch._dynamo.reset()
    torch.manual_seed(0)
    mod = Towers(32, 16, 16).eval()
    x = torch.randn(8, 32 * 16)
    registered = lookup_backend("optimus")  # the object backend="optimus" names
    seen = len(registered.reports)
    compiled = torch.compile(mod, backend="optimus")
    with torch.no_grad():
        got = compiled(x)
        want = mod(x)
    torch.testing.assert_close(got, want, rtol=1e-4, atol=1e-5)
    reports = registered.reports[seen:]
    assert reports and reports[-1].rules_fired.get("batch_linear") == 1
    assert reports[-1].capture == "backend"


def test_pre_grad_pass_trains_and_has_a_stable_uuid() -> None:
    base = OptimusPreGradPass()
    assert base.uuid() == OptimusPreGradPass().uuid() == optimus.pre_grad_pass.uuid()
    tuned = OptimusPreGradPass(optimus.OptimusConfig(cost_model=LAUNCH_BOUND))
    assert tuned.uuid() != base.uuid()  # other options -> other cache key
    torch._dynamo.reset()
    torch.manual_seed(0)
    mod = Towers(6, 4, 4)
    x = torch.randn(3, 24)
    # Caches off: on a warm cache hit Inductor reuses the rewritten graph without running the
    # pass again (correct, since uuid() is in the key), and there would be no report to check.
    with torch._inductor.config.patch(pre_grad_custom_pass=tuned, force_disable_caches=True):
        compiled = torch.compile(mod)
        assert_parity(mod, compiled, [x], rtol=1e-4, atol=1e-5)
    reports = [r for r in tuned.reports if r.capture == "pre_grad"]
    assert reports and reports[-1].rules_fired.get("batch_linear") == 1
