"""airspeed velocity (asv) suite for Optimus-bench: one ``bench_<area>.py`` per area.

The figures come from the harness (``optimus-bench run``), so asv tracks across commits
exactly what the harness measures; see docs/asv.md for how to run, widen and publish it.
"""
