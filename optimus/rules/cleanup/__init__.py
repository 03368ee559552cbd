"""Cleanup rules, run at the start of every driver round: in-place ops made functional, ``x @ W``
seen as a linear, no-op dropouts removed, dead code and common subexpressions."""
