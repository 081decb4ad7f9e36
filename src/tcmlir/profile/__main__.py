"""``python -m tcmlir.profile [--measure] [--target auto|cuda|cpu]``: this machine's ceilings.

Prints the profiler's ceilings (cached, else measured now); ``--measure`` measures again and
refreshes the cache (`tcmlir.profile.ceilings.main`).
"""

import sys

from .ceilings import main

sys.exit(main())
