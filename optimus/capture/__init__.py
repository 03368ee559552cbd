"""Capture: from the user's module to one FX graph, and the checks that keep that graph valid.

Why a layer of its own: everything that knows about Dynamo, the caller's call (its inputs, its
train/eval mode, the module's structure), torchrec's sparse boundary and the caller's state lives
here, above the rewrite machinery, so the rules and the engine see only a graph.
"""


def __getattr__(name: str) -> object:
    """Names the old flat module of this name had, for one release (see ``optimus._moved``)."""
    from optimus._moved import package_attribute

    return package_attribute(__name__, name)
