"""Sharded cells: one benchmark cell as one torchrun job of N ranks (``run --nproc N``).

Why its own package: a sharded cell has a parent half (plan the tables before any rank
starts, launch torchrun in its own session, kill the whole tree on a timeout, merge the
per-rank files into one cell) and a rank half (DistributedModelParallel, parity with a
single-process eager run, synchronized timing). Each file holds one of those jobs; see
docs/sharded.md.
"""
