"""``python -m mokka``: the same as the ``mokka`` command."""

import sys

from mokka.cli import main

sys.exit(main())
