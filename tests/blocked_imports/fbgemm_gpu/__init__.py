"""Stands in for an uninstalled fbgemm_gpu: put tests/blocked_imports first on PYTHONPATH and every
process (the harness's cell subprocesses too) sees `import fbgemm_gpu` fail, as on the GPU machine."""

raise ImportError("fbgemm_gpu is blocked for this test (tests/blocked_imports)")
