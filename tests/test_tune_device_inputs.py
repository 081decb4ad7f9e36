"""Tuning and caching entries take what a call takes: device arrays, read in place.

Without a GPU the device arrays are the fake driver's (`fake_cuda`): objects with
``__cuda_array_interface__``, fake torch CUDA tensors and DLPack producers on a CUDA device,
whose memory is host memory. Each entry — ``fn.signature``, ``fn.size_values``, the options
cache, the three options factories, ``fn.autotune`` (cache hit and a tuning), ``fn.profile``,
``fn.plan`` — must bind them without a `CallError` and without copying device data to read a
shape; where the reference check needs host data it copies once and the log says so.
"""

from __future__ import annotations

import logging
from typing import ClassVar

import numpy as np
import pytest
from fake_cuda import (
    FakeDLPackCuda,
    FakeTensor,
    device_array,
    install_fake,
    install_fake_torch,
    simulate_with_host,
)

import tcmlir as tc
from tcmlir.options import MappingOptions
from tcmlir.runtime.cuda_launch import CudaRunner

MATMUL = "def mm(float(M,K) A, float(K,N) B) -> (C) { C(m,n) +=! A(m,k) * B(k,n) }"
KINDS = ("cuda-array-interface", "torch-cuda", "dlpack-cuda")


def _device(kind: str, host: np.ndarray):
    if kind == "cuda-array-interface":
        return device_array(host)
    if kind == "torch-cuda":
        return FakeTensor(host)
    return FakeDLPackCuda(host)


@pytest.fixture
def faked(monkeypatch):
    """The fake driver behind every launch, and a fake torch (for FakeTensor outputs)."""
    driver, runtime = install_fake(monkeypatch)
    install_fake_torch(monkeypatch)
    import tcmlir.cache.artifacts as artifacts

    monkeypatch.setattr(artifacts, "make_cuda_runner",
                        lambda image, key, device=0: CudaRunner(image, device, runtime=runtime))
    import tcmlir.tune.verify as verify

    monkeypatch.setattr(verify, "_VERIFIED", set())  # each test re-verifies what it serves
    return driver


@pytest.fixture
def inputs(rng):
    a = rng.standard_normal((24, 16)).astype(np.float32)
    b = rng.standard_normal((16, 40)).astype(np.float32)
    return a, b


def _simulate(driver, fn, device_inputs, host_inputs, options):
    """Make the fake's launches of ``fn``'s kernel for ``options`` compute the real result."""
    kernel = fn.compile(*device_inputs, options=options)
    simulate_with_host(driver, kernel.runner.image,
                       tc.define(MATMUL, target="cpu").compile(*host_inputs))
    return kernel


def _no_device_reads(driver) -> bool:
    return not any(c[0].startswith("cuMemcpyDtoH") for c in driver.calls)


@pytest.mark.parametrize("kind", KINDS)
def test_signature_and_sizes_of_device_arrays_read_without_copying(faked, inputs, kind):
    a, b = inputs
    fn = tc.define(MATMUL, target="cuda")
    da, db = _device(kind, a), _device(kind, b)
    assert fn.signature(da, db) == fn.signature(a, b)
    assert fn.size_values(da, db) == {"M": 24, "K": 16, "N": 40}
    spec = fn.input_spec((da, db))
    assert spec.on_device == ("A", "B") and fn.input_spec((a, b)).on_device == ()
    assert _no_device_reads(faked) and not faked.calls


def test_host_target_still_refuses_device_arrays_as_its_call_does(faked, inputs):
    a, b = inputs
    fn = tc.define(MATMUL, target="cpu")
    with pytest.raises(tc.CallError, match="lives on a GPU"):
        fn.signature(device_array(a), device_array(b))
    # the cuda binding of the same function, as the tuner's target= asks for it
    assert fn.input_spec((device_array(a), device_array(b)), "cuda").sizes["N"] == 40


@pytest.mark.parametrize("kind", KINDS)
def test_options_cache_entries_take_device_arrays(faked, inputs, kind, tmp_path):
    a, b = inputs
    fn = tc.define(MATMUL, target="cuda")
    da, db = _device(kind, a), _device(kind, b)
    opts = MappingOptions.naive().tile(8, 8)
    with tc.OptionsCache(tmp_path / "c.db") as cache:
        assert cache.lookup(fn, da, db) is None
        assert cache.record(fn, da, db, options=opts, time_s=2e-3, runs=5, spread_s=1e-4)
        assert cache.lookup(fn, a, b) == opts  # numpy and device arrays: one signature
        rec = cache.lookup_record(fn, da, db)
        assert rec is not None and rec.spread_s == 1e-4
        assert cache.save_tuned(fn, [da, db], [(opts.unroll(2), 1e-3, 3, 5e-5)]) == 1
        assert cache.lookup(fn, da, db) == opts.unroll(2)
        bigger = (_device(kind, np.ones((48, 16), np.float32)), db)
        assert cache.lookup(fn, *bigger) is None
        assert cache.lookup(fn, *bigger, exact=False) == opts.unroll(2)
    assert _no_device_reads(faked)


@pytest.mark.parametrize("kind", KINDS)
def test_load_from_cache_factory_without_a_row_gives_the_calls_default(faked, inputs, kind,
                                                                      tmp_path):
    """No tuned row: the options a call without a factory gets (at the call's sizes), not
    naive ones; device arrays bound in place."""
    a, b = inputs
    fn = tc.define(MATMUL, target="cuda")
    factory = tc.make_load_from_cache_options_factory(tmp_path / "empty.db")
    got = factory(fn, (_device(kind, a), _device(kind, b)))
    assert got == MappingOptions.default_for(fn.ir, "cuda", {"M": 24, "K": 16, "N": 40})
    assert got != MappingOptions.naive()
    assert _no_device_reads(faked)


@pytest.mark.parametrize("kind", KINDS)
def test_load_from_cache_factory_serves_a_call_on_device_arrays(faked, inputs, kind, tmp_path,
                                                                 caplog):
    a, b = inputs
    opts = MappingOptions.naive().tile(8, 8)
    db_path = tmp_path / "c.db"
    fn = tc.define(MATMUL, target="cuda",
                   options_factory=tc.make_load_from_cache_options_factory(db_path))
    da, db = _device(kind, a), _device(kind, b)
    with tc.OptionsCache(db_path) as cache:
        cache.record(fn, da, db, options=opts, time_s=1e-3, runs=3)
    kernel = _simulate(faked, fn, (da, db), (a, b), opts)
    faked.calls.clear()
    with caplog.at_level(logging.INFO, logger="tcmlir.tune"):
        out = fn(da, db)
    got = out.array if kind == "torch-cuda" else np.asarray(out.get()
                                                            if hasattr(out, "get") else out)
    np.testing.assert_allclose(got, a @ b, rtol=1e-4, atol=1e-4)
    assert any(k[2] == opts.to_json() for k in fn._kernels), "the cached options served the call"
    assert any(k is kernel for k in fn._kernels.values())
    # the re-verification read each input back once, for the reference, and said so (the
    # other reads are of the checked run's output)
    reads = [c[1] for c in faked.calls if c[0].startswith("cuMemcpyDtoH")]
    assert reads.count(a.nbytes) == 1 and reads.count(b.nbytes) == 1, reads
    assert "copied 2 device input(s) to the host once" in caplog.text


@pytest.mark.parametrize("kind", KINDS)
def test_naive_and_autotuned_factories_take_device_arrays(faked, inputs, kind, tmp_path):
    a, b = inputs
    da, db = _device(kind, a), _device(kind, b)
    naive = tc.define(MATMUL, target="cuda", options_factory=tc.make_naive_options_factory())
    _simulate(faked, naive, (da, db), (a, b), MappingOptions.naive())
    out = naive(da, db)
    got = out.array if kind == "torch-cuda" else out.get()
    np.testing.assert_allclose(got, a @ b, rtol=1e-4, atol=1e-4)
    # the autotuned factory on a cache that has the signature: served without tuning
    opts = MappingOptions.naive().tile(4, 8)
    tuned = tc.define(MATMUL, target="cuda", options_factory=tc.make_autotuned_options_factory(
        cache=tmp_path / "t.db", progress=False))
    with tc.OptionsCache(tmp_path / "t.db") as cache:
        cache.record(tuned, da, db, options=opts, time_s=1e-3, runs=3)
    _simulate(faked, tuned, (da, db), (a, b), opts)
    out = tuned(da, db)
    got = out.array if kind == "torch-cuda" else out.get()
    np.testing.assert_allclose(got, a @ b, rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("kind", KINDS)
def test_autotune_cache_hit_on_device_arrays(faked, inputs, kind, tmp_path):
    a, b = inputs
    fn = tc.define(MATMUL, target="cuda")
    da, db = _device(kind, a), _device(kind, b)
    opts = MappingOptions.naive().tile(8, 4)
    with tc.OptionsCache(tmp_path / "c.db") as cache:
        cache.record(fn, a, b, options=opts, time_s=1e-3, runs=3)
    _simulate(faked, fn, (da, db), (a, b), opts)
    assert fn.autotune(da, db, cache=tmp_path / "c.db", progress=False) == opts


class _RecordingEvaluator:
    """Stands in for the GPU worker pool: records what it was given, times by a formula."""

    seen: ClassVar[list] = []

    def __init__(self, fn, inputs, config, target="cuda", reference=None, input_kind=None):
        _RecordingEvaluator.seen.append((list(inputs), reference, input_kind))
        self.compiles = self.restarts = 0
        self.remeasured = []

    def evaluate(self, candidates, best):
        from tcmlir.tune.evaluate import Evaluation

        return [Evaluation(c, 1e-3 / (1 + c.unroll_factor), 3) for c in candidates]

    def remeasure(self, candidates):
        _RecordingEvaluator.seen.append(("remeasure", list(candidates)))
        from tcmlir.tune.evaluate import Evaluation

        return [Evaluation(c, 1e-3 / (1 + c.unroll_factor), 15, spread_s=1e-6)
                for c in candidates]

    def close(self):
        pass


def test_tuning_on_device_arrays_copies_once_and_caches_by_their_signature(
        faked, inputs, monkeypatch, tmp_path, caplog):
    import importlib

    autotune_mod = importlib.import_module("tcmlir.tune.autotune")

    a, b = inputs
    fn = tc.define(MATMUL, target="cuda")
    da, db = device_array(a), FakeDLPackCuda(b)
    monkeypatch.setattr(autotune_mod, "check_cuda_usable", lambda devices: None)
    monkeypatch.setattr(autotune_mod, "WorkerPoolEvaluator", _RecordingEvaluator)
    _RecordingEvaluator.seen.clear()
    with caplog.at_level(logging.INFO, logger="tcmlir.tune"):
        best = fn.autotune(da, db, generations=1, population=4, cache=tmp_path / "c.db",
                           progress=False)
    (given, reference, kind), (_, finalists) = _RecordingEvaluator.seen
    assert kind is None  # not torch or CuPy: the workers time on their own device arrays
    default = MappingOptions.default_for(fn.ir, "cuda", {"M": 24, "K": 16, "N": 40})
    assert default in finalists and best in finalists
    assert all(isinstance(x, np.ndarray) for x in given)  # host copies for the workers
    np.testing.assert_array_equal(given[0], a)
    np.testing.assert_allclose(reference.expected[0], a @ b, rtol=1e-4, atol=1e-5)
    reads = [c[1] for c in faked.calls if c[0].startswith("cuMemcpyDtoH")]
    assert sorted(reads) == sorted([a.nbytes, b.nbytes])  # once per input, nothing else
    assert "copied 2 device input(s) to the host once" in caplog.text
    with tc.OptionsCache(tmp_path / "c.db") as cache:
        assert cache.lookup(fn, a, b) == best == cache.lookup(fn, da, db)
        assert cache.lookup_record(fn, da, db).spread_s == 1e-6  # the side-by-side figures


def test_profile_and_plan_take_device_arrays(faked, inputs, tmp_path, monkeypatch):
    import tcmlir.profile.profiler as profiler

    monkeypatch.setattr(profiler, "kernel_resources", lambda kernel: {})  # no cuFuncGetAttribute
    a, b = inputs
    da, db = device_array(a), FakeDLPackCuda(b)
    opts = MappingOptions.naive().tile(8, 8)
    fn = tc.define(MATMUL, target="cuda",
                   options_factory=tc.make_load_from_cache_options_factory(tmp_path / "c.db"))
    with tc.OptionsCache(tmp_path / "c.db") as cache:
        cache.record(fn, da, db, options=opts, time_s=1e-3, runs=3)
    _simulate(faked, fn, (da, db), (a, b), opts)
    prof = fn.profile(da, db, runs=2, ceilings={"flops": 1e12, "bandwidth": 1e11})
    assert prof.time_s >= 0
    plan = fn.plan(da, db, devices=[0])
    assert plan.parts and plan.sizes["M"] == 24


def test_spread_column_is_added_to_an_old_database_which_stays_readable(tmp_path):
    import sqlite3

    from tcmlir.cache.store import CacheStore

    path = tmp_path / "old.db"
    fn = tc.define(MATMUL, target="cpu")
    a, b = np.ones((4, 3), np.float32), np.ones((3, 5), np.float32)
    with tc.OptionsCache(path) as cache:  # a row written as before the column (no spread)
        cache.record(fn, a, b, options=MappingOptions.naive(), time_s=1e-3, runs=3)
    conn = sqlite3.connect(path)
    conn.execute("ALTER TABLE tuned_options DROP COLUMN spread_s")  # the old schema
    conn.commit()
    conn.close()
    with tc.OptionsCache(path) as cache:
        rec = cache.lookup_record(fn, a, b)
        assert rec is not None and rec.spread_s is None and rec.time_s == 1e-3
        cache.record(fn, a, b, options=MappingOptions.naive().tile(2), time_s=5e-4, runs=7,
                     spread_s=2e-5)
        assert cache.lookup_record(fn, a, b).spread_s == 2e-5
        assert cache.counters.corrupt_dropped == 0
    store = CacheStore(path)
    try:
        assert store.read(lambda conn: [r[1] for r in conn.execute(
            "PRAGMA table_info(tuned_options)")], []).count("spread_s") == 1
    finally:
        store.close()


@pytest.mark.parametrize("borrowed_faster", [False, True])
@pytest.mark.parametrize("kind", KINDS)
def test_options_of_another_size_serve_only_where_faster_than_the_default(
        faked, inputs, kind, tmp_path, monkeypatch, borrowed_faster):
    """At a size with no row of its own, the options tuned at the nearest size are timed
    beside the default on the call's device arrays, and the faster serves (issue 28)."""
    from tcmlir.benchmark import BenchmarkResult
    from tcmlir.kernel import Kernel

    a, b = inputs
    fn = tc.define(MATMUL, target="cuda")
    tuned = MappingOptions.naive().tile(8, 8)
    with tc.OptionsCache(tmp_path / "c.db") as cache:
        cache.record(fn, _device(kind, a), _device(kind, b), options=tuned, time_s=1e-3, runs=3)
    near = (_device(kind, np.ones((20, 16), np.float32)), _device(kind, b))
    default = MappingOptions.default_for(fn.ir, "cuda", fn.size_values(*near))
    timed = []

    def benchmark(self, *args, runs=5):
        timed.append(self.options)
        assert all(x is y for x, y in zip(args, near, strict=True))  # the call's own arrays
        fast = (self.options == tuned) == borrowed_faster
        return BenchmarkResult.of([1e-3 if fast else 2e-3] * runs)

    monkeypatch.setattr(Kernel, "benchmark", benchmark)
    monkeypatch.setattr("tcmlir.tune.verify.verify_for_call", lambda *a_, **k: None)
    factory = tc.make_load_from_cache_options_factory(tmp_path / "c.db")
    assert factory(fn, near) == (tuned if borrowed_faster else default)
    assert set(timed) == {tuned, default} and len(timed) == 6  # 3 interleaved rounds each
    assert factory(fn, near) == (tuned if borrowed_faster else default)  # once per signature
    assert len(timed) == 6
    assert _no_device_reads(faked)
