"""Compiled artifacts, persisted: PTX text, cubins, host object files, LLVM IR.

An artifact is stored under ``artifact_digest(key)`` where ``key`` (built by
`tcmlir.cache.keys.artifact_key`) names everything that changes the code. The value is the
payload bytes plus a JSON metadata dict (kernel names, grid/block, ...). Every read checks the
row's checksum; a damaged row is deleted and reported as a miss so the caller rebuilds it.
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

from .keys import artifact_digest, artifact_key_json
from .store import CacheCounters, CacheStore, logger, row_checksum

__all__ = ["ArtifactRecord", "KernelCache", "artifact_checksum"]

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

    def to_dict(self) -> dict[str, Any]:
        return {"digest": self.digest, "kind": self.kind, "arch": self.arch,
                "entry": self.entry, "size": self.size, "meta": dict(self.meta),
                "created": self.created, "key": dict(self.key)}


def _intact(row: tuple) -> bool:
    digest, kind, arch, entry, key_json, payload, meta, _created, checksum = row
    try:
        return (checksum == artifact_checksum(digest, kind, arch, entry, key_json, payload, meta)
                and digest == hashlib.sha256(key_json.encode("utf-8")).hexdigest())
    except (TypeError, ValueError, UnicodeError):
        return False


class KernelCache:
    """Compiled artifacts in the cache database at ``path`` (None: the default location).

    ``counters`` (hits, misses, corrupt_dropped, writes) count this object's work; pass
    ``store`` to share one open database with an `OptionsCache`.
    """

    def __init__(self, path: str | os.PathLike[str] | None = None, *,
                 store: CacheStore | None = None):
        self.db = store if store is not None else CacheStore(path)

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
        return bytes(row[5]), json.loads(row[6])

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
        self.db.write(lambda conn: self._insert(conn, row), None)
        self.counters.writes += 1
        return digest

    @staticmethod
    def _insert(conn: sqlite3.Connection, row: tuple) -> None:
        conn.execute(f"INSERT OR REPLACE INTO artifacts ({', '.join(ARTIFACT_COLUMNS)}) "
                     f"VALUES ({', '.join('?' * len(ARTIFACT_COLUMNS))})", row)

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

    def entries(self, arch: str | None = None, kind: str | None = None) -> list[ArtifactRecord]:
        """Descriptions of the stored artifacts (payloads are not returned)."""
        out = []
        for row in self.rows(arch):
            if kind is not None and row[1] != kind:
                continue
            out.append(ArtifactRecord(row[0], row[1], row[2], row[3], json.loads(row[4]),
                                      len(row[5]), json.loads(row[6]), row[7]))
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
