"""Judging results: compare two runs (the regression gate) and the performance goals (targets)."""
