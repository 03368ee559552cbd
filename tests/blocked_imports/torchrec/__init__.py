"""Stands in for an uninstalled torchrec: put tests/blocked_imports first on PYTHONPATH and every
process (the harness's cell subprocesses too) sees `import torchrec` fail, as on the GPU machine."""

raise ImportError("torchrec is blocked for this test (tests/blocked_imports)")
