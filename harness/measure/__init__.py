"""What a cell measures: step timing, peak memory, and the limit (the ideal step time of the fusable groups)."""
