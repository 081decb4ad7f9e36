"""Ctrl-C during a tuning (``fn.autotune``, ``tcmlir tune``): the first asks it to stop, the
second aborts.

`stop_on_interrupt` installs the SIGINT handler for the whole tuning, from its first instant
(``TCFunction.autotune`` enters it before the tuner's lazy imports, so a Ctrl-C never lands in
one): the first Ctrl-C sets ``StopFlag.stop`` (the search ends after the current generation
and returns the best so far: with none measured yet, the first generation's), a second
raises `KeyboardInterrupt` at once and gives SIGINT back to Python's default handler, so any
further Ctrl-C interrupts as usual. Nested uses share the outer flag. Off the main thread
(where Python cannot install signal handlers) the flag never sets. A small module of its own:
`api` imports it at start-up without loading the tuner.
"""

from __future__ import annotations

import contextlib
import logging
import signal
import threading
from collections.abc import Iterator
from typing import Any

__all__ = ["StopFlag", "stop_on_interrupt"]

log = logging.getLogger("tcmlir.tune")


class StopFlag:
    """``stop``: a Ctrl-C asked the tuning to stop; ``abort``: a second one aborted it."""

    def __init__(self) -> None:
        self.stop = False
        self.abort = False

    def handler(self, signum: int, frame: Any) -> None:
        if self.stop:
            self.abort = True
            signal.signal(signal.SIGINT, signal.default_int_handler)
            raise KeyboardInterrupt
        self.stop = True
        log.warning("interrupted: finishing the current generation and keeping the best so far "
                    "(Ctrl-C again to abort)")


_ACTIVE: StopFlag | None = None  # the main thread's tuning flag while one is installed


@contextlib.contextmanager
def stop_on_interrupt() -> Iterator[StopFlag]:
    """The tuning's `StopFlag`, with the SIGINT handler installed while the block runs."""
    global _ACTIVE
    if threading.current_thread() is not threading.main_thread():
        yield StopFlag()
        return
    if _ACTIVE is not None:
        yield _ACTIVE
        return
    flag = StopFlag()
    old = signal.signal(signal.SIGINT, flag.handler)
    _ACTIVE = flag
    try:
        yield flag
    finally:
        _ACTIVE = None
        if old is not None:
            signal.signal(signal.SIGINT, old)
