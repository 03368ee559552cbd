"""Diagnosis tools behind their ``optimus-bench`` subcommands: tower headroom, a cell profile, the live tensors at the peak, the gain on the outside corpus."""
