"""What a graph means, read without rewriting it: op normalization and schemas, tensor metadata,
effects, grad-mode/autocast regions, the topological index, observable layouts, freshness and
aliasing, and recognizers of view ops (split, unbind, cat, stack, pieces).

Why a layer: every rule and the engine ask these questions; the answers must be one.
"""
