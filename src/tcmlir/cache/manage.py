"""Managing the cache as a whole: listing, finding one entry, pruning, statistics.

What ``tcmlir cache ls|show|prune|stats`` do, as functions (`cache.cli` only formats them), so
programs can do the same: ``tcmlir.cache.stats()`` gives the entries, the sizes and this
process's hits and misses. Reading functions take a path and never create anything: a cache
that does not exist yet is reported empty (`open_existing` returns None).
"""

from __future__ import annotations

import contextlib
import os
import time
from dataclasses import dataclass, field
from pathlib import Path

from .errors import CacheError
from .kernel_cache import ArtifactRecord, EvictionResult, KernelCache
from .keys import tuned_key_hash
from .options_cache import PROCESS_COUNTERS, OptionsCache, TunedRecord
from .paths import CACHE_FILE_NAME, resolve_cache_path
from .store import CacheStore
from .trust import classify

__all__ = ["CacheStats", "TunedKey", "find_entry", "open_existing", "prune", "set_aside_unusable",
           "stats", "tuned_keys"]

MIN_KEY_PREFIX = 4


@dataclass(frozen=True)
class TunedKey:
    """One tuned kernel signature: its key hash and its candidates, fastest first."""

    key: str
    candidates: tuple[TunedRecord, ...]

    @property
    def best(self) -> TunedRecord:
        return self.candidates[0]

    @property
    def tuned(self) -> float:
        """When its newest candidate was stored."""
        return max(c.created for c in self.candidates)


@dataclass(frozen=True)
class CacheStats:
    """Entries and sizes of the cache at ``path``, and the lookups of this process."""

    path: str
    exists: bool
    tuned_keys: int = 0
    tuned_rows: int = 0
    artifacts: int = 0
    artifact_bytes: int = 0
    file_bytes: int = 0
    max_size: int = 0
    by_kind: dict[str, tuple[int, int]] = field(default_factory=dict)  # kind -> (count, bytes)
    options_hits: int = 0
    options_misses: int = 0
    artifact_hits: int = 0
    artifact_misses: int = 0


def open_existing(path: str | os.PathLike[str] | None = None) -> CacheStore | None:
    """The store of the cache at ``path`` (None: the default location) if its database file
    exists, else None (and nothing is created)."""
    resolved = resolve_cache_path(path)
    if not resolved.is_file():
        return None
    return CacheStore(resolved)


def set_aside_unusable(path: str | os.PathLike[str] | None = None) -> Path | None:
    """Move an unreadable cache file (and its -wal/-shm) to ``<name>.unusable-<time>-<pid>``
    and return where it went, for ``tcmlir cache clear`` on a damaged cache; None (nothing
    moved) unless the file is named as tcmlir names its own (``cache.sqlite3``) and SQLite
    cannot read it or it is no SQLite database at all (a damaged header). Another program's
    SQLite database is never moved."""
    resolved = resolve_cache_path(path)
    if resolved.name != CACHE_FILE_NAME or not resolved.is_file():
        return None
    try:
        identity = classify(resolved)
    except Exception:  # noqa: BLE001 - locked or unreadable: not ours to judge, leave it
        return None
    if identity not in ("not-sqlite", "unrecognised"):
        return None
    dest = resolved.with_name(
        f"{resolved.name}.unusable-{time.strftime('%Y%m%d-%H%M%S')}-{os.getpid()}")
    for suffix in ("", "-wal", "-shm"):
        with contextlib.suppress(FileNotFoundError):
            os.replace(f"{resolved}{suffix}", f"{dest}{suffix}")
    return dest


def tuned_keys(store: CacheStore, arch: str | None = None) -> list[TunedKey]:
    """The tuned signatures in ``store`` (of ``arch``, or all), by entry then arch and sizes."""
    groups: dict[str, list[TunedRecord]] = {}
    for record in OptionsCache(store=store).entries(arch):
        key = tuned_key_hash(record.source, record.entry, record.signature, record.arch)
        groups.setdefault(key, []).append(record)
    keys = [TunedKey(k, tuple(sorted(v, key=lambda r: r.time_s))) for k, v in groups.items()]
    return sorted(keys, key=lambda k: (k.best.entry, k.best.arch, sorted(k.best.sizes.items()),
                                       k.key))


def find_entry(store: CacheStore, prefix: str) -> TunedKey | ArtifactRecord:
    """The tuned key or the artifact whose key (as ``tcmlir cache ls`` prints it) starts
    with ``prefix``; `CacheError` when none or several do."""
    prefix = prefix.strip().lower()
    if len(prefix) < MIN_KEY_PREFIX or any(c not in "0123456789abcdef" for c in prefix):
        raise CacheError(f"cache key {prefix!r}: give at least {MIN_KEY_PREFIX} hex digits of "
                         "a KEY that `tcmlir cache ls` prints")
    matches: list[TunedKey | ArtifactRecord] = [k for k in tuned_keys(store)
                                                if k.key.startswith(prefix)]
    matches += [a for a in KernelCache(store=store).entries() if a.digest.startswith(prefix)]
    if not matches:
        raise CacheError(f"no cache entry has a key starting with {prefix!r} in {store.path}; "
                         "`tcmlir cache ls` lists the keys")
    if len(matches) > 1:
        raise CacheError(f"cache key {prefix!r} is ambiguous ({len(matches)} entries start "
                         "with it); give more digits")
    return matches[0]


def prune(store: CacheStore, max_size: int | None = None,
          older_than_days: float | None = None) -> EvictionResult:
    """Evict compiled artifacts unused for ``older_than_days`` days, then least recently used
    ones down to ``max_size`` bytes (both None: the configured cap); tuned options stay. The
    file is compacted afterwards (a full ``VACUUM``: the explicit command may take its time)."""
    if older_than_days is not None and not older_than_days >= 0:
        raise CacheError(f"--older-than: give a number of days >= 0, got {older_than_days!r}")
    kernels = KernelCache(store=store)
    if max_size is None and older_than_days is None:
        max_size = kernels.max_size or None
    result = kernels.evict(max_size=max_size,
                           older_than_s=None if older_than_days is None
                           else older_than_days * 86400.0)
    store.compact(full=True)
    return result


def _file_bytes(path: Path) -> int:
    size = 0
    for suffix in ("", "-wal"):
        with contextlib.suppress(OSError):
            size += os.path.getsize(f"{path}{suffix}")
    return size


def stats(path: str | os.PathLike[str] | None = None) -> CacheStats:
    """Entries and sizes of the cache at ``path`` (None: the default location; nothing is
    created) and the tuned-options and compiled-artifact lookups of this process."""
    from ..config import get_config
    from .artifacts import COUNTERS

    process = {"options_hits": PROCESS_COUNTERS.hits, "options_misses": PROCESS_COUNTERS.misses,
               "artifact_hits": COUNTERS.hits, "artifact_misses": COUNTERS.misses,
               "max_size": get_config().cache_max_size}
    resolved = resolve_cache_path(path)
    store = open_existing(resolved)
    if store is None:
        return CacheStats(str(resolved), False, **process)
    with store:
        table = store.table_stats()
        by_kind = {kind: (count, size) for kind, count, size in store.read(
            lambda conn: conn.execute("SELECT kind, COUNT(*), SUM(LENGTH(payload)) FROM "
                                      "artifacts GROUP BY kind").fetchall(), [])}
        return CacheStats(str(resolved), True, tuned_keys=table["tuned_keys"],
                          tuned_rows=table["tuned_rows"], artifacts=table["artifacts"],
                          artifact_bytes=table["artifact_bytes"],
                          file_bytes=_file_bytes(resolved), by_kind=by_kind, **process)
