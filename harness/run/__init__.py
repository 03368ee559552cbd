"""Running cells: one cell in its own process, the suite runner, the interleaved A/B run, the child-process environment, and sharded cells (``sharded/``)."""
