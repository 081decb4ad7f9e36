"""Cache trust (issue 12 items 23 and 25): who may write the cache, which files are tcmlir's.

* the cache directory is created 0700 and the database 0600; a directory or file that others
  can write (or that belongs to someone else) is refused with a CacheError;
* only tcmlir's own databases are ever moved aside as damaged: a user's file given as the
  cache path, or another program's SQLite database, is a CacheError and stays untouched;
* imports carry tuned options only: compiled code from another machine never enters the cache.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import sqlite3
import stat
from pathlib import Path

import numpy as np
import pytest

import tcmlir as tc
from tcmlir.cache import CacheError, KernelCache, OptionsCache, artifact_key
from tcmlir.cache.store import CacheStore
from tcmlir.cache.trust import APPLICATION_ID, classify
from tcmlir.signature import ArgSpec, Signature

SRC = "def mm(float(M,K) A, float(K,N) B) -> (C) { C(m,n) +=! A(m,k) * B(k,n) }"
SIG = Signature((ArgSpec((4, 8), "float32", (8, 1)), ArgSpec((8, 2), "float32", (2, 1))))
OPTS = json.dumps({"tile_sizes": [4, 4]})
POSIX = pytest.mark.skipif(os.name != "posix", reason="POSIX ownership and modes")


def mode(path: Path) -> int:
    return stat.S_IMODE(os.stat(path).st_mode)


def akey(**changes: str) -> dict[str, str]:
    parts = {"source": SRC, "entry": "mm", "signature": SIG, "options": OPTS, "arch": "sm_90",
             "kind": "cubin", "tcmlir_version": "0.1.0", "llvm_version": "22.1.0"}
    parts.update(changes)
    return artifact_key(**parts)


# -- item 23: a private cache ------------------------------------------------------------------

@POSIX
def test_new_cache_directory_is_0700_and_files_0600(tmp_path: Path) -> None:
    directory = tmp_path / "fresh" / "tcmlir"
    cache = OptionsCache(directory / "cache.sqlite3")
    cache.store(SRC, "mm", SIG, "sm_90", OPTS, 1e-3, 3)
    assert mode(directory) == 0o700
    for suffix in ("", "-wal", "-shm"):
        assert mode(Path(f"{directory / 'cache.sqlite3'}{suffix}")) == 0o600, suffix
    cache.close()


@POSIX
@pytest.mark.parametrize("bits, who", [(0o777, "everyone"), (0o775, "its group"),
                                       (0o703, "everyone")])
def test_directory_writable_by_others_is_refused(tmp_path: Path, bits: int, who: str) -> None:
    directory = tmp_path / "shared"
    directory.mkdir()
    os.chmod(directory, bits)
    with pytest.raises(CacheError, match=f"writable by {who}.*chmod 700"):
        OptionsCache(directory)
    assert list(directory.iterdir()) == []  # nothing was created in it
    os.chmod(directory, 0o755)  # readable by others is fine: only writing matters
    OptionsCache(directory).close()


@POSIX
def test_world_writable_parent_is_refused_unless_sticky(tmp_path: Path) -> None:
    parent = tmp_path / "pub"
    (parent / "mine").mkdir(parents=True, mode=0o700)
    os.chmod(parent, 0o777)
    with pytest.raises(CacheError, match="writable by everyone"):
        OptionsCache(parent / "mine")
    os.chmod(parent, 0o1777)  # like /tmp: others cannot rename what is ours
    OptionsCache(parent / "mine").close()


@POSIX
@pytest.mark.skipif(not hasattr(os, "geteuid") or os.geteuid() != 0,
                    reason="needs root to give a file to another user")
def test_directory_or_file_of_another_user_is_refused(tmp_path: Path) -> None:
    theirs = tmp_path / "theirs"
    theirs.mkdir(mode=0o700)
    os.chown(theirs, 4242, -1)
    with pytest.raises(CacheError, match="belongs to user id 4242"):
        OptionsCache(theirs)
    mine = tmp_path / "mine"
    mine.mkdir(mode=0o700)
    OptionsCache(mine).close()
    os.chown(mine / "cache.sqlite3", 4242, -1)
    with pytest.raises(CacheError, match="belongs to user id 4242"):
        OptionsCache(mine)


@POSIX
@pytest.mark.parametrize("suffix", ["", "-wal"])
def test_database_file_writable_by_others_is_refused(tmp_path: Path, suffix: str) -> None:
    db = tmp_path / "cache.sqlite3"
    OptionsCache(db).store(SRC, "mm", SIG, "sm_90", OPTS, 1e-3, 3)
    target = Path(f"{db}{suffix}")
    target.touch()
    os.chmod(target, 0o666)
    with pytest.raises(CacheError, match=r"writable by everyone.*chmod 600"):
        OptionsCache(db)


@POSIX
def test_calls_compile_without_an_untrusted_artifact_cache(tmp_path: Path,
                                                           monkeypatch: pytest.MonkeyPatch,
                                                           caplog: pytest.LogCaptureFixture
                                                           ) -> None:
    """A compile never fails for the cache, but it does not use one others can write: it
    says so (a warning) and compiles without it."""
    shared = tmp_path / "shared"
    shared.mkdir()
    os.chmod(shared, 0o777)
    monkeypatch.setenv("TCMLIR_CACHE_DIR", str(shared))
    fn = tc.define("def f(float(N) A) -> (O) { O(i) = A(i) * 3.0 }", target="cpu")
    with caplog.at_level(logging.WARNING, logger="tcmlir.cache"):
        out = fn(np.arange(5, dtype=np.float32))
    np.testing.assert_array_equal(out, np.arange(5, dtype=np.float32) * 3)
    assert "writable by everyone" in caplog.text
    assert list(shared.iterdir()) == []


def test_imports_carry_tuned_options_only(tmp_path: Path) -> None:
    """An SQLite export of an earlier tcmlir with a compiled artifact in it (checksums
    valid): the tuned options are merged, the native code is counted and ignored."""
    old = tmp_path / "old-export.sqlite3"
    src = OptionsCache(old)
    src.store(SRC, "mm", SIG, "sm_90", OPTS, 1e-3, 3)
    KernelCache(store=src.db).put(akey(), b"\x7fELF foreign native code", {})
    src.close()
    dst = OptionsCache(tmp_path / "mine.sqlite3")
    counts = dst.import_(old)
    assert counts == {"tuned_rows": 1, "skipped": 0, "ignored_artifacts": 1}
    assert dst.lookup_options(SRC, "mm", SIG, "sm_90") is not None
    kernels = KernelCache(store=dst.db)
    assert kernels.get(akey()) is None and kernels.entries() == []
    # the JSON export of the result holds options, never payloads
    dst.export(tmp_path / "out.json")
    assert "ELF" not in (tmp_path / "out.json").read_text()


def test_json_import_checks_every_entry(tmp_path: Path,
                                        caplog: pytest.LogCaptureFixture) -> None:
    good = {"source": SRC, "entry": "mm", "arch": "sm_90", "signature": json.loads(SIG.to_json()),
            "sizes": {"M": 4, "K": 8, "N": 2}, "options": json.loads(OPTS), "time_s": 1e-3,
            "runs": 3}
    bad = [{**good, "time_s": -1}, {**good, "runs": True}, {**good, "signature": [[1]]},
           {**good, "sizes": {"M": "4"}}, {k: v for k, v in good.items() if k != "arch"}, 7,
           {**good, "payload": "ignored extra field", "arch": "sm_80"}]
    path = tmp_path / "hand-made.json"
    path.write_text(json.dumps({"format": "tcmlir-tuned-options", "version": 1,
                                "tuned": [good, *bad]}))
    cache = OptionsCache(tmp_path / "c.sqlite3")
    with caplog.at_level(logging.WARNING, logger="tcmlir.cache"):
        counts = cache.import_(path)
    assert counts == {"tuned_rows": 2, "skipped": 6, "ignored_artifacts": 0}
    assert "time_s must be a positive" in caplog.text and "signature" in caplog.text
    assert cache.lookup_options(SRC, "mm", SIG, "sm_90") is not None
    assert cache.lookup_options(SRC, "mm", SIG, "sm_80") is not None
    path.write_text(json.dumps({"format": "something-else"}))
    with pytest.raises(CacheError, match="not a tcmlir export"):
        cache.import_(path)
    path.write_text(json.dumps({"format": "tcmlir-tuned-options", "version": 99, "tuned": []}))
    with pytest.raises(CacheError, match="export version 99"):
        cache.import_(path)


# -- item 25: only tcmlir's own databases are ever moved ---------------------------------------

def _untouched(path: Path, content: bytes) -> None:
    assert path.read_bytes() == content
    assert not [p for p in path.parent.iterdir() if ".corrupt-" in p.name]


@pytest.mark.parametrize("content", [b"my notes: buy milk\n" * 40, os.urandom(8192),
                                     b"SQLite format 3\x00" + b"\xff" * 4000,
                                     b"SQLite format 3\x00" + b"\x00" * 4000],
                         ids=["text", "random", "sqlite-header-ff", "sqlite-header-00"])
def test_a_users_file_is_a_cache_error_and_untouched(tmp_path: Path, content: bytes) -> None:
    notes = tmp_path / "my_notes.txt"
    notes.write_bytes(content)
    with pytest.raises(CacheError, match="tcmlir never overwrites or moves a file"):
        OptionsCache(notes)
    _untouched(notes, content)
    with pytest.raises(CacheError):  # the compile path's cache object says the same
        KernelCache(notes)
    _untouched(notes, content)


def test_another_programs_sqlite_database_is_refused(tmp_path: Path) -> None:
    places = tmp_path / "places.sqlite"
    with contextlib.closing(sqlite3.connect(places)) as conn:
        conn.execute("CREATE TABLE bookmarks (url TEXT)")
        conn.execute("INSERT INTO bookmarks VALUES ('https://example.org')")
        conn.commit()
    content = places.read_bytes()
    assert classify(places) == "foreign"
    with pytest.raises(CacheError, match="SQLite database of another program"):
        OptionsCache(places)
    _untouched(places, content)


def test_autotune_with_a_users_file_as_cache_is_a_cache_error(tmp_path: Path) -> None:
    notes = tmp_path / "my_notes.txt"
    notes.write_text("important\n")
    fn = tc.define("def f(float(N) A) -> (O) { O(i) = A(i) + 1.0 }", target="cpu")
    with pytest.raises(CacheError, match="not a usable tcmlir cache"):
        fn.autotune(np.ones(4, np.float32), generations=1, population=2, cache=str(notes),
                    progress=False)
    assert notes.read_text() == "important\n"


def test_empty_file_and_old_tcmlir_database_are_used(tmp_path: Path) -> None:
    """An empty file becomes a cache; a database of an earlier tcmlir (our tables, no
    application id yet) is recognised by its schema and gets the id."""
    empty = tmp_path / "empty.db"
    empty.touch()
    OptionsCache(empty).store(SRC, "mm", SIG, "sm_90", OPTS, 1e-3, 3)
    assert classify(empty) == "ours"
    old = tmp_path / "old.sqlite3"
    OptionsCache(old).store(SRC, "mm", SIG, "sm_90", OPTS, 1e-3, 3)
    with contextlib.closing(sqlite3.connect(old, isolation_level=None)) as conn:
        conn.execute("PRAGMA application_id = 0")
        conn.execute("DROP TABLE artifact_use")
    assert classify(old) == "ours"  # by its schema
    cache = OptionsCache(old)
    assert cache.lookup_options(SRC, "mm", SIG, "sm_90") is not None
    with contextlib.closing(sqlite3.connect(old)) as conn:
        assert conn.execute("PRAGMA application_id").fetchone() == (APPLICATION_ID,)
        assert conn.execute("SELECT COUNT(*) FROM artifact_use").fetchone() == (0,)


def test_damage_found_while_in_use_moves_only_our_file(tmp_path: Path) -> None:
    """A database this store opened as tcmlir's and that SQLite later finds damaged is moved
    aside (tests/test_cache.py covers damage found at open)."""
    db = tmp_path / "cache.sqlite3"
    store = CacheStore(db)
    cache = OptionsCache(store=store)
    cache.store(SRC, "mm", SIG, "sm_90", OPTS, 1e-3, 3)

    def damaged(conn: sqlite3.Connection) -> None:
        raise sqlite3.DatabaseError("database disk image is malformed")

    with pytest.warns(UserWarning, match="moved it to"):
        assert store.read(damaged, "miss") == "miss"
    assert [p for p in tmp_path.iterdir() if ".corrupt-" in p.name]
    cache.store(SRC, "mm", SIG, "sm_90", OPTS, 1e-3, 3)  # a fresh database serves on
    assert cache.lookup_options(SRC, "mm", SIG, "sm_90") is not None
