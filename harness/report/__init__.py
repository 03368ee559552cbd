"""Reports of results files: the markdown report, its plots, the paper table, the published references beside it, and the sharded tables."""
