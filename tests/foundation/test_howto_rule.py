"""docs/optimus.md "Adding a rule", performed on a scratch copy of the repository.

Why: the how-to is what a newcomer follows first, and the rule example used to live only in a
docstring nothing ran. This test writes the rule file and the two registration lines exactly as
the doc shows them (read out of the doc), then optimizes a tiny graph in the copy: the new rule
must be listed, fire, shrink the graph and keep the results.
"""

from __future__ import annotations

import json
from pathlib import Path

import scratch_repo

PROBE = """
import json, torch, optimus

class Exps(torch.nn.Module):
    def forward(self, x):
        return torch.cat([torch.exp(p) for p in x.split(4, dim=1)], dim=1)

x = torch.randn(3, 32)
model = Exps()
gm = optimus.optimize(model, (x,), rules=["batch_exp"])
torch.testing.assert_close(gm(x), model(x))
r = gm.optimus_report
print(json.dumps({"rules": list(optimus.RULES), "fired": dict(r.rules_fired),
                  "before": r.nodes_before, "after": r.nodes_after}))
"""


def test_add_a_rule_as_the_doc_says(tmp_path: Path) -> None:
    repo = scratch_repo.copy_repo(tmp_path / "repo")
    (repo / "optimus/rules/batch/batch_exp.py").write_text(
        scratch_repo.snippet("docs/optimus.md", "rule-file")
    )
    init = repo / "optimus/rules/__init__.py"
    scratch_repo.insert_after(
        init, "from optimus.engine.rule import Rule", scratch_repo.snippet("docs/optimus.md", "rule-import")
    )
    scratch_repo.insert_after(
        init, "REGISTRY: dict[str, type] = {", scratch_repo.snippet("docs/optimus.md", "rule-entry")
    )

    ran = scratch_repo.run(repo, "-c", PROBE)
    assert ran.returncode == 0, ran.stdout + ran.stderr
    got = json.loads(ran.stdout.strip().splitlines()[-1])
    assert "batch_exp" in got["rules"]
    assert got["fired"].get("batch_exp") == 1, got
    assert got["after"] < got["before"], got
