"""The first python example of the README (using Optimus) runs as written."""

from __future__ import annotations

import re
from pathlib import Path

DOC = Path(__file__).resolve().parents[2] / "README.md"


def test_docs_example_runs() -> None:
    blocks = re.findall(r"```python\n(.*?)```", DOC.read_text(), flags=re.S)
    assert blocks, "no python example in README.md"
    namespace: dict = {}
    exec(compile(blocks[0], str(DOC), "exec"), namespace)
    report = namespace["gm"].optimus_report
    for rule in ("batch_linear", "batch_layer_norm", "batch_unary"):
        assert report.rules_fired.get(rule) == 1, report.rules_fired
    # the split/cat family turns the cat of the 32 tower outputs into one reshape
    assert report.rules_fired.get("unbind_cat") == 1
