"""Split/cat simplification: normalize splits, and remove or merge split -> cat, cat -> split,
stack/unbind and piece-wise copies that only move data."""
