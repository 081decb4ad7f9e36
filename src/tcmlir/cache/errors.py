"""The errors and warnings of the cache layer (re-exported by `tcmlir.cache`), and how an
sqlite3 error is told apart: a lock (retry), damage (set the file aside), or a fault to report."""

from __future__ import annotations

import os
import shutil
import sqlite3
from pathlib import Path

from ..errors import TCError

__all__ = ["LOW_SPACE_BYTES", "CacheCorruptionWarning", "CacheError", "CacheUnusableWarning",
           "CacheWriteWarning", "CorruptFile", "describe_failure", "is_corruption", "is_locked", "no_space_left",
           "unusable_message"]

# below this many free bytes, a failed SQLite operation is put down to a full disk (SQLite
# often says only "disk I/O error" when the file system runs out of space)
LOW_SPACE_BYTES = 1 << 20


class CacheError(TCError):
    """The cache cannot be used as asked (an unreadable export file, a path that is not a
    tcmlir cache, a directory others can write, a disk that is full)."""


class CacheCorruptionWarning(UserWarning):
    """A cache file or row failed its checks and was set aside; it will be rebuilt."""


class CacheWriteWarning(UserWarning):
    """Something could not be written to the cache (a full disk, a read-only file); the
    result it was for is still returned, only not kept."""


class CacheUnusableWarning(UserWarning):
    """The compiled-artifact cache cannot be opened (a damaged file, a full disk, ...): calls
    still run correctly, without it. Said once per cache path and process."""


def no_space_left(path: str | os.PathLike[str]) -> str | None:
    """``no space left on device (...)`` when the file system holding ``path`` has (almost)
    no free space, else None."""
    directory = Path(path).parent
    while not directory.exists() and directory != directory.parent:
        directory = directory.parent
    try:
        free = shutil.disk_usage(directory).free
    except OSError:
        return None
    if free >= LOW_SPACE_BYTES:
        return None
    return f"no space left on device ({free} bytes free on the file system holding {directory})"


def unusable_message(path: str | os.PathLike[str], reason: str) -> str:
    """What a call says, once, when the cache at ``path`` cannot be used: why, and what to do."""
    note = f"calls run correctly, without the cache at {path}, for the rest of this process"
    if "TCMLIR_CACHE_DIR" in reason:  # the reason says what to do already
        return f"{reason}\n  ({note})"
    if no_space_left(path) or "no space left" in reason:
        todo = ("free some space (`tcmlir cache prune` removes compiled artifacts), or set "
                "TCMLIR_CACHE_DIR to a disk with room")
    else:
        todo = (f"run `tcmlir cache clear` (it moves a damaged cache file aside and starts a new "
                f"one), move {path} aside, or set TCMLIR_CACHE_DIR to another directory")
    return f"tcmlir cache {path} is unusable: {reason}; {todo}\n  ({note})"


def is_locked(exc: BaseException) -> bool:
    """Whether an sqlite3 error means another connection holds a lock (worth retrying)."""
    text = str(exc).lower()
    return isinstance(exc, sqlite3.OperationalError) and ("locked" in text or "busy" in text)


def is_corruption(exc: BaseException) -> bool:
    """Whether an sqlite3 error means the file itself is damaged (as opposed to busy/locked)."""
    if not isinstance(exc, sqlite3.DatabaseError):
        return False
    name = getattr(exc, "sqlite_errorname", "")
    if name.startswith(("SQLITE_CORRUPT", "SQLITE_NOTADB")):
        return True
    text = str(exc).lower()
    return ("not a database" in text or "malformed" in text or isinstance(exc, CorruptFile)
            or "unsupported file format" in text)  # (a damaged header's format fields)


def describe_failure(path: Path, write: bool, exc: BaseException) -> str:
    """The message of a `CacheError` for an SQLite error that is neither a lock nor damage."""
    text = str(exc)
    name = getattr(exc, "sqlite_errorname", "")
    full = no_space_left(path)
    if full:
        text = f"{text}: {full}"
    if full or name == "SQLITE_FULL" or "disk is full" in text:
        hint = ("the disk is full: free some space (`tcmlir cache prune` removes compiled "
                "artifacts) or set TCMLIR_CACHE_DIR to a disk with room")
    elif name.startswith("SQLITE_READONLY") or "readonly" in text:
        hint = "the cache file or its directory is read-only: give a writable cache"
    else:
        hint = "set TCMLIR_CACHE_DIR to another directory if it persists"
    return (f"tcmlir cache {path}: {'writing' if write else 'reading'} failed ({text}); "
            f"{hint}")


class CorruptFile(sqlite3.DatabaseError):
    """quick_check reported a problem."""
