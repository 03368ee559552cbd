"""The modes a cell can run: the registry (``mode_registry``) and the built-in modes (``builtin``)."""
