"""``python -m xnnguard``: the ``xnnguard`` command."""

import sys

from xnnguard.cli import main

sys.exit(main())
