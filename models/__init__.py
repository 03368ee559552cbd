"""Synthetic industrial-scale recommendation models built with torchrec."""
