"""``python -m harness.cli``: the same as ``optimus-bench``."""

import sys

from harness.cli import main

sys.exit(main())
