"""Horizontal batch fusion: parallel ops of one signature (linears, layer and batch norms, pointwise ops,
embedding lookups, gate poolings, matmuls) computed as one batched op, and linears sharing an
input merged into one wide linear."""
