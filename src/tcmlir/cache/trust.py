"""Who may write the cache, and which files are tcmlir's own: the checks behind the trust model.

The cache holds native code (host objects, cubins) that tcmlir loads and runs. Row checksums
detect damage, not tampering: anyone who can write the database can write a matching checksum.
So the database is trusted exactly as far as the file system keeps others out of it (the
"Cache trust model" in docs/tuning.md):

* `ensure_private_dir`: the cache directory is created ``0700``; an existing one must belong
  to this user and must not be writable by group or others, and no directory above it may be
  writable by others unless it is sticky (``/tmp``), else a `CacheError` says what to fix.
* `check_private_file`: the database and its ``-wal``/``-shm`` files the same (owned by this
  user, not writable by group or others); `create_private_file` makes the database ``0600``
  (SQLite gives its ``-wal``/``-shm`` files the database's mode).
* `classify`: whether a file is a tcmlir database, by its SQLite header (``application_id``
  = `APPLICATION_ID`, set on every database tcmlir creates) or, for files written before that
  id existed or whose id was damaged, by its schema. Only a tcmlir database is ever moved aside as damaged; a user's
  file given as the cache path, or another program's SQLite database, is a `CacheError` and
  is never touched.

On platforms without POSIX ownership (Windows) the ownership and mode checks are skipped.
"""

from __future__ import annotations

import contextlib
import os
import sqlite3
import stat
from pathlib import Path
from typing import Literal

from .errors import CacheError, is_corruption, no_space_left

__all__ = [
    "APPLICATION_ID",
    "SQLITE_MAGIC",
    "check_private_file",
    "classify",
    "create_private_file",
    "ensure_private_dir",
    "refuse_foreign",
]

APPLICATION_ID = 0x54434D4C  # "TCML", at offset 68 of the SQLite header
SQLITE_MAGIC = b"SQLite format 3\x00"
OUR_TABLES = frozenset({"tuned_options", "artifacts", "meta"})

Identity = Literal["ours", "empty", "not-sqlite", "foreign", "unrecognised"]


def _posix() -> bool:
    return os.name == "posix" and hasattr(os, "geteuid")


def _writable_by_others(mode: int) -> str | None:
    if mode & stat.S_IWOTH:
        return "everyone"
    if mode & stat.S_IWGRP:
        return "its group"
    return None


def ensure_private_dir(directory: Path) -> None:
    """Create ``directory`` (mode 0700; missing parents get the default mode) and check that
    only this user can change what is in it; `CacheError` otherwise."""
    try:
        directory.mkdir(mode=0o700, parents=True, exist_ok=True)
    except FileExistsError as exc:
        raise CacheError(f"cannot use {directory} as the tcmlir cache directory: it exists "
                         "and is not a directory; give another path or set "
                         "TCMLIR_CACHE_DIR") from exc
    check_private_dir(directory)


def check_private_dir(directory: Path) -> None:
    """`CacheError` unless ``directory`` is a directory of this user's that no one else can
    write, below directories that no one else can rename it out of."""
    if not directory.is_dir():
        raise CacheError(f"cannot use {directory} as the tcmlir cache directory: it is not a "
                         "directory; give another path or set TCMLIR_CACHE_DIR")
    if not _posix():
        return
    st = os.stat(directory)
    uid = os.geteuid()
    if st.st_uid != uid:
        raise CacheError(
            f"refusing the tcmlir cache directory {directory}: it belongs to user id "
            f"{st.st_uid}, not to you ({uid}); the cache holds native code that tcmlir runs, "
            "so it must be yours alone: set TCMLIR_CACHE_DIR to a directory of your own")
    who = _writable_by_others(st.st_mode)
    if who is not None:
        raise CacheError(
            f"refusing the tcmlir cache directory {directory}: it is writable by {who} "
            f"(mode {stat.S_IMODE(st.st_mode):o}); the cache holds native code that tcmlir "
            f"runs, so only you may write it: `chmod 700 {directory}`, or set "
            "TCMLIR_CACHE_DIR to a private directory")
    for parent in directory.resolve().parents:
        with contextlib.suppress(OSError):
            pst = os.stat(parent)
            if pst.st_mode & stat.S_IWOTH and not pst.st_mode & stat.S_ISVTX:
                raise CacheError(
                    f"refusing the tcmlir cache directory {directory}: {parent} above it is "
                    "writable by everyone (and not sticky), so anyone could replace the "
                    "cache; set TCMLIR_CACHE_DIR to a directory under private ones")


def check_private_file(path: Path) -> None:
    """`CacheError` if the file at ``path`` exists and belongs to someone else or is writable
    by group or others (it is fine if it does not exist)."""
    if not _posix():
        return
    try:
        st = os.stat(path)
    except FileNotFoundError:
        return
    if not stat.S_ISREG(st.st_mode):
        raise CacheError(f"refusing the tcmlir cache file {path}: it is not a regular file")
    uid = os.geteuid()
    if st.st_uid != uid:
        raise CacheError(
            f"refusing the tcmlir cache file {path}: it belongs to user id {st.st_uid}, not to "
            f"you ({uid}); the cache holds native code that tcmlir runs: delete it or use a "
            "cache of your own (TCMLIR_CACHE_DIR)")
    who = _writable_by_others(st.st_mode)
    if who is not None:
        raise CacheError(
            f"refusing the tcmlir cache file {path}: it is writable by {who} (mode "
            f"{stat.S_IMODE(st.st_mode):o}); the cache holds native code that tcmlir runs: "
            f"`chmod 600 {path}` (and its -wal/-shm files), or use another cache")


def create_private_file(path: Path) -> None:
    """Create ``path`` empty with mode 0600 unless it exists (another process may win)."""
    with contextlib.suppress(FileExistsError):
        os.close(os.open(path, os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o600))


def classify(path: Path) -> Identity:
    """What the file at ``path`` is, read without changing it (see the module docstring):
    ``ours``, ``empty`` (no bytes, or an SQLite database without tables), ``not-sqlite``,
    ``foreign`` (another program's SQLite database: its application id, or tables not
    tcmlir's) or ``unrecognised`` (SQLite's header without tcmlir's id, and no schema that can
    be read). A file with another id but tcmlir's tables is ours with a damaged header."""
    try:
        with open(path, "rb") as f:
            header = f.read(100)
    except FileNotFoundError:
        return "empty"
    if not header:
        return "empty"
    if not header.startswith(SQLITE_MAGIC):
        return "not-sqlite"
    other_id = False
    if len(header) >= 72:
        app_id = int.from_bytes(header[68:72], "big")
        if app_id == APPLICATION_ID:
            return "ours"
        other_id = app_id != 0  # another program's, or our header damaged: the schema says
    try:
        conn = sqlite3.connect(f"{path.resolve().as_uri()}?mode=ro", uri=True)
        try:
            tables = {name for (name,) in conn.execute(
                "SELECT name FROM sqlite_master WHERE type = 'table'")}
        finally:
            conn.close()
    except sqlite3.DatabaseError as exc:
        if is_corruption(exc):
            return "unrecognised"
        if other_id:  # another program's database, busy: not ours to wait for
            return "foreign"
        if no_space_left(path):  # not a lock: retrying would wait in vain and then blame one
            raise
        # locked, busy, or a WAL file being set up by another process that is creating the
        # database right now: the opener retries (bounded), as for any locked database
        raise sqlite3.OperationalError(f"database is locked ({exc})") from exc
    if OUR_TABLES <= tables:
        return "ours"  # (with a damaged id, which opening it writes again)
    return "foreign" if tables or other_id else "empty"


def refuse_foreign(path: Path, identity: Identity) -> None:
    """`CacheError` for a file that is not tcmlir's (tcmlir neither uses nor moves it)."""
    hint = ("tcmlir never overwrites or moves a file it did not create: give the cache a path "
            "of its own (a directory, or a new file name), or set TCMLIR_CACHE_DIR")
    if identity == "not-sqlite":
        raise CacheError(
            f"{path} is not a usable tcmlir cache: it is not an SQLite database (a tcmlir "
            "cache whose header was damaged, or another file); if it is a tcmlir cache, "
            f"`tcmlir cache clear` moves it aside and starts a new one; {hint}")
    if identity == "foreign":
        raise CacheError(f"{path} is an SQLite database of another program, not a tcmlir "
                         f"cache; {hint}")
    if identity == "unrecognised":
        raise CacheError(f"{path} cannot be read and cannot be recognised as a tcmlir cache "
                         f"(it may be damaged); {hint}; if it is a tcmlir cache, `tcmlir cache "
                         "clear` moves it aside and starts a new one")
