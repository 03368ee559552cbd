"""Model providers shipped with the harness for models this repository did not write
(`--provider harness.providers.<module>:build`; the contract is in harness/provider.py)."""
