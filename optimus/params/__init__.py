"""Parameters after a rewrite: the one-time re-layout into stacked storage, its groups, and the
part of PyTorch's parameter contract (gradients, ``state_dict``, later changes) it must keep.

Why above the engine: the re-layout is one implementation of the engine's ``ParamLayout``
protocol (``optimus.engine.param_layout``), chosen by the caller.
"""
