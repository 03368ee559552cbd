"""Optimus: general graph-rewrite rules for recommendation models on PyTorch 2."""
