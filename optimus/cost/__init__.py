"""Cost models: the price of a rewrite (``price.Cost``), the analytic default with its device
constants, the model measured on this machine, and the one block timer.

Why at the bottom: a price depends on ops, bytes and devices, never on the engine.
"""


def __getattr__(name: str) -> object:
    """Names the old flat module of this name had, for one release (see ``optimus._moved``)."""
    from optimus._moved import package_attribute

    return package_attribute(__name__, name)
