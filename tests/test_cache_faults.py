"""Cache faults (issue 12 items 24 and 26): a full disk, rows that no longer parse.

* a cache that cannot be written (disk full, injected here: no disk is filled) never loses a
  finished tuning: ``autotune`` returns its result with a CacheWriteWarning; direct writes are
  CacheErrors (never a raw sqlite3 error) and the connection stays usable afterwards;
* a tuned-options row whose checksum holds but whose options this tcmlir cannot parse is
  dropped and reported like a damaged row, and lookups go on (to the next candidate).
"""

from __future__ import annotations

import json
import logging
import sqlite3
import warnings
from pathlib import Path
from typing import Any

import numpy as np
import pytest

import tcmlir as tc
from tcmlir.cache import CacheError, CacheWriteWarning, KernelCache, OptionsCache, artifact_key
from tcmlir.cache.store import CacheStore
from tcmlir.options import MappingOptions
from tcmlir.signature import Signature

SOURCE = "def f(float(N) A) -> (O) { O(i) = A(i) + 1.0 }"
WRITES = ("INSERT", "UPDATE", "DELETE", "REPLACE")


class FullDisk:
    """An sqlite3 connection whose writes fail as on a full disk (reads work)."""

    def __init__(self, conn: sqlite3.Connection, fail_on: tuple[str, ...] = WRITES):
        self.conn, self.fail_on = conn, fail_on

    def execute(self, sql: str, *args: Any) -> Any:
        if sql.lstrip().upper().startswith(self.fail_on):
            raise sqlite3.OperationalError("database or disk is full")
        return self.conn.execute(sql, *args)

    def executemany(self, sql: str, *args: Any) -> Any:
        if sql.lstrip().upper().startswith(self.fail_on):
            raise sqlite3.OperationalError("database or disk is full")
        return self.conn.executemany(sql, *args)

    def close(self) -> None:
        self.conn.close()


@pytest.fixture
def full_disk(monkeypatch: pytest.MonkeyPatch) -> None:
    """Every CacheStore opened from now on sits on a full disk."""
    connect = CacheStore._connect_and_check
    monkeypatch.setattr(CacheStore, "_connect_and_check",
                        lambda self, timeout: FullDisk(connect(self, timeout)))


def test_autotune_on_a_full_disk_returns_its_result(tmp_path: Path, full_disk: None,
                                                    monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("TCMLIR_CACHE_DIR", str(tmp_path / "artifacts"))  # full as well
    db = tmp_path / "tuned.sqlite3"
    fn = tc.define(SOURCE, target="cpu")
    a = np.arange(6, dtype=np.float32)
    with pytest.warns(CacheWriteWarning, match="were not saved.*disk is full"):
        best = fn.autotune(a, generations=1, population=2, cache=str(db), progress=False)
    assert isinstance(best, MappingOptions)
    np.testing.assert_array_equal(fn(a, options=best), a + 1)


def test_writes_on_a_full_disk_are_cache_errors(tmp_path: Path, full_disk: None) -> None:
    cache = OptionsCache(tmp_path / "c.sqlite3")
    with pytest.raises(CacheError, match=r"writing failed.*disk is full.*tcmlir cache prune"):
        cache.store(SOURCE, "f", Signature(()), "cpu", "{}", 1e-3, 1)
    key = artifact_key(source=SOURCE, entry="f", signature=Signature(()),
                       options="{}", arch="cpu", kind="host-object")
    with pytest.raises(CacheError, match="disk is full"):
        KernelCache(store=cache.db).put(key, b"object code")
    assert cache.lookup_options(SOURCE, "f", Signature(()), "cpu") is None


def test_a_failed_commit_is_rolled_back(tmp_path: Path) -> None:
    """SQLite leaves the transaction open when COMMIT fails on a full disk; without a
    rollback every later write would fail with 'cannot start a transaction within a
    transaction'."""
    cache = OptionsCache(tmp_path / "c.sqlite3")
    sig = Signature(())
    real = cache.db._conn
    cache.db._conn = FullDisk(real, fail_on=("COMMIT",))
    with pytest.raises(CacheError, match="disk is full"):
        cache.store(SOURCE, "f", sig, "cpu", '{"a": 1}', 1e-3, 1)
    cache.db._conn = real  # space freed
    assert not real.in_transaction
    assert cache.store(SOURCE, "f", sig, "cpu", '{"a": 2}', 1e-3, 1)
    assert cache.lookup_options(SOURCE, "f", sig, "cpu")[0] == '{"a":2}'


def test_a_real_sqlite_full_error(tmp_path: Path) -> None:
    """SQLite's own SQLITE_FULL (the page limit reached: what a full disk gives)."""
    kernels = KernelCache(tmp_path / "c.sqlite3", max_size=0)
    conn = kernels.db._conn
    (pages,) = conn.execute("PRAGMA page_count").fetchone()
    conn.execute(f"PRAGMA max_page_count = {pages + 1}")
    key = artifact_key(source=SOURCE, entry="f", signature=Signature(()),
                       options="{}", arch="cpu", kind="host-object")
    with pytest.raises(CacheError, match="disk is full"):
        kernels.put(key, b"x" * 100_000)
    conn.execute("PRAGMA max_page_count = 1073741823")
    kernels.put(key, b"x" * 100_000)
    assert kernels.get(key) == (b"x" * 100_000, {})


def test_hits_are_served_when_their_use_cannot_be_recorded(tmp_path: Path) -> None:
    kernels = KernelCache(tmp_path / "c.sqlite3")
    key = artifact_key(source=SOURCE, entry="f", signature=Signature(()),
                       options="{}", arch="cpu", kind="host-object")
    kernels.put(key, b"object")
    kernels.db._conn = FullDisk(kernels.db._conn)
    assert kernels.get(key) == (b"object", {})


# -- item 26: options that no longer parse -----------------------------------------------------

def _unparseable(opts: MappingOptions) -> str:
    data = json.loads(opts.to_json())
    data["option_of_another_version"] = 3  # a field this tcmlir does not know
    return json.dumps(data)


def test_unparseable_options_are_dropped_and_the_next_candidate_used(
        tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    fn = tc.define(SOURCE, target="cpu")
    a = np.ones(7, np.float32)
    cache = OptionsCache(tmp_path / "c.sqlite3")
    good = MappingOptions.naive().tile(4)
    cache.record(fn, a, options=good, time_s=2e-3, runs=3)
    cache.store(fn.canonical_source, fn.entry, fn.signature(a), fn.default_arch(),
                _unparseable(good), 1e-3, 3, sizes=fn.size_values(a))  # faster, valid checksum
    with pytest.raises(tc.OptionsError):  # what every lookup used to raise
        MappingOptions.from_json(_unparseable(good))
    with caplog.at_level(logging.WARNING, logger="tcmlir.cache"):
        found = cache.lookup(fn, a)
    assert found == good
    assert cache.counters.corrupt_dropped == 1
    assert "cannot read" in caplog.text and "option_of_another_version" in caplog.text
    assert cache.stats()["tuned_rows"] == 1
    assert cache.lookup(fn, a) == good and cache.counters.corrupt_dropped == 1


def test_only_unparseable_options_is_a_miss_everywhere(tmp_path: Path) -> None:
    """The row used to make every lookup raise OptionsError: the factory, autotune and the
    nearest-size lookup now all go on."""
    fn = tc.define(SOURCE, target="cpu")
    a, b = np.ones(7, np.float32), np.ones(9, np.float32)
    db = tmp_path / "c.sqlite3"
    cache = OptionsCache(db)
    for x in (a, b):
        cache.store(fn.canonical_source, fn.entry, fn.signature(x), fn.default_arch(),
                    _unparseable(MappingOptions.naive()), 1e-3, 3, sizes=fn.size_values(x))
    assert cache.lookup(fn, np.ones(8, np.float32), exact=False) is None
    assert cache.counters.corrupt_dropped == 2 and cache.stats()["tuned_rows"] == 0
    cache.store(fn.canonical_source, fn.entry, fn.signature(a), fn.default_arch(),
                _unparseable(MappingOptions.naive()), 1e-3, 3, sizes=fn.size_values(a))
    loaded = tc.define(SOURCE, target="cpu",
                       options_factory=tc.make_load_from_cache_options_factory(str(db)))
    np.testing.assert_array_equal(loaded(a), a + 1)
    cache.store(fn.canonical_source, fn.entry, fn.signature(a), fn.default_arch(),
                _unparseable(MappingOptions.naive()), 1e-3, 3, sizes=fn.size_values(a))
    with warnings.catch_warnings():
        warnings.simplefilter("error", CacheWriteWarning)
        best = fn.autotune(a, generations=1, population=2, cache=str(db), progress=False)
    assert OptionsCache(db).lookup(fn, a) == best  # tuned again and stored


# -- issue 36: a cache that cannot be used is said once, with why and what to do ---------------

def _zero_header(db: Path) -> None:
    with open(db, "r+b") as f:
        f.write(b"\0" * 100)


def test_a_damaged_header_is_said_once_and_clear_starts_afresh(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture) -> None:
    from tcmlir.cache import CacheUnusableWarning
    from tcmlir.cache.artifacts import COUNTERS
    from tcmlir.cli import main

    monkeypatch.setenv("TCMLIR_CACHE_DIR", str(tmp_path))
    monkeypatch.delenv("TCMLIR_ALWAYS_COMPILE", raising=False)
    a = np.arange(5, dtype=np.float32)
    np.testing.assert_array_equal(tc.define(SOURCE, target="cpu")(a), a + 1)
    db = tmp_path / "cache.sqlite3"
    _zero_header(db)
    alias = tmp_path.parent / f"{tmp_path.name}-alias"  # a path this process has not opened
    alias.symlink_to(tmp_path)
    monkeypatch.setenv("TCMLIR_CACHE_DIR", str(alias))
    with pytest.warns(CacheUnusableWarning) as said:
        for n in (5, 6, 7):  # three compiles, one warning
            x = np.arange(n, dtype=np.float32)
            np.testing.assert_array_equal(tc.define(SOURCE, target="cpu")(x), x + 1)
    assert len(said) == 1
    text = str(said[0].message)
    assert str(alias / db.name) in text and "not an SQLite database" in text and "header" in text
    assert "tcmlir cache clear" in text and "calls run correctly" in text
    with pytest.raises(CacheError, match=r"header was damaged.*`tcmlir cache clear` moves it "
                                         r"aside"):
        tc.define(SOURCE, target="cpu").autotune(a, generations=1, population=2, progress=False)
    assert main(["cache", "clear", "--path", str(tmp_path)]) == 0
    out = capsys.readouterr().out
    assert "could not be read (damaged); moved it to" in out
    assert {p.name.split("-")[0] for p in tmp_path.iterdir()} == {"cache.sqlite3.unusable"}
    alias = tmp_path.parent / f"{tmp_path.name}-alias2"
    alias.symlink_to(tmp_path)
    monkeypatch.setenv("TCMLIR_CACHE_DIR", str(alias))
    writes = COUNTERS.writes
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        tc.define(SOURCE, target="cpu")(a)
    assert COUNTERS.writes > writes and db.is_file()  # a new cache, in use


def test_clear_never_moves_another_programs_file(tmp_path: Path) -> None:
    from tcmlir.cli import main

    other = tmp_path / "notes.sqlite3"
    other.write_bytes(b"my notes, not a database")
    assert main(["cache", "clear", "--path", str(other)]) == 2
    assert other.read_bytes() == b"my notes, not a database"


class _Usage:
    total, used, free = 10 << 30, 10 << 30, 4096


@pytest.fixture
def no_space(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A cache at ``tmp_path`` whose creation the full disk interrupted (SQLite's header, not
    yet tcmlir's id nor tables), then a full file system: no free bytes, and SQLite says only
    "disk I/O error" when it opens a database (it cannot make its -shm file), as on a real
    full disk."""
    import shutil

    conn = sqlite3.connect(tmp_path / "cache.sqlite3")
    conn.execute("PRAGMA journal_mode = WAL")
    conn.execute("CREATE TABLE t (x)")  # (a header on disk) ...
    conn.execute("DROP TABLE t")  # ... and no table left
    conn.close()
    (tmp_path / "cache.sqlite3").chmod(0o600)
    monkeypatch.setattr(shutil, "disk_usage", lambda path: _Usage)

    def failing(*args: Any, **kwargs: Any) -> Any:
        raise sqlite3.OperationalError("disk I/O error")

    monkeypatch.setattr(sqlite3, "connect", failing)
    return tmp_path / "cache.sqlite3"


def test_autotune_on_a_full_disk_names_the_full_disk_not_a_lock(
        no_space: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    import time

    monkeypatch.setenv("TCMLIR_CACHE_DIR", str(no_space.parent))
    fn = tc.define(SOURCE, target="cpu")
    a = np.arange(6, dtype=np.float32)
    start = time.monotonic()
    with pytest.raises(CacheError) as info, warnings.catch_warnings():
        warnings.simplefilter("ignore")  # (the calls' own warning, tested below)
        fn.autotune(a, generations=1, population=2, cache=str(no_space), progress=False)
    text = str(info.value)
    assert "no space left on device" in text and "4096 bytes free" in text
    assert "locked" not in text and "free some space" in text
    assert time.monotonic() - start < 8  # no 10 s of retrying a lock nobody holds


def test_calls_when_the_cache_cannot_even_open_on_a_full_disk(
        no_space: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from tcmlir.cache import CacheUnusableWarning

    monkeypatch.setenv("TCMLIR_CACHE_DIR", str(no_space.parent))
    monkeypatch.delenv("TCMLIR_ALWAYS_COMPILE", raising=False)
    a = np.arange(4, dtype=np.float32)
    with pytest.warns(CacheUnusableWarning) as said:
        np.testing.assert_array_equal(tc.define(SOURCE, target="cpu")(a), a + 1)
        np.testing.assert_array_equal(tc.define(SOURCE, target="cpu")(a[:3]), a[:3] + 1)
    assert len(said) == 1
    text = str(said[0].message)
    assert str(no_space) in text and "no space left on device" in text
    assert "free some space" in text and "calls run correctly" in text


def test_calls_on_a_full_disk_say_so_once(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                         full_disk: None) -> None:
    import shutil

    monkeypatch.setenv("TCMLIR_CACHE_DIR", str(tmp_path))
    monkeypatch.delenv("TCMLIR_ALWAYS_COMPILE", raising=False)
    monkeypatch.setattr(shutil, "disk_usage", lambda path: _Usage)
    with pytest.warns(CacheWriteWarning) as said:
        for n in (3, 4, 5):
            x = np.arange(n, dtype=np.float32)
            np.testing.assert_array_equal(tc.define(SOURCE, target="cpu")(x), x + 1)
    assert len(said) == 1
    text = str(said[0].message)
    assert str(tmp_path) in text and "no space left on device" in text


def test_text_that_is_no_longer_utf8_is_a_damaged_row(tmp_path: Path) -> None:
    """A damaged page can leave bytes that are not UTF-8 in a TEXT column (SQLite's structure
    checks pass): every read of the row raised, so the kernel was compiled uncached on every
    run. The row now fails its checksum and is dropped; the next store is a hit."""
    kernels = KernelCache(tmp_path / "c.sqlite3")
    key = artifact_key(source=SOURCE, entry="f", signature=Signature(()),
                       options="{}", arch="cpu", kind="host-object")
    kernels.put(key, b"object")
    kernels.db._conn.execute("UPDATE artifacts SET entry = CAST(X'66ff' AS TEXT)")
    assert kernels.get(key) is None and kernels.counters.corrupt_dropped == 1
    kernels.put(key, b"object")
    assert kernels.get(key) == (b"object", {})
    fn = tc.define(SOURCE, target="cpu")
    a = np.ones(3, np.float32)
    cache = OptionsCache(store=kernels.db)
    cache.record(fn, a, options=MappingOptions.naive(), time_s=1e-3, runs=3)
    kernels.db._conn.execute("UPDATE tuned_options SET sizes = CAST(X'7bff7d' AS TEXT)")
    assert cache.lookup(fn, a) is None and cache.counters.corrupt_dropped == 2  # (shared)
    assert cache.stats()["tuned_rows"] == 0


def test_a_damaged_application_id_is_still_our_cache(tmp_path: Path) -> None:
    """Random bytes over the header's application id made a tcmlir cache "another program's"
    for good; its tables say it is ours, and opening it writes the id again."""
    db = tmp_path / "c.sqlite3"
    cache = OptionsCache(db)
    fn = tc.define(SOURCE, target="cpu")
    a = np.ones(3, np.float32)
    cache.record(fn, a, options=MappingOptions.naive(), time_s=1e-3, runs=3)
    cache.db.close()
    with open(db, "r+b") as f:
        f.seek(68)
        f.write(b"\x13\x37\xbe\xef")
    again = OptionsCache(db)
    assert again.lookup(fn, a) == MappingOptions.naive()
    again.db.close()  # (the last connection: the WAL goes back into the file)
    with open(db, "rb") as f:
        f.seek(68)
        assert f.read(4) == b"TCML"


def test_an_unreadable_file_with_another_id_can_be_cleared(tmp_path: Path,
                                                          capsys: pytest.CaptureFixture) -> None:
    from tcmlir.cli import main

    OptionsCache(tmp_path).db.close()
    db = tmp_path / "cache.sqlite3"
    data = bytearray(db.read_bytes())
    data[68:72] = b"\x13\x37\xbe\xef"
    data[100:4096] = b"\xff" * (4096 - 100)  # the schema page too
    db.write_bytes(bytes(data))
    with pytest.raises(CacheError, match=r"cannot be read.*`tcmlir cache clear` moves it aside"):
        OptionsCache(db)
    assert main(["cache", "clear", "--path", str(tmp_path)]) == 0
    assert "moved it to" in capsys.readouterr().out and not db.exists()


def test_damaged_format_fields_in_our_header_set_the_file_aside(tmp_path: Path) -> None:
    """SQLite says "unsupported file format" (not "malformed") for a header whose format
    fields are damaged: that is damage too, so the cache is moved aside and started again,
    where it was a CacheError telling the user to give another path, on every open."""
    from tcmlir.cache import CacheCorruptionWarning

    db = tmp_path / "c.sqlite3"
    OptionsCache(db).db.close()
    data = bytearray(db.read_bytes())
    data[44:48] = b"\x7f\x7f\x7f\x7f"  # the schema format number
    db.write_bytes(bytes(data))
    with pytest.warns(CacheCorruptionWarning, match="unsupported file format.*moved it to"):
        cache = OptionsCache(db)
    assert cache.stats()["tuned_rows"] == 0
    assert any(p.name.startswith("c.sqlite3.corrupt-") for p in tmp_path.iterdir())
