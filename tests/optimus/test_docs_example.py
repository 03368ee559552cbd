"""The first python example of docs/optimus.md runs as written."""

from __future__ import annotations

import re
from pathlib import Path

DOC = Path(__file__).resolve().parents[2] / "docs" / "optimus.md"


def test_docs_example_runs() -> None:
    blocks = re.findall(r"```python\n(.*?)```", DOC.read_text(), flags=re.S)
    assert blocks, "no python example in docs/optimus.md"
    namespace: dict = {}
    exec(compile(blocks[0], str(DOC), "exec"), namespace)
    report = namespace["gm"].optimus_report
    assert report.rules_fired == {"batch_linear": 1, "batch_layer_norm": 1, "batch_unary": 1}
