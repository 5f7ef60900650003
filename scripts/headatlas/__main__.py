"""``python -m headatlas``: the headatlas command (see :mod:`headatlas.cli`)."""

import sys

from .cli import main

sys.exit(main())
