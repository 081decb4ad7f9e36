"""The SQLite layer under the persistent caches: one file, WAL, short transactions, checked rows.

`CacheStore` owns one connection to the database file and knows nothing about what the rows
mean; `options_cache` and `kernel_cache` build on it. Rules it enforces:

* Concurrency: WAL journal (readers never block the one writer), ``busy_timeout`` so a writer
  waits for another instead of failing with "database is locked", writes in ``BEGIN IMMEDIATE``
  transactions (the write lock is taken up front, so two writers never deadlock upgrading a
  read lock), every transaction a few statements long. Opening (connect, ``journal_mode =
  WAL``, schema) can meet "database is locked" without SQLite's busy handler being consulted
  (another process is switching the journal mode or creating the schema): it is retried with
  an exponential back-off bounded by ``open_retry_s`` (`OPEN_RETRY_S`), then a `CacheError`.
* Schema (the tables and the row checksums: `schema`): a ``meta`` table holds
  ``schema_version``; any other version (older, newer, or a ``meta`` table we cannot read)
  drops and recreates our tables: rows are never misread.
* Trust (`trust`): the directory is created 0700 and refused when others can write it, the
  database is created 0600 and refused when it is someone else's or writable by others.
* Corruption: a tcmlir database SQLite cannot read ("file is not a database", "malformed", a
  failed ``quick_check``) is moved aside to ``<name>.corrupt-<time>-<pid>`` with a warning and
  a fresh database is created; a file that is not tcmlir's (recognised by the SQLite header's
  ``application_id`` or the schema) is a `CacheError` and is never moved. Rows carry checksums
  (`row_checksum`) that the cache layers verify; text that is no longer UTF-8 (a damaged page
  SQLite's structure checks pass) reads as a string that fails its checksum, so the row is
  dropped like any other damaged row instead of failing every read of it.
* Faults: an SQLite error other than a lock or corruption (a full disk, a read-only file) is a
  `CacheError` saying what to do; a failed COMMIT is rolled back, so the connection stays usable.
* No pickle: rows hold text, numbers, JSON text and bytes.
"""

from __future__ import annotations

import contextlib
import logging
import os
import sqlite3
import threading
import time
import warnings
from collections.abc import Callable, Iterator
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import TypeVar

from .errors import (
    CacheCorruptionWarning,
    CacheError,
    CacheWriteWarning,
    CorruptFile,
    describe_failure,
    is_corruption,
    is_locked,
    no_space_left,
)
from .paths import resolve_cache_path
from .schema import (
    OUR_TABLES,
    SCHEMA_VERSION,
    create_schema,
    is_current,
    read_schema_version,
    read_text,
    row_checksum,
)
from .trust import (
    APPLICATION_ID,
    check_private_file,
    classify,
    create_private_file,
    ensure_private_dir,
    refuse_foreign,
)

__all__ = [
    "BUSY_TIMEOUT_S",
    "OPEN_RETRY_S",
    "SCHEMA_VERSION",
    "CacheCorruptionWarning",
    "CacheCounters",
    "CacheError",
    "CacheStore",
    "CacheWriteWarning",
    "create_schema",
    "row_checksum",
]

logger = logging.getLogger("tcmlir.cache")

BUSY_TIMEOUT_S = 30.0
OPEN_RETRY_S = 10.0  # how long opening retries a locked database, in all


@dataclass
class CacheCounters:
    """What this process's cache object did (tests assert on these)."""

    hits: int = 0
    misses: int = 0
    corrupt_dropped: int = 0
    writes: int = 0

    def as_dict(self) -> dict[str, int]:
        return asdict(self)


T = TypeVar("T")


class CacheStore:
    """One connection to the cache database, safe to share between threads of a process.

    ``path``: a file, a directory (``cache.sqlite3`` inside), or None for the default location.
    ``verify``: run SQLite's ``quick_check`` at open (reads every page once).
    ``open_retry_s``: how long opening retries a locked database before a `CacheError`.
    """

    def __init__(self, path: str | os.PathLike[str] | None = None, *,
                 busy_timeout_s: float = BUSY_TIMEOUT_S, verify: bool = True,
                 open_retry_s: float = OPEN_RETRY_S):
        self.path: Path = resolve_cache_path(path)
        self.busy_timeout_s = busy_timeout_s
        self.open_retry_s = open_retry_s
        self.open_retries = 0  # how often opening met a locked database (tests read it)
        self.verify = verify
        self.counters = CacheCounters()
        self._lock = threading.RLock()
        self._conn: sqlite3.Connection | None = None
        self._inode: int | None = None
        self._identity = "empty"  # what trust.classify said of the file this store opened
        self._pid = os.getpid()
        self._abandoned: list[sqlite3.Connection] = []  # inherited across fork, see _after_fork
        self._open()

    # -- opening, schema, recovery -------------------------------------------------------

    def _open(self) -> None:
        try:
            ensure_private_dir(self.path.parent)
            try:
                self._conn = self._connect_retrying()
            except sqlite3.DatabaseError as exc:
                if not is_corruption(exc):
                    raise
                self._quarantine(f"it cannot be read ({exc})")
                self._conn = self._connect_retrying()
        except sqlite3.OperationalError as exc:
            full = no_space_left(self.path)
            if full:
                raise CacheError(
                    f"cannot open the tcmlir cache at {self.path}: {full} ({exc}); free some "
                    "space (`tcmlir cache prune` removes compiled artifacts), or set "
                    "TCMLIR_CACHE_DIR to a disk with room") from exc
            if is_locked(exc):
                raise CacheError(
                    f"cannot open the tcmlir cache at {self.path}: it stayed locked by another "
                    f"process for {self.open_retry_s:g} s ({exc}); retry, or give this process "
                    "its own cache (TCMLIR_CACHE_DIR or an explicit path)") from exc
            raise CacheError(f"cannot open the tcmlir cache at {self.path}: {exc}; give a "
                             "writable path, or set TCMLIR_CACHE_DIR to a writable "
                             "directory") from exc
        except OSError as exc:
            raise CacheError(f"cannot open the tcmlir cache at {self.path}: {exc}; give a "
                             "writable path, or set TCMLIR_CACHE_DIR to a writable "
                             "directory") from exc

    def _connect_retrying(self) -> sqlite3.Connection:
        """`_connect_and_check`, retried with exponential back-off while the database is
        locked, for ``open_retry_s`` seconds in all (then the last error propagates)."""
        deadline = time.monotonic() + self.open_retry_s
        delay = 0.01
        while True:
            try:
                # the busy handler's wait counts against the same bound
                wait = min(self.busy_timeout_s, max(0.05, deadline - time.monotonic()))
                return self._connect_and_check(wait)
            except sqlite3.OperationalError as exc:
                left = deadline - time.monotonic()
                if not is_locked(exc) or left <= 0 or no_space_left(self.path):
                    raise
                self.open_retries += 1
                logger.debug("tcmlir cache %s is locked while opening (%s); retrying",
                             self.path, exc)
                time.sleep(min(delay, left))
                delay = min(delay * 2, 1.0)

    def _connect_and_check(self, open_timeout_s: float) -> sqlite3.Connection:
        """Connect, switch to WAL, check and set up the schema, waiting at most
        ``open_timeout_s`` for each lock; the connection then waits ``busy_timeout_s``."""
        create_private_file(self.path)
        for suffix in ("", "-wal", "-shm"):
            check_private_file(Path(f"{self.path}{suffix}"))
        self._inode = os.stat(self.path).st_ino
        self._identity = classify(self.path)
        if self._identity not in ("ours", "empty"):
            refuse_foreign(self.path, self._identity)
        conn = sqlite3.connect(self.path, timeout=open_timeout_s, isolation_level=None,
                               check_same_thread=False)
        conn.text_factory = read_text
        try:
            conn.execute(f"PRAGMA busy_timeout = {int(open_timeout_s * 1000)}")
            # takes effect only on a new database (before its first table): freed pages
            # can then be given back to the file system after eviction (`compact`)
            conn.execute("PRAGMA auto_vacuum = INCREMENTAL")
            conn.execute("PRAGMA journal_mode = WAL")  # fails here on a file that is not SQLite
            # With WAL, NORMAL stays consistent after a crash; a power cut may lose the last
            # transaction, which for a cache only means redoing that work.
            conn.execute("PRAGMA synchronous = NORMAL")
            if self.verify:
                result = [row[0] for row in conn.execute("PRAGMA quick_check").fetchall()]
                if result != ["ok"]:
                    raise CorruptFile("quick_check: " + "; ".join(map(str, result[:3])))
            self._ensure_schema(conn)
            if conn.execute("PRAGMA application_id").fetchone()[0] != APPLICATION_ID:
                conn.execute(f"PRAGMA application_id = {APPLICATION_ID}")  # a damaged header
            self._identity = "ours"
            conn.execute(f"PRAGMA busy_timeout = {int(self.busy_timeout_s * 1000)}")
        except BaseException:
            conn.close()
            raise
        return conn

    def _ensure_schema(self, conn: sqlite3.Connection) -> None:
        if read_schema_version(conn) == str(SCHEMA_VERSION) and is_current(conn):
            return
        conn.execute("BEGIN IMMEDIATE")
        try:
            found = read_schema_version(conn)  # another process may have set it up meanwhile
            if found != str(SCHEMA_VERSION):
                tables = {name for (name,) in conn.execute(
                    "SELECT name FROM sqlite_master WHERE type = 'table'")}
                stale = [t for t in OUR_TABLES if t in tables]
                if stale:
                    logger.warning("cache %s has schema version %s, this tcmlir uses %s: "
                                   "recreating its tables", self.path, found, SCHEMA_VERSION)
                for table in stale:
                    conn.execute(f"DROP TABLE {table}")
            create_schema(conn)  # idempotent: also brings a schema-1 file up to date
            conn.execute("COMMIT")
        except BaseException:
            with contextlib.suppress(sqlite3.Error):
                conn.execute("ROLLBACK")
            raise

    def _quarantine(self, reason: str) -> None:
        """Move a damaged database (and its -wal/-shm) aside and warn; the caller reopens.

        Only a file known to be tcmlir's is moved (`trust.classify` at open, or a database
        this store set up); anything else is left alone and is a `CacheError`."""
        try:
            inode = os.stat(self.path).st_ino
        except FileNotFoundError:
            inode = None
        if inode is not None and inode == self._inode and self._identity != "ours":
            refuse_foreign(self.path, classify(self.path))
        if self._conn is not None:
            with contextlib.suppress(sqlite3.Error):
                self._conn.close()
            self._conn = None
        # Another process may already have replaced the file with a fresh one: leave that alone.
        if inode is not None and (self._inode is None or inode == self._inode):
            dest = self.path.with_name(
                f"{self.path.name}.corrupt-{time.strftime('%Y%m%d-%H%M%S')}-{os.getpid()}")
            for suffix in ("", "-wal", "-shm"):
                with contextlib.suppress(FileNotFoundError):
                    os.replace(f"{self.path}{suffix}", f"{dest}{suffix}")
            message = (f"tcmlir cache {self.path}: {reason}; moved it to {dest.name} "
                       "and started an empty cache")
        else:
            message = f"tcmlir cache {self.path}: {reason}; another process already replaced it"
        self.counters.corrupt_dropped += 1
        logger.warning("%s", message)
        warnings.warn(message, CacheCorruptionWarning, stacklevel=4)

    # -- transactions -------------------------------------------------------------------

    @contextlib.contextmanager
    def _transaction(self, write: bool) -> Iterator[sqlite3.Connection]:
        assert self._conn is not None, "cache store used after close()"
        conn = self._conn
        conn.execute("BEGIN IMMEDIATE" if write else "BEGIN")
        try:
            yield conn
            conn.execute("COMMIT")  # a failed COMMIT (disk full) leaves the txn open: roll back
        except BaseException:
            with contextlib.suppress(sqlite3.Error):
                conn.execute("ROLLBACK")
            raise

    def run(self, body: Callable[[sqlite3.Connection], T], *, write: bool,
            on_corrupt: T) -> T:
        """Run ``body(conn)`` in one transaction (``BEGIN IMMEDIATE`` when ``write``).

        If SQLite finds the file damaged, the file is moved aside, a fresh database is opened,
        and ``on_corrupt`` is returned (a miss for a read); the same when another process
        dropped our tables meanwhile (a different schema version). A database still locked
        after the busy timeout is a `CacheError`; other errors propagate.
        """
        with self._lock:
            if self._pid != os.getpid():
                self._after_fork()
            try:
                with self._transaction(write) as conn:
                    return body(conn)
            except sqlite3.DatabaseError as exc:
                if is_corruption(exc):
                    self._quarantine(f"damaged ({exc})")
                    self._conn = self._connect_retrying()
                    return on_corrupt
                text = str(exc)
                if isinstance(exc, sqlite3.OperationalError) and "no such table" in text:
                    logger.warning("tcmlir cache %s: %s; recreating the missing tables",
                                   self.path, text)
                    with self._transaction(write=True) as conn:
                        create_schema(conn)
                    return on_corrupt
                if is_locked(exc) and not no_space_left(self.path):
                    raise CacheError(
                        f"tcmlir cache {self.path} stayed locked for {self.busy_timeout_s:g} s "
                        "by another process; retry, or give this process its own cache "
                        "(TCMLIR_CACHE_DIR or an explicit path)") from exc
                if isinstance(exc, sqlite3.OperationalError):
                    raise CacheError(describe_failure(self.path, write, exc)) from exc
                raise

    def _after_fork(self) -> None:
        """A forked child must not use its parent's SQLite connection: open its own (the
        inherited one is kept, never closed: closing its file descriptor would release POSIX
        locks), and start counting afresh (counters are per process)."""
        if self._conn is not None:
            self._abandoned.append(self._conn)
        self._conn = None
        self.counters = CacheCounters()
        self._pid = os.getpid()
        self._open()

    def read(self, body: Callable[[sqlite3.Connection], T], on_corrupt: T) -> T:
        return self.run(body, write=False, on_corrupt=on_corrupt)

    def write(self, body: Callable[[sqlite3.Connection], T], on_corrupt: T) -> T:
        return self.run(body, write=True, on_corrupt=on_corrupt)

    # -- whole-store operations ---------------------------------------------------------

    def clear(self) -> None:
        """Delete every row of both tables (the file and schema stay)."""
        def body(conn: sqlite3.Connection) -> None:
            conn.execute("DELETE FROM tuned_options")
            conn.execute("DELETE FROM artifacts")
            conn.execute("DELETE FROM artifact_use")
        self.write(body, None)
        self.compact(full=False)

    def compact(self, full: bool = False) -> None:
        """Give freed pages back to the file system: ``incremental_vacuum`` (cheap; a no-op on
        a database made before auto-vacuum was set), or with ``full`` a ``VACUUM`` that also
        switches such a database to incremental auto-vacuum (rewrites the file; needs as much
        free disk again). A failure (locked, disk full) is logged: the rows are gone anyway."""
        with self._lock:
            if self._pid != os.getpid():
                self._after_fork()
            assert self._conn is not None, "cache store used after close()"
            try:
                if full:
                    self._conn.execute("PRAGMA auto_vacuum = INCREMENTAL")
                    self._conn.execute("VACUUM")
                    # VACUUM writes the whole new file into the WAL: fold it back in now
                    self._conn.execute("PRAGMA wal_checkpoint(TRUNCATE)").fetchall()
                else:
                    self._conn.execute("PRAGMA incremental_vacuum").fetchall()
            except sqlite3.Error as exc:
                logger.warning("tcmlir cache %s: could not compact the file (%s)", self.path, exc)

    def table_stats(self) -> dict[str, int]:
        def body(conn: sqlite3.Connection) -> dict[str, int]:
            tuned, keys = conn.execute(
                "SELECT COUNT(*), COUNT(DISTINCT key_hash) FROM tuned_options").fetchone()
            artifacts, payload = conn.execute(
                "SELECT COUNT(*), COALESCE(SUM(LENGTH(payload)), 0) FROM artifacts").fetchone()
            return {"tuned_rows": tuned, "tuned_keys": keys, "artifacts": artifacts,
                    "artifact_bytes": payload}
        return self.read(body, {"tuned_rows": 0, "tuned_keys": 0, "artifacts": 0,
                                "artifact_bytes": 0})

    def clear_table(self, table: str, arch: str | None = None) -> int:
        """Delete the rows of ``table`` (``tuned_options`` or ``artifacts``), of one arch or
        all; returns how many went."""
        assert table in ("tuned_options", "artifacts"), table

        def body(conn: sqlite3.Connection) -> int:
            if arch is None:
                gone = conn.execute(f"DELETE FROM {table}").rowcount
            else:
                gone = conn.execute(f"DELETE FROM {table} WHERE arch = ?", (arch,)).rowcount
            if table == "artifacts":
                conn.execute("DELETE FROM artifact_use WHERE digest NOT IN "
                             "(SELECT digest FROM artifacts)")
            return gone
        gone = self.write(body, 0)
        self.compact(full=False)
        return gone

    def stats(self) -> dict[str, object]:
        """Path, schema version, bytes on disk (database + WAL), row counts and this process's counters."""
        size = 0
        for suffix in ("", "-wal"):
            with contextlib.suppress(OSError):
                size += os.path.getsize(f"{self.path}{suffix}")
        return {"path": str(self.path), "schema_version": SCHEMA_VERSION, "file_bytes": size,
                **self.table_stats(), **self.counters.as_dict()}

    def close(self) -> None:
        with self._lock:
            if self._conn is not None:
                self._conn.close()
                self._conn = None

    def __enter__(self) -> CacheStore:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
