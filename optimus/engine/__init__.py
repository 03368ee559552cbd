"""The rewrite engine: candidates, rule kinds, the context rules see, the builder they create
nodes with, and the greedy driver with its memory gate, vertical chains and verification.

Why one layer: this is the machinery every rule shares, so no rule repeats it. It knows rules
only through the kinds in ``optimus.engine.rule``; the registry of concrete rules sits above it.
"""
