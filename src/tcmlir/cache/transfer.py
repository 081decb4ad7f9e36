"""Export and import: carry tuned options (and optionally artifacts) to another machine.

An export is a standalone SQLite file with the cache's own schema (rollback journal, not WAL,
so it is one file), written to a temporary name beside the target and moved into place with
``os.replace``: a reader never sees half an export. Import opens the file read-only, checks
its schema version and every row's checksum, and merges: a candidate already present keeps the
better time, and each key keeps its top-k.
"""

from __future__ import annotations

import contextlib
import os
import sqlite3
import tempfile
from pathlib import Path
from typing import TYPE_CHECKING

from .kernel_cache import ARTIFACT_COLUMNS, KernelCache, _intact
from .options_cache import TUNED_COLUMNS, _Row
from .store import SCHEMA_VERSION, CacheError, CacheStore, create_schema, read_schema_version

if TYPE_CHECKING:
    from .options_cache import OptionsCache

__all__ = ["export_store", "import_into"]


def export_store(store: CacheStore, path: str | os.PathLike[str], *, arch: str | None = None,
                 artifacts: bool = False) -> dict[str, int]:
    """Write the intact tuned rows (and artifacts if asked) of ``arch`` (or all) to ``path``."""
    from .options_cache import OptionsCache

    options = OptionsCache(store=store)
    where, params = ("arch = ?", (arch,)) if arch is not None else ("1", ())
    tuned = options._read_rows(where, params)
    kernels = list(KernelCache(store=store).rows(arch)) if artifacts else []

    target = Path(path).expanduser()
    target.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{target.name}.", suffix=".tmp", dir=target.parent)
    os.close(fd)
    try:
        conn = sqlite3.connect(tmp, isolation_level=None)
        try:
            conn.execute("PRAGMA journal_mode = DELETE")
            conn.execute("BEGIN")
            create_schema(conn)
            conn.execute("INSERT OR REPLACE INTO meta (key, value) VALUES ('exported_arch', ?)",
                         (arch or "*",))
            conn.executemany(
                f"INSERT INTO tuned_options ({', '.join(TUNED_COLUMNS)}) "
                f"VALUES ({', '.join('?' * len(TUNED_COLUMNS))})",
                [tuple(getattr(r, c) for c in TUNED_COLUMNS) for r in tuned])
            conn.executemany(
                f"INSERT INTO artifacts ({', '.join(ARTIFACT_COLUMNS)}) "
                f"VALUES ({', '.join('?' * len(ARTIFACT_COLUMNS))})", kernels)
            conn.execute("COMMIT")
        finally:
            conn.close()
        os.replace(tmp, target)
    except BaseException:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(tmp)
        raise
    return {"tuned_rows": len(tuned), "artifacts": len(kernels)}


def _read_export(path: Path) -> tuple[list[_Row], list[tuple]]:
    if not path.is_file():
        raise CacheError(f"cannot import {path}: no such file")
    try:
        conn = sqlite3.connect(f"{path.resolve().as_uri()}?mode=ro", uri=True)
    except sqlite3.Error as exc:
        raise CacheError(f"cannot import {path}: {exc}") from exc
    try:
        version = read_schema_version(conn)
        if version != str(SCHEMA_VERSION):
            raise CacheError(f"cannot import {path}: its cache schema version is {version}, "
                             f"this tcmlir reads version {SCHEMA_VERSION}; export it again "
                             "with this tcmlir version")
        tuned = [_Row(*r) for r in conn.execute(
            f"SELECT id, {', '.join(TUNED_COLUMNS)} FROM tuned_options")]
        kernels = conn.execute(f"SELECT {', '.join(ARTIFACT_COLUMNS)} FROM artifacts").fetchall()
    except sqlite3.DatabaseError as exc:
        raise CacheError(f"cannot import {path}: it is not a readable tcmlir cache "
                         f"export ({exc})") from exc
    finally:
        conn.close()
    return tuned, kernels


def import_into(cache: OptionsCache, path: str | os.PathLike[str]) -> dict[str, int]:
    """Merge the export at ``path`` into ``cache``'s database; rows failing their checksum are
    skipped and counted in ``corrupt_dropped``. Returns counts of rows merged and skipped."""
    tuned, kernels = _read_export(Path(path).expanduser())
    good_tuned = [tuple(getattr(r, c) for c in TUNED_COLUMNS) for r in tuned if r.is_intact()]
    good_kernels = [r for r in kernels if _intact(r)]
    skipped = len(tuned) - len(good_tuned) + len(kernels) - len(good_kernels)

    def merge(conn: sqlite3.Connection) -> int:
        changed = sum(cache._upsert(conn, values) for values in good_tuned)
        for row in good_kernels:
            KernelCache._insert(conn, row)
        return changed

    merged = cache.db.write(merge, 0)
    artifacts = len(good_kernels)
    cache.counters.corrupt_dropped += skipped
    cache.counters.writes += merged + artifacts
    return {"tuned_rows": merged, "artifacts": artifacts, "skipped": skipped}
