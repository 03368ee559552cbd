"""The exit statuses of every `optimus-bench` subcommand, defined once.

Why one table: CI reads only the exit status. When "bad input", "regression found" and
"the new run lost data" share a number, a typo in a path or a nightly that lost half its
cells looks like (or hides behind) a performance verdict. Each outcome has its own code,
and docs/harness.md ("Exit codes") lists them.
"""

from __future__ import annotations

OK = 0
"""Success: no regression (compare, nightly), the run finished (run, reproduce), parity held (ab)."""

REGRESSION = 1
"""A significant regression was found (compare) and confirmed by re-measurement (nightly)."""

BAD_INPUT = 2
"""Bad input, refused before any work: an unknown option value, a non-finite number, an unreadable
or invalid results file, an unusable output path, a device this host does not have. (argparse
uses 2 for its own usage errors too.)"""

INCOMPLETE = 3
"""The new run cannot be trusted as a whole: a cell of the base is missing from it, one of its
cells is not ``ok`` (failed, timed out, mismatched), or a figure is not a finite number. Wins
over REGRESSION: a verdict on the cells that are left says nothing about the ones that are not."""

MISMATCH = 4
"""``ab``: a mode's first output differs from the base mode's (parity failed)."""

TOOL_FAILED = 5
"""``nightly``: the asv part or the dashboard publish failed; the night is recorded as ``error``."""

INTERRUPTED = 130
"""Ctrl-C; finished cells are saved (``--resume``)."""

MEANING: dict[int, str] = {
    OK: "ok",
    REGRESSION: "regression",
    BAD_INPUT: "bad input",
    INCOMPLETE: "incomplete or non-finite data",
    MISMATCH: "parity mismatch",
    TOOL_FAILED: "asv or publish failed",
    INTERRUPTED: "interrupted",
}
