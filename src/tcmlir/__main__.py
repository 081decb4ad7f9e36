"""``python -m tcmlir``: the same as the ``tcmlir`` command."""

import sys

from .cli import main

sys.exit(main())
