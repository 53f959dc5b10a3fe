"""``python -m kvlab``: the ``kvlab`` command (``kvlab.cli.main``), its exit status the process's."""

import sys

from .cli import main

sys.exit(main())
