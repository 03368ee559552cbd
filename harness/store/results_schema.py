"""The JSON Schema of a results file, generated from the models that validate it.

Why generated and committed: other tools read our results files, and a schema written by hand
would drift from what the harness accepts. ``docs/results.schema.json`` is this module's output
for the built-in metrics; a test checks it still matches the models, and

    python -m harness.store.results_schema           # rewrites docs/results.schema.json
    python -m harness.store.results_schema --check   # exit 1 when the committed file is stale

What the schema cannot say, the harness still checks on load: ``mode`` is one of the registered
modes, an ``ok`` cell has latency samples, a non-``ok`` cell has an error, one cell per key.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

from harness.env import REPO_ROOT
from harness.store import cell_record
from optimus.atomic import write_atomic

SCHEMA_FILE = REPO_ROOT / "docs" / "results.schema.json"
DIALECT = "https://json-schema.org/draft/2020-12/schema"


def results_json_schema() -> dict[str, Any]:
    """The JSON Schema (draft 2020-12) of a results file, for the metrics registered now."""
    schema = cell_record.document_model().model_json_schema()
    return {"$schema": DIALECT, **schema}


def render() -> str:
    """The schema as committed: two-space indent, a final newline."""
    return json.dumps(results_json_schema(), indent=2) + "\n"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=SCHEMA_FILE, help=f"default: {SCHEMA_FILE}")
    parser.add_argument("--check", action="store_true", help="exit 1 when the file differs; write nothing")
    args = parser.parse_args(argv)
    text = render()
    if args.check:
        current = args.out.read_text(encoding="utf-8") if args.out.is_file() else None
        if current != text:
            print(f"{args.out}: stale; run python -m harness.store.results_schema", file=sys.stderr)
            return 1
        print(f"{args.out}: matches the models")
        return 0
    write_atomic(args.out, text)
    print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
