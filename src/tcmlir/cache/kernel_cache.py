"""Compiled artifacts, persisted: PTX text, cubins, host object files, LLVM IR.

An artifact is stored under ``artifact_digest(key)`` where ``key`` (built by
`tcmlir.cache.keys.artifact_key`) names everything that changes the code. The value is the
payload bytes plus a JSON metadata dict (kernel names, grid/block, ...). Every read checks the
row's checksum; a damaged row is deleted and reported as a miss so the caller rebuilds it.
The checksum detects damage, not tampering: what keeps foreign code out is that only this
user can write the cache (`trust`), and that artifacts are never imported from elsewhere.

Size cap: each `put` evicts least-recently-used artifacts (``artifact_use.last_used``, set by
every hit) until the payloads total at most ``max_size`` bytes (``TCMLIR_CACHE_MAX_SIZE``,
`tcmlir.config`); `evict` does the same on demand, also by age (``tcmlir cache prune``).
Tuned options live in another table and are never evicted.
"""

from __future__ import annotations

import hashlib
import json
import os
import sqlite3
import time
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from typing import Any

from .errors import CacheError
from .keys import artifact_digest, artifact_key_json, text_bytes
from .schema import row_checksum
from .store import CacheCounters, CacheStore, logger

__all__ = ["ArtifactRecord", "EvictionResult", "KernelCache", "artifact_checksum"]

ARTIFACT_COLUMNS = ("digest", "kind", "arch", "entry", "key_json", "payload", "meta", "created",
                    "checksum")


def artifact_checksum(digest: str, kind: str, arch: str, entry: str, key_json: str,
                      payload: bytes, meta: str) -> str:
    return row_checksum("artifact", digest, kind, arch, entry, key_json, payload, meta)


@dataclass(frozen=True)
class ArtifactRecord:
    """A stored artifact's description (its payload is read with `KernelCache.get`)."""

    digest: str
    kind: str
    arch: str
    entry: str
    key: Mapping[str, str]
    size: int
    meta: Mapping[str, Any]
    created: float
    last_used: float = 0.0  # when a lookup last found it (its creation if never)

    def to_dict(self) -> dict[str, Any]:
        return {"digest": self.digest, "kind": self.kind, "arch": self.arch,
                "entry": self.entry, "size": self.size, "meta": dict(self.meta),
                "created": self.created, "last_used": self.last_used, "key": dict(self.key)}


@dataclass(frozen=True)
class EvictionResult:
    """What an eviction removed and what it kept (artifact counts and payload bytes)."""

    removed: int
    removed_bytes: int
    kept: int
    kept_bytes: int


# payload bytes, and the time of last use (creation when never used), per artifact
_USE = ("SELECT a.digest, LENGTH(a.payload), COALESCE(u.last_used, a.created) FROM artifacts a "
        "LEFT JOIN artifact_use u ON u.digest = a.digest")


def _intact(row: tuple) -> bool:
    digest, kind, arch, entry, key_json, payload, meta, _created, checksum = row
    try:
        return (checksum == artifact_checksum(digest, kind, arch, entry, key_json, payload, meta)
                and digest == hashlib.sha256(text_bytes(key_json)).hexdigest())
    except (TypeError, ValueError, UnicodeError):
        return False


class KernelCache:
    """Compiled artifacts in the cache database at ``path`` (None: the default location).

    ``counters`` (hits, misses, corrupt_dropped, writes) count this object's work; pass
    ``store`` to share one open database with an `OptionsCache`.
    """

    def __init__(self, path: str | os.PathLike[str] | None = None, *,
                 store: CacheStore | None = None, max_size: int | None = None):
        if max_size is not None and (isinstance(max_size, bool) or max_size < 0):
            raise CacheError(f"max_size must be a number of bytes >= 0 (0: no cap), "
                             f"got {max_size!r}")
        self.db = store if store is not None else CacheStore(path)
        self._max_size = max_size
        self.evictions = 0  # artifacts this object's puts evicted to keep the cap

    @property
    def max_size(self) -> int:
        """The cap on the artifacts' payload bytes (0: none): the one given, else
        ``TCMLIR_CACHE_MAX_SIZE`` (read at each use)."""
        if self._max_size is not None:
            return self._max_size
        from ..config import get_config

        return get_config().cache_max_size

    @property
    def path(self) -> os.PathLike[str]:
        return self.db.path

    @property
    def counters(self) -> CacheCounters:
        return self.db.counters

    def get(self, key: Mapping[str, str]) -> tuple[bytes, dict[str, Any]] | None:
        """``(payload, meta)`` stored under ``key``, or None (absent or found damaged)."""
        key_json = artifact_key_json(key)
        digest = artifact_digest(key)
        row = self.db.read(lambda conn: conn.execute(
            f"SELECT {', '.join(ARTIFACT_COLUMNS)} FROM artifacts WHERE digest = ?",
            (digest,)).fetchone(), None)
        if row is None:
            self.counters.misses += 1
            return None
        if not _intact(row) or row[4] != key_json:
            self._drop(row)
            self.counters.misses += 1
            return None
        self.counters.hits += 1
        self._touch(digest)
        return bytes(row[5]), json.loads(row[6])

    def _touch(self, digest: str) -> None:
        """Record a use (for least-recently-used eviction); a cache that cannot be written
        (a full disk) still serves the hit."""
        try:
            self.db.write(lambda conn: conn.execute(
                "INSERT OR REPLACE INTO artifact_use (digest, last_used) VALUES (?, ?)",
                (digest, time.time())), None)
        except CacheError as exc:
            logger.debug("tcmlir cache: could not record the use of %s (%s)", digest, exc)

    def _drop(self, row: tuple) -> None:
        self.db.write(lambda conn: conn.execute(
            "DELETE FROM artifacts WHERE digest = ? AND checksum IS ?", (row[0], row[8])), None)
        self.counters.corrupt_dropped += 1
        logger.warning("tcmlir cache %s: dropped artifact %s whose checksum did not match; "
                       "it will be rebuilt", self.db.path, row[0])

    def put(self, key: Mapping[str, str], payload: bytes,
            meta: Mapping[str, Any] | None = None) -> str:
        """Store ``payload`` (bytes) and ``meta`` (JSON-serialisable) under ``key``; returns the
        digest. Storing again under the same key replaces the row (the content is the same)."""
        if not isinstance(payload, bytes | bytearray | memoryview):
            raise TypeError(f"artifact payload must be bytes, got {type(payload).__name__} "
                            "(encode PTX or LLVM IR text as UTF-8)")
        key_json = artifact_key_json(key)
        digest = artifact_digest(key)
        meta_text = json.dumps(dict(meta or {}), sort_keys=True, separators=(",", ":"),
                               allow_nan=False)
        data = bytes(payload)
        row = (digest, key["kind"], key["arch"], key["entry"], key_json, data, meta_text,
               time.time(),
               artifact_checksum(digest, key["kind"], key["arch"], key["entry"], key_json, data,
                                 meta_text))
        cap = self.max_size

        def body(conn: sqlite3.Connection) -> EvictionResult | None:
            self._insert(conn, row)
            conn.execute("INSERT OR REPLACE INTO artifact_use (digest, last_used) VALUES (?, ?)",
                         (digest, row[7]))
            return _evict(conn, cap or None, None, time.time()) if cap else None

        evicted = self.db.write(body, None)
        self.counters.writes += 1
        if evicted is not None and evicted.removed:
            self.evictions += evicted.removed
            logger.info("tcmlir cache %s: evicted %d least-recently-used artifact(s) (%d bytes) "
                        "to stay under the cap of %d bytes (TCMLIR_CACHE_MAX_SIZE)",
                        self.db.path, evicted.removed, evicted.removed_bytes, cap)
            self.db.compact(full=False)
        return digest

    @staticmethod
    def _insert(conn: sqlite3.Connection, row: tuple) -> None:
        conn.execute(f"INSERT OR REPLACE INTO artifacts ({', '.join(ARTIFACT_COLUMNS)}) "
                     f"VALUES ({', '.join('?' * len(ARTIFACT_COLUMNS))})", row)

    def evict(self, max_size: int | None = None, older_than_s: float | None = None,
              now: float | None = None) -> EvictionResult:
        """Delete the artifacts not used for ``older_than_s`` seconds, then the least recently
        used ones until the payloads total at most ``max_size`` bytes (None: either check
        skipped). Tuned options are not touched. Freed pages go back to the file system."""
        now = time.time() if now is None else now
        result = self.db.write(lambda conn: _evict(conn, max_size, older_than_s, now),
                               EvictionResult(0, 0, 0, 0))
        if result.removed:
            self.db.compact(full=False)
        return result

    def total_size(self) -> int:
        """The payload bytes of every stored artifact."""
        return self.db.read(lambda conn: conn.execute(
            "SELECT COALESCE(SUM(LENGTH(payload)), 0) FROM artifacts").fetchone()[0], 0)

    def rows(self, arch: str | None = None) -> Iterator[tuple]:
        """Every intact row in column order ``ARTIFACT_COLUMNS`` (damaged ones are dropped)."""
        where, params = ("arch = ?", (arch,)) if arch is not None else ("1", ())
        rows = self.db.read(lambda conn: conn.execute(
            f"SELECT {', '.join(ARTIFACT_COLUMNS)} FROM artifacts WHERE {where} "
            "ORDER BY entry, kind, digest", params).fetchall(), [])
        for row in rows:
            if _intact(row):
                yield row
            else:
                self._drop(row)

    def last_uses(self) -> dict[str, float]:
        """digest -> when it was last used (its creation time if never)."""
        return dict((d, t) for d, _, t in self.db.read(
            lambda conn: conn.execute(_USE).fetchall(), []))

    def entries(self, arch: str | None = None, kind: str | None = None) -> list[ArtifactRecord]:
        """Descriptions of the stored artifacts (payloads are not returned)."""
        out = []
        uses = self.last_uses()
        for row in self.rows(arch):
            if kind is not None and row[1] != kind:
                continue
            out.append(ArtifactRecord(row[0], row[1], row[2], row[3], json.loads(row[4]),
                                      len(row[5]), json.loads(row[6]), row[7],
                                      uses.get(row[0], row[7])))
        return out

    def clear(self, arch: str | None = None) -> int:
        """Delete the artifacts (of one arch, or all); returns how many went."""
        return self.db.clear_table("artifacts", arch)

    def stats(self) -> dict[str, object]:
        return self.db.stats()

    def close(self) -> None:
        self.db.close()

    def __enter__(self) -> KernelCache:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def _evict(conn: sqlite3.Connection, max_size: int | None, older_than_s: float | None,
           now: float) -> EvictionResult:
    """Inside a write transaction: delete by age, then least recently used first (ties: the
    older creation, then the digest) until at most ``max_size`` payload bytes remain."""
    if older_than_s is None:
        if max_size is None:
            return EvictionResult(0, 0, 0, 0)
        count, total = conn.execute(
            "SELECT COUNT(*), COALESCE(SUM(LENGTH(payload)), 0) FROM artifacts").fetchone()
        if total <= max_size:
            return EvictionResult(0, 0, count, total)  # the common case: one cheap query
    rows = sorted(conn.execute(_USE).fetchall(), key=lambda r: (r[2], r[0]))
    total = sum(size for _, size, _ in rows)
    doomed: list[tuple[str, int]] = []
    keep = []
    for digest, size, last in rows:
        if older_than_s is not None and last < now - older_than_s:
            doomed.append((digest, size))
            total -= size
        else:
            keep.append((digest, size))
    if max_size is not None:
        for digest, size in keep:
            if total <= max_size:
                break
            doomed.append((digest, size))
            total -= size
    conn.executemany("DELETE FROM artifacts WHERE digest = ?", [(d,) for d, _ in doomed])
    conn.execute("DELETE FROM artifact_use WHERE digest NOT IN (SELECT digest FROM artifacts)")
    removed_bytes = sum(size for _, size in doomed)
    return EvictionResult(len(doomed), removed_bytes, len(rows) - len(doomed), total)
