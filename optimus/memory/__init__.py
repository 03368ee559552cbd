"""Memory: the live-bytes estimate of a graph and the chunked execution of stacked chains.

Why here: both the engine (to gate fusions that add live bytes) and the post-pass that runs
fused chains a few members at a time read the same estimate.
"""


def __getattr__(name: str) -> object:
    """Names the old flat module of this name had, for one release (see ``optimus._moved``)."""
    from optimus._moved import package_attribute

    return package_attribute(__name__, name)
