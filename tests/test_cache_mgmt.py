"""Cache management (issue 13 item 3): ``tcmlir cache`` commands, pruning, the size cap, stats.

Exit codes and messages of every action; reading actions on a missing or empty directory
create nothing; prune keeps tuned options and evicts least-recently-used artifacts; the
automatic cap (TCMLIR_CACHE_MAX_SIZE) holds through loops of distinct compiles and puts.
"""

from __future__ import annotations

import contextlib
import json
import re
import sqlite3
import time
from pathlib import Path

import numpy as np
import pytest

import tcmlir as tc
from tcmlir.cache import KernelCache, OptionsCache, artifact_key, prune, stats
from tcmlir.cache.artifacts import COUNTERS, artifact_cache
from tcmlir.cache.cli import human_date, human_size
from tcmlir.cli import main
from tcmlir.config import DEFAULT_CACHE_MAX_SIZE, get_config, parse_size
from tcmlir.signature import ArgSpec, Signature

SRC = "def mm(float(M,K) A, float(K,N) B) -> (C) { C(m,n) +=! A(m,k) * B(k,n) }"
DATE = r"\d{4}-\d\d-\d\d \d\d:\d\d"


def sig(m: int) -> Signature:
    return Signature((ArgSpec((m, 8), "float32", (8, 1)), ArgSpec((8, 2), "float32", (2, 1))))


def akey(i: int) -> dict[str, str]:
    return artifact_key(source=SRC, entry="mm", signature=sig(i), options="{}", arch="sm_90",
                        kind="ptx", tcmlir_version="0", llvm_version="0")


def filled(db: Path, artifacts: int = 3, payload: int = 1000) -> tuple[OptionsCache,
                                                                        KernelCache]:
    """Two tuned signatures (three candidates) and ``artifacts`` artifacts of ``payload``
    bytes, created in order (the first is the least recently used)."""
    options = OptionsCache(db)
    options.store(SRC, "mm", sig(16), "sm_90", '{"tile_sizes":[4]}', 2e-3, 5,
                  sizes={"M": 16, "K": 8, "N": 2})
    options.store(SRC, "mm", sig(16), "sm_90", '{"tile_sizes":[8]}', 1e-3, 5,
                  sizes={"M": 16, "K": 8, "N": 2})
    options.store(SRC, "mm", sig(32), "sm_80", '{"tile_sizes":[2]}', 3e-3, 5,
                  sizes={"M": 32, "K": 8, "N": 2})
    kernels = KernelCache(store=options.db, max_size=0)
    for i in range(artifacts):
        kernels.put(akey(i), bytes([i]) * payload, {"n": i})
        time.sleep(0.002)  # distinct last-use times
    return options, kernels


def run(capsys: pytest.CaptureFixture, *argv: str) -> tuple[int, str, str]:
    code = main(["cache", *argv])
    out = capsys.readouterr()
    return code, out.out, out.err


# -- reading actions create nothing ------------------------------------------------------------

@pytest.mark.parametrize("action", ["ls", "stats", "prune", "clear"])
@pytest.mark.parametrize("where", ["missing", "empty"])
def test_reading_a_missing_cache_creates_nothing(tmp_path: Path, capsys: pytest.CaptureFixture,
                                                 action: str, where: str) -> None:
    directory = tmp_path / "cache"
    if where == "empty":
        directory.mkdir()
    code, out, err = run(capsys, action, "--path", str(directory))
    assert code == 0, err
    assert ("does not exist yet" if action == "stats" else "no tcmlir cache at") in out
    assert sorted(p.name for p in tmp_path.iterdir()) == (["cache"] if where == "empty" else [])
    if where == "empty":
        assert list(directory.iterdir()) == []


def test_default_location_is_not_created_by_ls(tmp_path: Path, capsys: pytest.CaptureFixture,
                                               monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("TCMLIR_CACHE_DIR", str(tmp_path / "never"))
    assert run(capsys, "ls")[0] == 0
    assert not (tmp_path / "never").exists()
    assert not stats().exists and not (tmp_path / "never").exists()


# -- ls, show, stats --------------------------------------------------------------------------

def test_ls_lists_tuned_options_and_artifacts_apart(tmp_path: Path,
                                                    capsys: pytest.CaptureFixture) -> None:
    db = tmp_path / "c.sqlite3"
    filled(db, artifacts=2, payload=3000)
    code, out, err = run(capsys, "ls", "--path", str(db))
    assert code == 0, err
    tuned, artifacts = out.split("Compiled artifacts")
    assert "Tuned options: 2 signature(s), 3 candidate(s)" in tuned
    assert re.search(r"KEY +ENTRY +ARCH +SIZES +BEST +CANDIDATES +TUNED", tuned)
    assert re.search(rf"[0-9a-f]{{12}} +mm +sm_90 +K=8,M=16,N=2 +1\.0000 ms +2 +{DATE}", tuned)
    assert ": 2, 5.9 KiB (cap" in artifacts
    assert re.search(r"KEY +ENTRY +KIND +ARCH +SIZE +CREATED +LAST USED", artifacts)
    rows = re.findall(rf"([0-9a-f]{{12}}) +mm +ptx +sm_90 +2\.9 KiB +{DATE} +{DATE}", artifacts)
    assert len(rows) == 2
    code, out, _ = run(capsys, "ls", "--arch", "sm_80", "--path", str(db))
    assert "Tuned options: 1 signature(s)" in out and "Compiled artifacts: 0" in out


def test_show_a_tuned_key_and_an_artifact(tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    db = tmp_path / "c.sqlite3"
    filled(db, artifacts=1)
    listing = run(capsys, "ls", "--path", str(db))[1]
    tuned_key = re.search(r"^([0-9a-f]{12}) +mm +sm_90 ", listing, re.M).group(1)
    artifact_key_ = re.search(r"^([0-9a-f]{12}) +mm +ptx ", listing, re.M).group(1)
    code, out, err = run(capsys, "show", tuned_key[:6], "--path", str(db))
    assert code == 0, err
    assert out.startswith(f"tuned options {tuned_key}")
    assert "candidates, fastest first" in out and '{"tile_sizes":[8]}' in out
    assert out.index("1.0000 ms") < out.index("2.0000 ms")  # fastest first
    code, out, _ = run(capsys, "show", artifact_key_, "--path", str(db))
    assert code == 0 and out.startswith(f"compiled artifact {artifact_key_}")
    assert "kind       ptx" in out and "1000 bytes" in out and "last used" in out
    code, out, _ = run(capsys, "show", tuned_key, "--json", "--path", str(db))
    assert [c["time_s"] for c in json.loads(out)["tuned"]["candidates"]] == [1e-3, 2e-3]


@pytest.mark.parametrize("argv, message", [
    (["show"], "tcmlir: error: tcmlir cache show: the following arguments are required: KEY"),
    (["show", "ab"], "at least 4 hex digits"),
    (["show", "ffffffffffff"], "no cache entry has a key starting with"),
    (["export"], "tcmlir cache export: the following arguments are required: FILE"),
    (["import"], "tcmlir cache import: the following arguments are required: FILE"),
    (["prune", "--max-size", "lots"], "--max-size='lots'"),
    (["prune", "--older-than", "-1"], "--older-than"),
])
def test_action_errors_exit_2(tmp_path: Path, capsys: pytest.CaptureFixture, argv: list[str],
                              message: str) -> None:
    db = tmp_path / "c.sqlite3"
    filled(db, artifacts=1)
    code, _, err = run(capsys, *argv, "--path", str(db))
    assert code == 2 and message in err and "Traceback" not in err


def test_show_and_export_of_a_missing_cache_exit_2(tmp_path: Path,
                                                   capsys: pytest.CaptureFixture) -> None:
    for argv in (["show", "abcd"], ["export", str(tmp_path / "x.json")]):
        code, _, err = run(capsys, *argv, "--path", str(tmp_path / "none"))
        assert code == 2 and "no tcmlir cache at" in err
    assert sorted(p.name for p in tmp_path.iterdir()) == []


def test_stats_counts_entries_sizes_and_this_process(tmp_path: Path,
                                                     capsys: pytest.CaptureFixture) -> None:
    db = tmp_path / "c.sqlite3"
    options, _ = filled(db, artifacts=2, payload=2048)
    before = stats(db)
    options.lookup_options(SRC, "mm", sig(16), "sm_90")   # a hit
    options.lookup_options(SRC, "mm", sig(99), "sm_90")   # a miss
    after = stats(db)
    assert (after.tuned_keys, after.tuned_rows, after.artifacts, after.artifact_bytes) == (
        2, 3, 2, 4096)
    assert after.by_kind == {"ptx": (2, 4096)} and after.file_bytes > 4096
    assert (after.options_hits - before.options_hits,
            after.options_misses - before.options_misses) == (1, 1)
    code, out, _ = run(capsys, "stats", "--path", str(db))
    assert code == 0
    assert "2 signature(s), 3 candidate(s)" in out and "2 (4.0 KiB): ptx 2 (4.0 KiB)" in out
    assert "hit(s)" in out and "miss(es)" in out and "size cap        1.0 GiB" in out
    data = json.loads(run(capsys, "stats", "--json", "--path", str(db))[1])
    assert data["artifacts"] == 2 and data["max_size"] == DEFAULT_CACHE_MAX_SIZE


def test_export_writes_json_of_tuned_options(tmp_path: Path,
                                             capsys: pytest.CaptureFixture) -> None:
    db, out_file, other = tmp_path / "c.sqlite3", tmp_path / "tuned.json", tmp_path / "o"
    filled(db, artifacts=2)
    code, out, _ = run(capsys, "export", str(out_file), "--arch", "sm_90", "--path", str(db))
    assert code == 0 and "exported 2 tuned option row(s)" in out and "never exported" in out
    document = json.loads(out_file.read_text())
    assert document["format"] == "tcmlir-tuned-options" and document["arch"] == "sm_90"
    assert sorted(e["time_s"] for e in document["tuned"]) == [1e-3, 2e-3]
    code, out, _ = run(capsys, "import", str(out_file), "--path", str(other))
    assert code == 0 and "2 tuned option row(s) merged, 0 skipped" in out
    assert stats(other).tuned_rows == 2 and stats(other).artifacts == 0
    code, out, _ = run(capsys, "import", str(out_file), "--path", str(other))
    assert "0 tuned option row(s) merged" in out  # the same times again change nothing


# -- prune and the cap ------------------------------------------------------------------------

def test_prune_keeps_options_and_evicts_least_recently_used(tmp_path: Path,
                                                           capsys: pytest.CaptureFixture
                                                           ) -> None:
    db = tmp_path / "c.sqlite3"
    _, kernels = filled(db, artifacts=4, payload=1000)
    assert kernels.get(akey(0)) is not None  # the oldest is now the most recently used
    code, out, err = run(capsys, "prune", "--max-size", "2.5K", "--path", str(db))
    assert code == 0, err
    assert "pruned 2 compiled artifact(s) (2.0 KiB); kept 2 (2.0 KiB) and all 3 tuned" in out
    assert [KernelCache(db, max_size=0).get(akey(i)) is not None for i in range(4)] == [
        True, False, False, True]
    assert OptionsCache(db).stats()["tuned_rows"] == 3
    code, out, _ = run(capsys, "prune", "--max-size", "0", "--path", str(db))
    assert "pruned 2" in out and "kept 0 (0 B) and all 3 tuned option row(s)" in out


def test_prune_older_than(tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    db = tmp_path / "c.sqlite3"
    filled(db, artifacts=3)
    digest = KernelCache(db).entries()[0].digest
    with contextlib.closing(sqlite3.connect(db, isolation_level=None)) as conn:
        conn.execute("UPDATE artifact_use SET last_used = ? WHERE digest = ?",
                     (time.time() - 10 * 86400, digest))
    code, out, _ = run(capsys, "prune", "--older-than", "7", "--path", str(db))
    assert code == 0 and "pruned 1 compiled artifact(s)" in out and "kept 2" in out
    assert digest not in {a.digest for a in KernelCache(db).entries()}


def test_prune_without_limits_applies_the_configured_cap(tmp_path: Path,
                                                         capsys: pytest.CaptureFixture,
                                                         monkeypatch: pytest.MonkeyPatch
                                                         ) -> None:
    db = tmp_path / "c.sqlite3"
    filled(db, artifacts=5, payload=1000)
    monkeypatch.setenv("TCMLIR_CACHE_MAX_SIZE", "3000")
    assert "pruned 2 compiled artifact(s)" in run(capsys, "prune", "--path", str(db))[1]
    result = prune(KernelCache(db).db, max_size=None, older_than_days=None)
    assert result.removed == 0 and result.kept == 3


def test_cap_holds_under_200_distinct_puts(tmp_path: Path,
                                           monkeypatch: pytest.MonkeyPatch) -> None:
    """The compile path's cache object (`artifact_cache`, which reads TCMLIR_CACHE_MAX_SIZE)
    stays under the cap; the newest artifacts and every tuned option stay."""
    monkeypatch.setenv("TCMLIR_CACHE_DIR", str(tmp_path / "capped"))
    monkeypatch.setenv("TCMLIR_CACHE_MAX_SIZE", "20KiB")
    cache = artifact_cache()
    OptionsCache(store=cache.db).store(SRC, "mm", sig(1), "sm_90", "{}", 1e-3, 1)
    for i in range(200):
        cache.put(akey(i), bytes(1024 + i % 7), {})
        assert cache.total_size() <= 20 * 1024, i
        if i % 10 == 0:
            assert cache.get(akey(0)) is not None  # kept alive by use
    kept = {i for i in range(200) if cache.get(akey(i)) is not None}
    assert 0 in kept and {195, 196, 197, 198, 199} <= kept and len(kept) <= 20
    assert cache.evictions >= 180
    assert OptionsCache(store=cache.db).stats()["tuned_rows"] == 1


def test_cap_holds_under_a_loop_of_distinct_compiles(tmp_path: Path,
                                                    monkeypatch: pytest.MonkeyPatch) -> None:
    """Real cpu compiles (tiny kernels, a cap of a few host objects): after each one the
    artifacts fit the cap, and a recent kernel comes back from the cache, an evicted one
    is compiled again."""
    monkeypatch.setenv("TCMLIR_CACHE_DIR", str(tmp_path / "compiles"))
    monkeypatch.setenv("TCMLIR_CACHE_MAX_SIZE", "4000")
    source = "def f(float(N) A) -> (O) { O(i) = A(i) * 2.0 }"
    fn = tc.define(source, target="cpu")
    for n in range(1, 31):
        x = np.arange(n, dtype=np.float32)
        np.testing.assert_array_equal(fn(x), x * 2)
        assert artifact_cache().total_size() <= 4000, n
    assert 1 <= len(artifact_cache().entries()) <= 4
    again = tc.define(source, target="cpu")  # a new function: no kernels in memory
    hits, misses = COUNTERS.hits, COUNTERS.misses
    again(np.arange(30, dtype=np.float32))
    assert (COUNTERS.hits - hits, COUNTERS.misses - misses) == (1, 0)
    again(np.arange(1, dtype=np.float32))
    assert (COUNTERS.hits - hits, COUNTERS.misses - misses) == (1, 1)


def test_size_parsing_and_the_knob(monkeypatch: pytest.MonkeyPatch) -> None:
    assert [parse_size(s) for s in ("0", "4096", "500M", "1.5GiB", "2 KiB", "1g")] == [
        0, 4096, 500 * 10**6, 3 * 2**29, 2048, 10**9]
    for bad in ("", "-1", "1X", "nan", "lots"):
        with pytest.raises(tc.TCError, match=r"e\.g\. 500M"):
            parse_size(bad)
    monkeypatch.setenv("TCMLIR_CACHE_MAX_SIZE", "2G")
    assert get_config().cache_max_size == 2 * 10**9
    monkeypatch.setenv("TCMLIR_CACHE_MAX_SIZE", "big")
    with pytest.raises(tc.TCError, match="TCMLIR_CACHE_MAX_SIZE='big'"):
        get_config()
    monkeypatch.delenv("TCMLIR_CACHE_MAX_SIZE")
    assert get_config().cache_max_size == DEFAULT_CACHE_MAX_SIZE == 2**30


def test_human_sizes_and_dates() -> None:
    assert [human_size(n) for n in (0, 532, 1024, 12_595, 2**30)] == [
        "0 B", "532 B", "1.0 KiB", "12.3 KiB", "1.0 GiB"]
    assert re.fullmatch(DATE, human_date(time.time())) and human_date(0) == "-"


@pytest.mark.gpu
def test_gpu_ptx_and_cubins_obey_the_cap(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """On a GPU a call stores PTX and the driver's cubin; with a cap of about three of them,
    a loop of distinct sizes stays under it and the newest kernel is served from the cache."""
    monkeypatch.setenv("TCMLIR_CACHE_DIR", str(tmp_path / "gpu"))
    monkeypatch.delenv("TCMLIR_ALWAYS_COMPILE", raising=False)
    monkeypatch.setenv("TCMLIR_CACHE_MAX_SIZE", "0")
    source = "def f(float(N) A) -> (O) { O(i) = A(i) * 2.0 }"
    x = np.arange(64, dtype=np.float32)
    np.testing.assert_array_equal(np.asarray(tc.define(source, target="cuda")(x)), x * 2)
    entries = artifact_cache().entries()
    assert {"ptx", "cubin"} <= {a.kind for a in entries}
    cap = 3 * max(a.size for a in entries)
    monkeypatch.setenv("TCMLIR_CACHE_MAX_SIZE", str(cap))
    fn = tc.define(source, target="cuda")
    for n in range(65, 77):
        y = np.arange(n, dtype=np.float32)
        np.testing.assert_array_equal(np.asarray(fn(y)), y * 2)
        assert artifact_cache().total_size() <= cap, n
    hits = COUNTERS.hits
    np.testing.assert_array_equal(np.asarray(tc.define(source, target="cuda")(y)), y * 2)
    assert COUNTERS.hits > hits
