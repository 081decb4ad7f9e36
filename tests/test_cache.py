"""The persistent cache: tuned options, compiled artifacts, concurrency, corruption, transfer.

Uses only tcmlir.cache and tcmlir.signature: options are plain JSON strings, ``fn`` objects
are fakes with the attributes `OptionsCache.lookup` reads.
"""

from __future__ import annotations

import contextlib
import json
import logging
import multiprocessing
import sqlite3
import sys
import threading
import time
import types
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import tcmlir
from tcmlir.cache import (
    CacheCorruptionWarning,
    CacheError,
    KernelCache,
    OptionsCache,
    artifact_digest,
    artifact_key,
)
from tcmlir.cache.keys import ARTIFACT_KEY_FIELDS, ARTIFACT_KINDS
from tcmlir.cache.paths import default_cache_path, resolve_cache_path, user_cache_dir
from tcmlir.cache.store import SCHEMA_VERSION, CacheStore
from tcmlir.signature import ArgSpec, Signature

SRC = "def mm(float(M,K) A, float(K,N) B) -> (C) { C(m,n) +=! A(m,k) * B(k,n) }"


def sig(m: int, k: int = 64, n: int = 32, dtype: str = "float32") -> Signature:
    return Signature((ArgSpec((m, k), dtype, (k, 1)), ArgSpec((k, n), dtype, (n, 1))))


def sizes(m: int, k: int = 64, n: int = 32) -> dict[str, int]:
    return {"M": m, "K": k, "N": n}


def opts(i: int) -> str:
    return json.dumps({"tile": [i, 8], "block": [32, 8]})


def akey(**changes: object) -> dict[str, str]:
    parts = {"source": SRC, "entry": "mm", "signature": sig(4), "options": opts(1),
             "arch": "sm_90", "kind": "ptx", "tcmlir_version": "0.1.0", "llvm_version": "22.1.0"}
    parts.update(changes)
    return artifact_key(**parts)


def raw(path: Path) -> contextlib.closing[sqlite3.Connection]:
    """A plain connection, as another program would tamper with the file."""
    return contextlib.closing(sqlite3.connect(path, isolation_level=None))


@pytest.fixture
def db(tmp_path: Path) -> Path:
    return tmp_path / "cache.sqlite3"


# -- tuned options --------------------------------------------------------------------------

def test_store_lookup_round_trip(db: Path) -> None:
    cache = OptionsCache(db)
    assert cache.store(SRC, "mm", sig(100), "sm_90", opts(1), 2.5e-4, 20, sizes=sizes(100))
    assert cache.lookup_options(SRC, "mm", sig(100), "sm_90") == (json.dumps(
        json.loads(opts(1)), sort_keys=True, separators=(",", ":")), 2.5e-4)
    # the signature given as its JSON text is the same key
    assert cache.lookup_options(SRC, "mm", sig(100).to_json(), "sm_90") is not None
    # another arch, entry, source, stride or dtype is another key
    assert cache.lookup_options(SRC, "mm", sig(100), "sm_80") is None
    assert cache.lookup_options(SRC, "other", sig(100), "sm_90") is None
    assert cache.lookup_options(SRC + " ", "mm", sig(100), "sm_90") is None
    strided = Signature((ArgSpec((100, 64), "float32", (128, 1)), sig(100).args[1]))
    assert cache.lookup_options(SRC, "mm", strided, "sm_90") is None
    assert cache.lookup_options(SRC, "mm", sig(100, dtype="float64"), "sm_90") is None
    record = cache.entries()[0]
    assert (record.entry, record.arch, dict(record.sizes), record.runs) == ("mm", "sm_90",
                                                                           sizes(100), 20)
    cache.close()
    assert OptionsCache(db).lookup_options(SRC, "mm", sig(100), "sm_90")[1] == 2.5e-4


def test_nearest_size_by_log_distance(db: Path, caplog: pytest.LogCaptureFixture) -> None:
    cache = OptionsCache(db)
    for i, m in enumerate((16, 128, 1024)):
        cache.store(SRC, "mm", sig(m), "sm_90", opts(i), 1e-3, 5, sizes=sizes(m))
    # decoys: exact size but another dtype or arch must never be offered
    cache.store(SRC, "mm", sig(100, dtype="float64"), "sm_90", opts(7), 1e-6, 5,
                sizes=sizes(100))
    cache.store(SRC, "mm", sig(100), "sm_80", opts(8), 1e-6, 5, sizes=sizes(100))

    assert cache.lookup_options(SRC, "mm", sig(100), "sm_90", exact=True) is None
    with caplog.at_level(logging.INFO, logger="tcmlir.cache"):
        near = cache.lookup_options(SRC, "mm", sig(100), "sm_90", exact=False, sizes=sizes(100))
    assert json.loads(near[0])["tile"][0] == 1  # 128 is nearest to 100
    assert "log-distance" in caplog.text and "'M': 128" in caplog.text
    for m, expected in ((20, 0), (45, 0), (46, 1), (360, 1), (363, 2), (5000, 2)):
        found = cache.lookup_options(SRC, "mm", sig(m), "sm_90", exact=False, sizes=sizes(m))
        assert json.loads(found[0])["tile"][0] == expected, m
    # without named sizes the input dimensions serve as sizes
    cache.store(SRC, "mm", sig(7, 7, 7), "sm_75", opts(3), 1e-3, 5)
    cache.store(SRC, "mm", sig(700, 7, 7), "sm_75", opts(4), 1e-3, 5)
    found = cache.lookup_options(SRC, "mm", sig(500, 7, 7), "sm_75", exact=False)
    assert json.loads(found[0])["tile"][0] == 4
    # nothing of this rank/dtype/arch at all: a miss
    assert cache.lookup_options(SRC, "mm", sig(100, dtype="float16"), "sm_90",
                                exact=False, sizes=sizes(100)) is None


def test_best_time_kept_and_top_k(db: Path) -> None:
    cache = OptionsCache(db, top_k=3)
    for i, t in enumerate((5.0, 3.0, 4.0, 9.0, 1.0, 7.0)):
        cache.store(SRC, "mm", sig(64), "sm_90", opts(i), t * 1e-3, 10, sizes=sizes(64))
    assert [r.time_s for r in cache.candidates(SRC, "mm", sig(64), "sm_90")] == [1e-3, 3e-3, 4e-3]
    assert cache.lookup_options(SRC, "mm", sig(64), "sm_90")[1] == 1e-3
    # the same options measured slower keep their better time; faster replaces it
    assert not cache.store(SRC, "mm", sig(64), "sm_90", opts(4), 8e-3, 10)
    assert cache.lookup_options(SRC, "mm", sig(64), "sm_90")[1] == 1e-3
    assert cache.store(SRC, "mm", sig(64), "sm_90", opts(1), 0.5e-3, 30)
    best = cache.candidates(SRC, "mm", sig(64), "sm_90")[0]
    assert (json.loads(best.options_json)["tile"][0], best.time_s, best.runs) == (1, 0.5e-3, 30)
    # whitespace or key order in the options JSON is the same candidate
    assert not cache.store(SRC, "mm", sig(64), "sm_90", '{ "block":[32,8], "tile":[1,8] }',
                           0.9e-3, 10)
    with pytest.raises(tcmlir.TCError):  # a CacheError
        cache.store(SRC, "mm", sig(64), "sm_90", opts(1), float("nan"), 10)
    with pytest.raises(tcmlir.TCError):
        cache.store(SRC, "mm", sig(64), "sm_90", opts(1), 1e-3, 0)


@dataclass
class FakeFn:
    """What OptionsCache.lookup reads from a tcmlir.api.TCFunction."""

    canonical_source: str = SRC
    entry: str = "mm"
    arch: str = "sm_90"

    def signature(self, *inputs: np.ndarray) -> Signature:
        return Signature(tuple(ArgSpec(x.shape, str(x.dtype), tuple(s // x.itemsize
                                                                    for s in x.strides))
                               for x in inputs))

    def size_values(self, *inputs: np.ndarray) -> dict[str, int]:
        (m, k), (_, n) = inputs[0].shape, inputs[1].shape
        return {"M": m, "K": k, "N": n}

    def input_spec(self, inputs, target=None):
        from tcmlir.input_spec import InputSpec

        return InputSpec(self.signature(*inputs), self.size_values(*inputs))

    def default_arch(self, target=None) -> str:
        return self.arch


def test_public_lookup_form(db: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    fake_options = types.ModuleType("tcmlir.options")

    class MappingOptions:
        def __init__(self, text: str):
            self.text = text

        @classmethod
        def from_json(cls, text: str) -> MappingOptions:
            return cls(text)

        def to_json(self) -> str:
            return self.text

    fake_options.MappingOptions = MappingOptions
    monkeypatch.setitem(sys.modules, "tcmlir.options", fake_options)

    fn = FakeFn()
    a, b = np.zeros((100, 64), np.float32), np.zeros((64, 32), np.float32)
    cache = OptionsCache(db)
    assert cache.lookup(fn, a, b) is None
    assert cache.record(fn, a, b, options=MappingOptions(opts(2)), time_s=1e-3, runs=7)
    found = cache.lookup(fn, a, b)
    assert isinstance(found, MappingOptions) and json.loads(found.text)["tile"][0] == 2
    assert cache.lookup(FakeFn(arch="sm_80"), a, b) is None
    bigger = np.zeros((120, 64), np.float32)
    assert cache.lookup(fn, bigger, b) is None
    assert json.loads(cache.lookup(fn, bigger, b, exact=False).text)["tile"][0] == 2
    assert cache.counters.as_dict() == {"hits": 2, "misses": 3, "corrupt_dropped": 0,
                                        "writes": 1}


def test_counters_count(db: Path) -> None:
    cache = OptionsCache(db)
    kernels = KernelCache(db)
    assert cache.lookup_options(SRC, "mm", sig(8), "sm_90") is None
    cache.store(SRC, "mm", sig(8), "sm_90", opts(1), 1e-3, 3)
    cache.store(SRC, "mm", sig(8), "sm_90", opts(1), 2e-3, 3)  # not better: no write
    cache.lookup_options(SRC, "mm", sig(8), "sm_90")
    cache.lookup_options(SRC, "mm", sig(8), "sm_90")
    assert cache.counters.as_dict() == {"hits": 2, "misses": 1, "corrupt_dropped": 0,
                                        "writes": 1}
    assert kernels.get(akey()) is None
    kernels.put(akey(), b"ptx", {"kernels": ["mm_kernel0"]})
    assert kernels.get(akey()) == (b"ptx", {"kernels": ["mm_kernel0"]})
    assert kernels.counters.as_dict() == {"hits": 1, "misses": 1, "corrupt_dropped": 0,
                                          "writes": 1}
    stats = cache.stats()
    assert (stats["tuned_rows"], stats["artifacts"], stats["schema_version"]) == (1, 1,
                                                                                  SCHEMA_VERSION)


# -- several processes at once ----------------------------------------------------------------

def _writer(path: str, worker: int, barrier: object, results: object) -> None:
    try:
        cache = OptionsCache(path)
        kernels = KernelCache(store=cache.db)
        barrier.wait(timeout=60)
        for i in range(50):
            m = 1000 * worker + i + 1
            cache.store(SRC, "mm", sig(m), "sm_90", opts(worker), 1e-3 + i * 1e-6, 5,
                        sizes=sizes(m))
            if i % 10 == 0:
                kernels.put(akey(signature=sig(m)), f"ptx {m}".encode(), {"m": m})
        results.put((worker, "ok", cache.counters.as_dict()))
    except BaseException as exc:  # noqa: BLE001 - report anything (CacheError, a broken
        # barrier, ...), never leave the parent waiting
        results.put((worker, "error", repr(exc)))


def _reader(path: str, results: object) -> None:
    try:
        cache = OptionsCache(path)
        found = sum(cache.lookup_options(SRC, "mm", sig(1000 * w + i + 1), "sm_90") is not None
                    for w in range(4) for i in range(50))
        results.put((found, cache.counters.as_dict()))
    except BaseException as exc:  # noqa: BLE001 - report, do not hang the parent
        results.put((-1, repr(exc)))


def _collect(results: object, procs: list, count: int, timeout_s: float) -> list:
    """``count`` reports from ``results`` within ``timeout_s`` in all, then every process
    joined; a process still alive is killed and the test fails (it never hangs)."""
    import queue
    import time

    deadline = time.monotonic() + timeout_s
    reports = []
    try:
        while len(reports) < count:
            left = deadline - time.monotonic()
            try:
                reports.append(results.get(timeout=max(0.1, left)))
            except queue.Empty:
                dead = [p.exitcode for p in procs if not p.is_alive()]
                pytest.fail(f"only {len(reports)} of {count} reports within {timeout_s:g} s "
                            f"(exit codes of finished processes: {dead}): {reports}")
        for p in procs:
            p.join(timeout=max(1.0, deadline - time.monotonic()))
        hung = [p.pid for p in procs if p.is_alive()]
        assert not hung, f"processes {hung} did not exit after reporting"
    finally:
        for p in procs:
            if p.is_alive():
                p.kill()
                p.join(5)
    return reports


def test_four_processes_write_at_once(db: Path) -> None:
    ctx = multiprocessing.get_context("spawn")
    barrier, results = ctx.Barrier(4), ctx.Queue()
    procs = [ctx.Process(target=_writer, args=(str(db), w, barrier, results)) for w in range(4)]
    for p in procs:
        p.start()
    reports = _collect(results, procs, len(procs), 120)
    assert all(status == "ok" for _, status, _ in reports), reports
    assert all(c["writes"] == 50 + 5 for _, _, c in reports)  # shared store: shared counters
    cache = OptionsCache(db)
    assert len(cache.entries()) == 200
    assert len(KernelCache(store=cache.db).entries()) == 20
    # another process gets every option from the cache: no tuning needed
    reader = ctx.Process(target=_reader, args=(str(db), results))
    reader.start()
    [(found, counters)] = _collect(results, [reader], 1, 60)
    assert found == 200, counters
    assert counters["hits"] == 200 and counters["misses"] == 0


def _hold_exclusive_lock(path: Path, locked: threading.Event, seconds: float) -> None:
    conn = sqlite3.connect(path, isolation_level=None)
    try:
        conn.execute("BEGIN EXCLUSIVE")  # on an empty file: locked, and nothing written
        locked.set()
        time.sleep(seconds)
        conn.execute("COMMIT")
    finally:
        conn.close()


def test_opening_a_locked_database_retries_then_succeeds(db: Path) -> None:
    """Another connection holds an exclusive lock while the store opens: with a short busy
    timeout the first attempts fail with 'database is locked'; the bounded back-off retries."""
    locked = threading.Event()
    holder = threading.Thread(target=_hold_exclusive_lock, args=(db, locked, 0.6))
    holder.start()
    try:
        assert locked.wait(10)
        start = time.monotonic()
        store = CacheStore(db, busy_timeout_s=0.05, open_retry_s=10.0)
        took = time.monotonic() - start
    finally:
        holder.join(10)
    assert store.open_retries >= 1 and 0.3 < took < 10.0
    assert store._conn.execute("PRAGMA journal_mode").fetchone() == ("wal",)
    assert store._conn.execute("PRAGMA busy_timeout").fetchone() == (50,)
    OptionsCache(store=store).store(SRC, "mm", sig(4), "sm_90", opts(1), 1e-3, 3)
    store.close()


def test_opening_a_database_locked_too_long_is_a_cache_error(db: Path) -> None:
    locked = threading.Event()
    holder = threading.Thread(target=_hold_exclusive_lock, args=(db, locked, 2.0))
    holder.start()
    try:
        assert locked.wait(10)
        start = time.monotonic()
        with pytest.raises(CacheError, match="stayed locked by another process"):
            CacheStore(db, busy_timeout_s=0.05, open_retry_s=0.4)
        assert time.monotonic() - start < 1.9  # bounded by open_retry_s, not the holder
    finally:
        holder.join(10)


# -- corruption ------------------------------------------------------------------------------

def test_corrupt_tuned_row_dropped_and_rebuilt(db: Path) -> None:
    cache = OptionsCache(db)
    cache.store(SRC, "mm", sig(8), "sm_90", opts(1), 1e-3, 3)
    with raw(db) as conn:
        conn.execute("UPDATE tuned_options SET options = replace(options, '[1,', '[2,')")
    assert cache.lookup_options(SRC, "mm", sig(8), "sm_90") is None
    assert (cache.counters.corrupt_dropped, cache.counters.misses) == (1, 1)
    assert cache.stats()["tuned_rows"] == 0
    cache.store(SRC, "mm", sig(8), "sm_90", opts(1), 1e-3, 3)
    assert json.loads(cache.lookup_options(SRC, "mm", sig(8), "sm_90")[0])["tile"][0] == 1


@pytest.mark.parametrize("damage", ["flip", "truncate"])
def test_corrupt_artifact_dropped_and_rebuilt(db: Path, damage: str) -> None:
    kernels = KernelCache(db)
    payload = bytes(range(256)) * 4
    digest = kernels.put(akey(), payload, {"grid": [4, 1, 1]})
    with raw(db) as conn:
        if damage == "flip":
            (blob,) = conn.execute("SELECT payload FROM artifacts").fetchone()
            flipped = bytearray(blob)
            flipped[100] ^= 0x01
            conn.execute("UPDATE artifacts SET payload = ? WHERE digest = ?",
                         (bytes(flipped), digest))
        else:
            conn.execute("UPDATE artifacts SET payload = substr(payload, 1, 10)")
    assert kernels.get(akey()) is None
    assert kernels.counters.corrupt_dropped == 1 and kernels.counters.misses == 1
    assert kernels.entries() == []
    kernels.put(akey(), payload, {"grid": [4, 1, 1]})
    assert kernels.get(akey()) == (payload, {"grid": [4, 1, 1]})


def _valid_then_truncated(path: Path) -> None:
    cache = OptionsCache(path)
    for m in range(1, 300):
        cache.store(SRC, "mm", sig(m), "sm_90", opts(m), 1e-3, 3)
    cache.close()  # the last connection checkpoints the WAL into the file
    size = path.stat().st_size
    with open(path, "r+b") as f:
        f.truncate(size // 2)


@pytest.mark.parametrize("spoil", ["our-header", "truncated"])
def test_damaged_database_file_moved_aside(db: Path, spoil: str) -> None:
    """Only a file that is recognisably tcmlir's (the SQLite header's application id) is
    moved aside; tests/test_cache_trust.py checks that other files are never touched."""
    if spoil == "our-header":
        header = bytearray(b"SQLite format 3\x00" + b"\xff" * 4000)
        header[68:72] = (0x54434D4C).to_bytes(4, "big")
        db.write_bytes(bytes(header))
    else:
        _valid_then_truncated(db)
    with pytest.warns(CacheCorruptionWarning, match="moved it to"):
        cache = OptionsCache(db)
    aside = [p for p in db.parent.iterdir() if ".corrupt-" in p.name]
    assert aside and cache.counters.corrupt_dropped == 1
    assert cache.lookup_options(SRC, "mm", sig(1), "sm_90") is None
    cache.store(SRC, "mm", sig(1), "sm_90", opts(1), 1e-3, 3)
    assert cache.lookup_options(SRC, "mm", sig(1), "sm_90") is not None


def test_schema_version_mismatch_recreates_tables(db: Path,
                                                  caplog: pytest.LogCaptureFixture) -> None:
    cache = OptionsCache(db)
    cache.store(SRC, "mm", sig(8), "sm_90", opts(1), 1e-3, 3)
    cache.close()
    with raw(db) as conn:
        conn.execute("UPDATE meta SET value = '999' WHERE key = 'schema_version'")
    with caplog.at_level(logging.WARNING, logger="tcmlir.cache"):
        cache = OptionsCache(db)
    assert "schema version 999" in caplog.text
    assert cache.lookup_options(SRC, "mm", sig(8), "sm_90") is None
    assert cache.stats()["tuned_rows"] == 0
    with raw(db) as conn:
        assert conn.execute("SELECT value FROM meta WHERE key = 'schema_version'"
                            ).fetchone() == (str(SCHEMA_VERSION),)


def test_unusable_path_is_a_cache_error(tmp_path: Path) -> None:
    blocker = tmp_path / "file"
    blocker.write_text("")
    with pytest.raises(CacheError, match="TCMLIR_CACHE_DIR"):
        OptionsCache(blocker / "sub" / "cache.sqlite3")


def test_store_uses_wal_and_busy_timeout(db: Path) -> None:
    store = CacheStore(db)
    assert store._conn.execute("PRAGMA journal_mode").fetchone() == ("wal",)
    assert store._conn.execute("PRAGMA busy_timeout").fetchone() == (30000,)


def _forked_lookup(cache: OptionsCache, results: object) -> None:
    found = cache.lookup_options(SRC, "mm", sig(8), "sm_90")
    cache.store(SRC, "mm", sig(9), "sm_90", opts(1), 1e-3, 3)
    results.put((found is not None, cache.counters.as_dict()))


@pytest.mark.skipif(sys.platform != "linux", reason="needs fork")
def test_forked_child_uses_its_own_connection(db: Path) -> None:
    cache = OptionsCache(db)
    cache.store(SRC, "mm", sig(8), "sm_90", opts(1), 1e-3, 3)
    ctx = multiprocessing.get_context("fork")
    results = ctx.Queue()
    child = ctx.Process(target=_forked_lookup, args=(cache, results))
    child.start()
    found, counters = results.get(timeout=30)
    child.join(timeout=30)
    assert found and counters == {"hits": 1, "misses": 0, "corrupt_dropped": 0, "writes": 1}
    assert cache.counters.writes == 1  # the parent's count is its own
    assert cache.lookup_options(SRC, "mm", sig(9), "sm_90") is not None


def test_tables_dropped_meanwhile_is_a_miss(db: Path) -> None:
    cache = OptionsCache(db)
    cache.store(SRC, "mm", sig(8), "sm_90", opts(1), 1e-3, 3)
    with raw(db) as conn:
        conn.execute("DROP TABLE tuned_options")
    assert cache.lookup_options(SRC, "mm", sig(8), "sm_90") is None
    cache.store(SRC, "mm", sig(8), "sm_90", opts(1), 1e-3, 3)
    assert cache.lookup_options(SRC, "mm", sig(8), "sm_90") is not None


# -- export / import --------------------------------------------------------------------------

def test_export_import_round_trip(tmp_path: Path) -> None:
    """Exports are JSON of tuned options only; imports merge them (best time wins) and never
    bring compiled code (tests/test_cache_trust.py checks old SQLite exports)."""
    src = OptionsCache(tmp_path / "a.sqlite3")
    for m in (16, 32, 64):
        src.store(SRC, "mm", sig(m), "sm_90", opts(m), m * 1e-6, 9, sizes=sizes(m))
    src.store(SRC, "mm", sig(16), "sm_80", opts(5), 1e-6, 9, sizes=sizes(16))
    KernelCache(store=src.db).put(akey(), b"cubin bytes", {"block": [32, 8, 1]})
    out = tmp_path / "out" / "sm90.json"
    counts = src.export(out, arch="sm_90")
    assert counts == {"tuned_rows": 3}
    document = json.loads(out.read_text())
    assert document["format"] == "tcmlir-tuned-options" and len(document["tuned"]) == 3
    assert "artifacts" not in document and "cubin" not in out.read_text()
    with pytest.raises(CacheError, match="not exported"):
        src.export(out, artifacts=True)

    dst = OptionsCache(tmp_path / "b.sqlite3")
    dst.store(SRC, "mm", sig(16), "sm_90", opts(16), 1e-9, 2)    # better: kept
    dst.store(SRC, "mm", sig(32), "sm_90", opts(32), 1.0, 2)     # worse: replaced
    merged = dst.import_(out)
    assert merged == {"tuned_rows": 2, "skipped": 0, "ignored_artifacts": 0}
    assert dst.lookup_options(SRC, "mm", sig(16), "sm_90")[1] == 1e-9
    assert dst.lookup_options(SRC, "mm", sig(32), "sm_90")[1] == 32e-6
    assert dst.lookup_options(SRC, "mm", sig(64), "sm_90")[1] == 64e-6
    assert dst.lookup_options(SRC, "mm", sig(16), "sm_80") is None
    # imported rows are real rows: nearest-size lookups see their sizes
    near = dst.lookup_options(SRC, "mm", sig(60), "sm_90", exact=False, sizes=sizes(60))
    assert near[1] == 64e-6
    assert KernelCache(store=dst.db).entries() == []
    assert not list(tmp_path.joinpath("out").glob(".*tmp"))  # no temp file left behind

    (tmp_path / "junk").write_bytes(b"not a cache at all" * 100)
    with pytest.raises(CacheError, match="cannot import"):
        dst.import_(tmp_path / "junk")
    with pytest.raises(CacheError, match="no such file"):
        dst.import_(tmp_path / "missing.json")


# -- keys and paths ---------------------------------------------------------------------------

_text = st.text(max_size=6)
_keys = st.fixed_dictionaries({**{f: _text for f in ARTIFACT_KEY_FIELDS},
                               "kind": st.sampled_from(sorted(ARTIFACT_KINDS))})


@settings(max_examples=200, deadline=None)
@given(a=_keys, b=_keys, field=st.sampled_from(ARTIFACT_KEY_FIELDS), other=_text)
def test_artifact_digest_changes_exactly_with_its_parts(a: dict, b: dict, field: str,
                                                        other: str) -> None:
    assert (artifact_digest(a) == artifact_digest(b)) == (a == b)
    assert artifact_digest(dict(reversed(list(a.items())))) == artifact_digest(a)
    changed = {**a, field: other if field != "kind" else "cubin"}
    assert (artifact_digest(changed) == artifact_digest(a)) == (changed[field] == a[field])


def test_artifact_key_builder() -> None:
    base = akey()
    assert set(base) == set(ARTIFACT_KEY_FIELDS)
    # spelling of the options JSON does not matter; its content does
    assert akey(options='{ "block": [32,8],\n "tile": [1, 8] }') == base
    assert artifact_digest(akey(options=opts(2))) != artifact_digest(base)
    # a parametric kernel is one key for every size, and never equal to a concrete one
    assert akey(signature=sig(4), parametric=True) == akey(signature=sig(999), parametric=True)
    assert akey(signature=sig(4), parametric=True) != base
    assert akey(signature=sig(4, dtype="float64"), parametric=True) != akey(parametric=True)
    for field, value in (("tcmlir_version", "0.2.0"), ("llvm_version", "21.0.0"),
                         ("arch", "sm_80"), ("kind", "cubin"), ("toolchain", "driver 12.4")):
        assert artifact_digest(akey(**{field: value})) != artifact_digest(base), field
    with pytest.raises(ValueError):
        akey(kind="pickle")
    with pytest.raises(ValueError):
        artifact_digest({**base, "gpu_name": "NVIDIA H200"})


def test_cache_paths(tmp_path: Path) -> None:
    home = Path("/home/u")
    assert user_cache_dir("linux", {}, home) == home / ".cache"
    assert user_cache_dir("linux", {"XDG_CACHE_HOME": "/x/c"}, home) == Path("/x/c")
    assert user_cache_dir("linux", {"XDG_CACHE_HOME": "rel"}, home) == home / ".cache"
    assert user_cache_dir("darwin", {}, home) == home / "Library" / "Caches"
    assert user_cache_dir("win32", {"LOCALAPPDATA": "C:/L"}, home) == Path("C:/L")
    assert default_cache_path({"TCMLIR_CACHE_DIR": str(tmp_path)}) == tmp_path / "cache.sqlite3"
    assert default_cache_path({"XDG_CACHE_HOME": "/x/c"}).parts[-2:] == ("tcmlir",
                                                                         "cache.sqlite3")
    assert resolve_cache_path(tmp_path) == tmp_path / "cache.sqlite3"
    assert resolve_cache_path(tmp_path / "f.db") == tmp_path / "f.db"
