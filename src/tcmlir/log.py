"""tcmlir's logging: stdlib `logging` under the ``tcmlir`` logger, quiet by default.

Every module logs to a child of ``tcmlir`` (``tcmlir.compile``, ``tcmlir.cache``,
``tcmlir.tune``, ``tcmlir.options``):

* INFO: each compile (entry, target, options digest, total time), each tuning generation,
  each tuned-options cache hit or miss;
* DEBUG: the time of each stage and pass of a compile, each compiled-artifact cache hit or miss.

Nothing below WARNING is printed unless asked for: an application configures `logging` as
usual (records propagate to the root logger), or sets ``TCMLIR_LOG=debug|info|warning|error``
(read through `tcmlir.config`), which attaches one stderr handler to the ``tcmlir`` logger at
that level. `setup_logging` applies that setting; `tc.define` and the ``tcmlir`` command call it,
and calling it again follows a changed variable.
"""

from __future__ import annotations

import hashlib
import logging
import sys

__all__ = ["LOG_LEVELS", "get_logger", "options_digest", "setup_logging"]

LOG_LEVELS = {"debug": logging.DEBUG, "info": logging.INFO, "warning": logging.WARNING,
              "error": logging.ERROR}

_ROOT = "tcmlir"
_handler: logging.Handler | None = None
_applied: str | None = None


def get_logger(name: str = "") -> logging.Logger:
    """The ``tcmlir`` logger, or its child ``tcmlir.NAME``."""
    return logging.getLogger(f"{_ROOT}.{name}" if name else _ROOT)


def options_digest(options_json: str) -> str:
    """A short stable digest of a MappingOptions JSON (what compile log lines name)."""
    return hashlib.sha256(options_json.encode("utf-8")).hexdigest()[:12]


def setup_logging(level: str | None = None) -> None:
    """Apply ``TCMLIR_LOG`` (or ``level``, one of `LOG_LEVELS`): attach a stderr handler to the
    ``tcmlir`` logger at that level; unset (and no ``level``) removes the one attached before."""
    global _handler, _applied
    if level is None:
        from .config import log_level

        level = log_level()
    if level == _applied:
        return
    logger = get_logger()
    if _handler is not None:
        logger.removeHandler(_handler)
        _handler = None
    if level:
        _handler = logging.StreamHandler(sys.stderr)
        _handler.setFormatter(logging.Formatter("%(name)s %(levelname)s: %(message)s"))
        _handler.setLevel(LOG_LEVELS[level])
        logger.addHandler(_handler)
        logger.setLevel(LOG_LEVELS[level])
    else:
        logger.setLevel(logging.NOTSET)
    _applied = level
