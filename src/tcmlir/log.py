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

Compile stages (`timed`, `stage_times`): the pipeline wraps each stage of a compile (scop,
schedule, passes, verify, isl AST, access expressions, LLVM IR, LLVM parse, libdevice, LLVM
opt, PTX, ...) in ``with timed(STAGE):``; inside ``with stage_times() as times:`` (nestable:
every open collector sees every stage) ``times`` maps each stage to its seconds. Times are
exclusive: a stage timed inside another (the access expressions computed in isl's AST
callbacks) is not counted twice, so the stages add up to the compile. The compile log line,
``tcmlir dump --time-passes`` and ``tools/bench_compile.py`` read them.
"""

from __future__ import annotations

import contextlib
import contextvars
import hashlib
import logging
import sys
import time
from collections.abc import Iterator

__all__ = ["LOG_LEVELS", "format_stage_times", "get_logger", "options_digest", "setup_logging",
           "stage_times", "timed"]

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


# the open collectors (dicts stage -> seconds) and the open stages ([name, seconds of nested stages])
_collectors: contextvars.ContextVar[tuple[dict[str, float], ...]] = contextvars.ContextVar(
    "tcmlir_stage_collectors", default=())
_open: contextvars.ContextVar[tuple[list, ...]] = contextvars.ContextVar(
    "tcmlir_open_stages", default=())


@contextlib.contextmanager
def stage_times() -> Iterator[dict[str, float]]:
    """Collect the exclusive seconds of each compile stage timed inside the block."""
    times: dict[str, float] = {}
    token = _collectors.set((*_collectors.get(), times))
    try:
        yield times
    finally:
        _collectors.reset(token)


@contextlib.contextmanager
def timed(stage: str) -> Iterator[None]:
    """Time the block as compile stage ``stage`` (added to every open `stage_times`)."""
    frame = [stage, 0.0]
    outer = _open.get()
    token = _open.set((*outer, frame))
    start = time.perf_counter()
    try:
        yield
    finally:
        elapsed = time.perf_counter() - start
        _open.reset(token)
        if outer:
            outer[-1][1] += elapsed
        own = elapsed - frame[1]
        for times in _collectors.get():
            times[stage] = times.get(stage, 0.0) + own


def format_stage_times(times: dict[str, float], total: float | None = None) -> str:
    """A table of ``times`` (`stage_times`), in the order the stages ran, with a total (and,
    given the ``total`` wall time, the part no stage covered as ``other``)."""
    rows = list(times.items())
    covered = sum(times.values())
    if total is not None and total > covered:
        rows.append(("other", total - covered))
    whole = max(total or 0.0, covered) or 1e-12
    lines = ["===-- compile stage timing --===", f"  {'ms':>9}  {'%':>6}  stage"]
    lines += [f"  {t * 1e3:9.3f}  {100 * t / whole:5.1f}%  {name}" for name, t in rows]
    lines.append(f"  {whole * 1e3:9.3f}  100.0%  total")
    return "\n".join(lines)
