"""The database's tables, their version and the checksums of their rows.

`create_schema` creates the tables of `SCHEMA_VERSION` (and brings a database of an earlier
release of that version up to date: `is_current` says whether it must); `read_schema_version`
reads the recorded version. Rows carry a `row_checksum` the cache layers verify; `read_text`
is the connection's text factory (damaged text reads as a string no checksum matches).
`store.CacheStore`, which opens the database, decides what to do with a file of another
version.
"""

from __future__ import annotations

import hashlib
import sqlite3

from .trust import APPLICATION_ID

__all__ = ["OUR_TABLES", "SCHEMA_VERSION", "create_schema", "is_current", "read_schema_version",
           "read_text", "row_checksum"]

SCHEMA_VERSION = 1
OUR_TABLES = ("tuned_options", "artifacts", "artifact_use", "meta")

_SCHEMA = (
    "CREATE TABLE IF NOT EXISTS meta (key TEXT PRIMARY KEY, value TEXT NOT NULL)",
    """CREATE TABLE IF NOT EXISTS tuned_options (
        id INTEGER PRIMARY KEY,
        key_hash TEXT NOT NULL,       -- tuned_key_hash(source, entry, signature, arch)
        family_hash TEXT NOT NULL,    -- tuned_family_hash(source, entry, arch, ranks_dtypes)
        source TEXT NOT NULL,         -- canonical TC text
        entry TEXT NOT NULL,
        signature TEXT NOT NULL,      -- Signature.to_json(): shapes, dtypes, strides
        arch TEXT NOT NULL,           -- sm_90, cpu-x86_64-znver3, ...
        ranks_dtypes TEXT NOT NULL,   -- JSON [[rank, dtype], ...]
        sizes TEXT NOT NULL,          -- JSON {size name: value}
        options TEXT NOT NULL,        -- MappingOptions.to_json(), canonicalised
        time_s REAL NOT NULL,         -- median measured time
        runs INTEGER NOT NULL,        -- how many runs the median is over
        created REAL NOT NULL,
        checksum TEXT NOT NULL,
        spread_s REAL,                -- spread of the timed runs (NULL: not measured; rows
                                      -- of databases made before the column)
        UNIQUE (key_hash, options))""",
    "CREATE INDEX IF NOT EXISTS tuned_by_key ON tuned_options (key_hash, time_s)",
    "CREATE INDEX IF NOT EXISTS tuned_by_family ON tuned_options (family_hash)",
    """CREATE TABLE IF NOT EXISTS artifacts (
        digest TEXT PRIMARY KEY,      -- artifact_digest(key)
        kind TEXT NOT NULL,
        arch TEXT NOT NULL,
        entry TEXT NOT NULL,
        key_json TEXT NOT NULL,       -- the full key, canonical JSON
        payload BLOB NOT NULL,
        meta TEXT NOT NULL,           -- JSON: kernel names, grid/block, ...
        created REAL NOT NULL,
        checksum TEXT NOT NULL)""",
    # when each artifact was last used (least-recently-used eviction); a table of its own so
    # that a hit updates no checksummed row and databases of schema 1 gain it without a rebuild
    """CREATE TABLE IF NOT EXISTS artifact_use (
        digest TEXT PRIMARY KEY,
        last_used REAL NOT NULL)""",
)


# columns later releases of schema 1 added, as (table, column, declaration): a database
# made before one gains it in place (`create_schema`), its rows kept (the column is NULL)
_ADDED_COLUMNS = (("tuned_options", "spread_s", "REAL"),)


def row_checksum(*parts: str | bytes | int | float) -> str:
    """sha256 over the parts, each tagged with its type and length (so no two rows collide
    by shifting bytes between columns); floats are hashed exactly via ``float.hex``."""
    h = hashlib.sha256()
    for part in parts:
        if isinstance(part, bytes | bytearray | memoryview):
            tag, data = b"b", bytes(part)
        elif isinstance(part, str):  # (surrogates: damaged text, see `read_text`)
            tag, data = b"s", part.encode("utf-8", "surrogatepass")
        elif isinstance(part, bool):
            raise TypeError("row_checksum: bool is ambiguous, pass an int")
        elif isinstance(part, int):
            tag, data = b"i", str(part).encode()
        elif isinstance(part, float):
            tag, data = b"f", part.hex().encode()
        else:
            raise TypeError(f"row_checksum: cannot hash {type(part).__name__}")
        h.update(tag + len(data).to_bytes(8, "little"))
        h.update(data)
    return h.hexdigest()


def read_text(data: bytes) -> str:
    """A TEXT column as str; bytes that are not UTF-8 (damage) become lone surrogates, which no
    row checksum matches, instead of an error on every read of the row."""
    return data.decode("utf-8", "surrogateescape")


def create_schema(conn: sqlite3.Connection) -> None:
    """Create our tables (inside the caller's transaction) and record the schema version."""
    for statement in _SCHEMA:
        conn.execute(statement)
    for table, column, decl in _ADDED_COLUMNS:  # databases made before the column: add it
        if not _has_column(conn, table, column):
            conn.execute(f"ALTER TABLE {table} ADD COLUMN {column} {decl}")
    conn.execute(f"PRAGMA application_id = {APPLICATION_ID}")
    conn.execute("INSERT OR REPLACE INTO meta (key, value) VALUES ('schema_version', ?)",
                 (str(SCHEMA_VERSION),))


def read_schema_version(conn: sqlite3.Connection) -> str | None:
    """The recorded schema version, or None when there is no readable ``meta`` table."""
    try:
        row = conn.execute("SELECT value FROM meta WHERE key = 'schema_version'").fetchone()
    except sqlite3.OperationalError as exc:
        if "no such" in str(exc):
            return None
        raise
    return None if row is None else str(row[0])


def _has_column(conn: sqlite3.Connection, table: str, column: str) -> bool:
    return any(row[1] == column for row in conn.execute(f"PRAGMA table_info({table})"))


def is_current(conn: sqlite3.Connection) -> bool:
    """Whether an up-to-date schema also has what later releases of schema 1 added (the
    application id in the header, the artifact_use table, the spread_s column)."""
    app_id = conn.execute("PRAGMA application_id").fetchone()[0]
    has_use = conn.execute("SELECT 1 FROM sqlite_master WHERE type = 'table' AND "
                           "name = 'artifact_use'").fetchone()
    return (app_id == APPLICATION_ID and has_use is not None
            and all(_has_column(conn, t, c) for t, c, _ in _ADDED_COLUMNS))
