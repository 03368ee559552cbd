"""Benchmark and regression harness: runs models x modes x phases and compares results."""
