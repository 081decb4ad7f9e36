"""The errors and warnings of the cache layer (re-exported by `tcmlir.cache`)."""

from __future__ import annotations

from ..errors import TCError

__all__ = ["CacheCorruptionWarning", "CacheError", "CacheWriteWarning"]


class CacheError(TCError):
    """The cache cannot be used as asked (an unreadable export file, a path that is not a
    tcmlir cache, a directory others can write, a disk that is full)."""


class CacheCorruptionWarning(UserWarning):
    """A cache file or row failed its checks and was set aside; it will be rebuilt."""


class CacheWriteWarning(UserWarning):
    """Something could not be written to the cache (a full disk, a read-only file); the
    result it was for is still returned, only not kept."""
