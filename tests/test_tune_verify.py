"""Verified tuning (`tcmlir.tune.verify`): wrong candidates are rejected, never stored or
returned; cached rows are re-verified on first use. Miscompiles are planted through the
``TCMLIR_TUNE_MISCOMPILE`` hook, so they go through the real checking path.

Small matmuls, tiny populations: the module runs in a few seconds (plus two worker starts).
"""

from __future__ import annotations

import logging
import math
import warnings

import numpy as np
import pytest

import tcmlir as tc
from tcmlir.errors import TCError
from tcmlir.options import MappingOptions
from tcmlir.tune import TunerConfig, tune, verify
from tcmlir.tune import evaluate as evaluate_mod
from tcmlir.tune.evaluate import WorkerPoolEvaluator
from tcmlir.tune.verify import (
    TuneError,
    WrongResultWarning,
    check_outputs,
    compute_reference,
    reads_outputs,
    run_checked,
    tolerance,
)

MATMUL = "def mm(float(M,K) A, float(K,N) B) -> (C) { C(m,n) +=! A(m,k) * B(k,n) }"
HOOK = "TCMLIR_TUNE_MISCOMPILE"
FAST = TunerConfig(generations=2, population=4, runs=1, seed=7)


@pytest.fixture(autouse=True)
def _private_cache_dir(tmp_path, monkeypatch):
    monkeypatch.setenv("TCMLIR_CACHE_DIR", str(tmp_path / "default-cache"))
    monkeypatch.delenv(HOOK, raising=False)


def _inputs(m: int, k: int, n: int, seed: int = 0) -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(seed)
    return (rng.standard_normal((m, k)).astype(np.float32),
            rng.standard_normal((k, n)).astype(np.float32))


def _unroll4_is_fastest(monkeypatch) -> None:
    """Fake timings (the real ones are noise at these sizes): unroll_factor=4 wins."""
    def fake_time(kernel, inputs, runs, best, prune_factor, timeout_s):
        return (1e-5 if kernel.options.unroll_factor == 4 else 1e-3), 1, False

    monkeypatch.setattr(evaluate_mod, "time_kernel", fake_time)


# ---------------------------------------------------------------- the tuner rejects


def test_control_without_the_hook_the_planted_candidate_wins(monkeypatch):
    _unroll4_is_fastest(monkeypatch)
    fn = tc.define(MATMUL, target="cpu")
    result = tune(fn, _inputs(12, 8, 10), config=FAST, options=MappingOptions.naive().unroll(4),
                  progress=False)
    assert result.best.options.unroll_factor == 4
    assert result.stats["wrong"] == 0 and result.reference == "interpreter"


def test_fastest_candidate_planted_wrong_is_rejected(monkeypatch, tmp_path, caplog):
    _unroll4_is_fastest(monkeypatch)
    monkeypatch.setenv(HOOK, "unroll_factor=4")
    fn = tc.define(MATMUL, target="cpu")
    a, b = _inputs(12, 8, 10)
    db = tmp_path / "tune.sqlite3"
    with caplog.at_level(logging.WARNING, logger="tcmlir.tune"):
        result = tune(fn, (a, b), config=FAST, options=MappingOptions.naive().unroll(4),
                      cache=db, progress=False)
    planted = [e for e in result.evaluated.values() if e.options.unroll_factor == 4]
    assert planted and all(e.wrong and not e.ok and math.isinf(e.time_s) for e in planted)
    assert all(e.error.startswith("wrong result: max rel error") and " at C[" in e.error
               for e in planted), [e.error for e in planted]
    assert result.stats["wrong"] == len(planted)
    assert "rejected" in caplog.text and "wrong result" in caplog.text
    assert result.best is not None and result.best.options.unroll_factor != 4
    stored = tc.OptionsCache(db).entries()
    assert stored and all(MappingOptions.from_json(r.options_json).unroll_factor != 4
                          for r in stored)
    monkeypatch.delenv(HOOK)
    np.testing.assert_allclose(fn(a, b, options=result.best.options), a @ b, rtol=1e-4,
                               atol=1e-4)


def test_every_candidate_wrong_is_a_tune_error_and_nothing_is_stored(monkeypatch, tmp_path):
    monkeypatch.setenv(HOOK, "use_shared_memory=false")  # no CPU candidate varies it
    fn = tc.define(MATMUL, target="cpu")
    db = tmp_path / "none.sqlite3"
    with pytest.raises(TuneError, match=r"no candidate .* computed the right result") as info:
        fn.autotune(*_inputs(8, 8, 8), config=FAST, cache=db, progress=False)
    assert isinstance(info.value, TCError) and "wrong result" in str(info.value)
    assert tc.OptionsCache(db).entries() == []


def test_worker_pool_rejects_wrong_candidates_in_the_worker(monkeypatch):
    """The GPU evaluator's protocol on target="cpu" workers: the worker compares, the parent
    records "wrong"; with no reference file each worker uses the default kernel's result."""
    monkeypatch.setenv(HOOK, "tile_sizes=[4,4,4]")
    fn = tc.define(MATMUL, target="cpu")
    a, b = _inputs(8, 8, 8)
    cfg = TunerConfig(runs=1, devices=(0,), timeout_s=30.0)
    naive = MappingOptions.naive()
    for reference in (compute_reference(fn, (a, b), "cpu"), None):
        pool = WorkerPoolEvaluator(fn, (a, b), cfg, target="cpu", reference=reference)
        try:
            evs = pool.evaluate([naive.tile(4, 4, 4), naive, naive.tile(2, 2, 2)], math.inf)
        finally:
            pool.close()
        assert evs[0].wrong and "wrong result" in evs[0].error, evs[0]
        assert evs[1].ok and evs[2].ok
        assert pool.restarts == 0  # a wrong result is not a crash: the worker goes on


# ---------------------------------------------------------------- the check itself


class _FakeKernel:
    """Writes ``values`` into the outputs it is given, except the elements ``skip`` masks."""

    def __init__(self, values: np.ndarray, skip: np.ndarray | None = None):
        self.values, self.skip = values, skip
        self.options = MappingOptions.naive()

    def launch(self, *inputs, outputs):
        (out,) = outputs
        mask = np.ones(out.shape, bool) if self.skip is None else ~self.skip
        out[mask] = self.values[mask]
        return out


def test_unwritten_element_is_caught_by_the_poison():
    fn = tc.define(MATMUL, target="cpu")
    a, b = _inputs(5, 3, 7)
    ref = compute_reference(fn, (a, b), "cpu")
    assert ref.poison and ref.source == "interpreter"
    want = (a.astype(np.float64) @ b).astype(np.float32)
    assert run_checked(_FakeKernel(want), (a, b), ref) is None
    skip = np.zeros(want.shape, bool)
    skip[3, 6] = True
    reason = run_checked(_FakeKernel(want, skip), (a, b), ref)
    assert reason is not None and "at C[3, 6]" in reason and "got nan" in reason
    near = want.copy()
    near[1, 1] *= 1 + 1e-6  # rounding noise: within the tolerance
    assert run_checked(_FakeKernel(near), (a, b), ref) is None
    far = want.copy()
    far[2, 4] += 0.5
    assert "max rel error" in run_checked(_FakeKernel(far), (a, b), ref)


def test_integer_outputs_must_match_exactly():
    src = "def add1(int32(N) A) -> (B) { B(i) = A(i) + 1 }"
    fn = tc.define(src, target="cpu")
    x = np.arange(10, dtype=np.int32)
    ref = compute_reference(fn, (x,), "cpu")
    got = x + 1
    assert check_outputs([got], ref) is None
    got[7] += 1
    assert check_outputs([got], ref).startswith("wrong result: max abs error 1 at B[7]")


def test_programs_reading_their_outputs_start_from_zeros():
    acc = "def acc(float(N,K) A) -> (S) { S(i) += A(i,k) }"  # += without !: reads S
    assert reads_outputs(tc.define(acc, target="cpu").ir)
    assert not reads_outputs(tc.define(MATMUL, target="cpu").ir)
    fn = tc.define(acc, target="cpu")
    a = np.random.default_rng(1).standard_normal((6, 5)).astype(np.float32)
    ref = compute_reference(fn, (a,), "cpu")
    assert not ref.poison and not np.isnan(ref.fresh_outputs()[0]).any()
    kernel = fn.compile(a)
    assert run_checked(kernel, (a,), ref) is None


def test_large_domains_use_the_default_kernel_as_reference():
    fn = tc.define(MATMUL, target="cpu")
    a, b = _inputs(9, 7, 5)
    by_kernel = compute_reference(fn, (a, b), "cpu", max_ops=0)
    by_interpreter = compute_reference(fn, (a, b), "cpu")
    assert by_kernel.source == "default kernel"
    assert check_outputs(by_kernel.expected, by_interpreter) is None


def test_tolerance_grows_with_the_reduction_and_the_dtype():
    assert tolerance("float32", 1) == tolerance("float32", 64) == 1e-4
    assert tolerance("float32", 4096) == pytest.approx(8e-4)
    assert tolerance("float64", 10) < tolerance("float32", 10) < tolerance("float16", 10)
    assert tolerance("float32", 10**12) <= 1e-4 + 5e-2


def test_malformed_hook_is_a_tcerror(monkeypatch):
    from tcmlir.config import get_config

    monkeypatch.setenv(HOOK, "no equals sign")
    with pytest.raises(TCError, match="TCMLIR_TUNE_MISCOMPILE"):
        get_config()
    monkeypatch.setenv(HOOK, "tile_sizes=[4,4]")
    assert get_config().tune_miscompile == ("tile_sizes", [4, 4])


# ---------------------------------------------------------------- cached rows, re-verified


def _store_row(db, fn, inputs, options: MappingOptions) -> tc.OptionsCache:
    cache = tc.OptionsCache(db)
    cache.record(fn, *inputs, options=options, time_s=1e-6, runs=3)
    return cache


def test_cached_wrong_row_is_dropped_and_default_options_used(monkeypatch, tmp_path):
    fn = tc.define(MATMUL, target="cpu")
    a, b = _inputs(10, 6, 9)
    db = tmp_path / "rows.sqlite3"
    bad = MappingOptions.naive().unroll(8)
    cache = _store_row(db, fn, (a, b), bad)
    monkeypatch.setenv(HOOK, "unroll_factor=8")
    factory = tc.make_load_from_cache_options_factory(db)
    near = _inputs(11, 6, 9)  # served the row of the nearest size: skipped, not dropped
    with pytest.warns(WrongResultWarning, match="not using those of the nearest size"):
        # the default a call at these sizes gets
        assert factory(fn, near) == MappingOptions.default_for(fn.ir, "cpu", fn.size_values(*near))
    assert cache.lookup(fn, a, b) == bad
    with pytest.warns(WrongResultWarning, match="wrong result.*dropped them from the cache"
                                                ".*using the default options"):
        got = factory(fn, (a, b))
    assert got == MappingOptions.default_for(fn.ir, "cpu", fn.size_values(a, b))
    assert cache.lookup(fn, a, b) is None  # the row is gone, for every process


def test_cached_right_row_is_verified_once_per_process(monkeypatch, tmp_path):
    fn = tc.define(MATMUL, target="cpu")
    a, b = _inputs(10, 6, 11)
    db = tmp_path / "rows.sqlite3"
    good = MappingOptions.naive().unroll(2).tile(4, 4, 4)
    _store_row(db, fn, (a, b), good)
    checks = []
    real = verify.run_checked
    monkeypatch.setattr(verify, "run_checked", lambda *a_: checks.append(1) or real(*a_))
    with warnings.catch_warnings():
        warnings.simplefilter("error", WrongResultWarning)
        assert tc.make_load_from_cache_options_factory(db)(fn, (a, b)) == good
        assert tc.make_load_from_cache_options_factory(db)(fn, (a, b)) == good
    assert len(checks) == 1  # the second factory found it verified in this process
    assert fn.autotune(a, b, cache=db, progress=False) == good  # a hit, not re-checked
    assert len(checks) == 1


def test_autotune_drops_a_wrong_cached_row_and_tunes(monkeypatch, tmp_path):
    fn = tc.define(MATMUL, target="cpu")
    a, b = _inputs(7, 5, 6)
    db = tmp_path / "rows.sqlite3"
    _store_row(db, fn, (a, b), MappingOptions.naive().unroll(16))
    monkeypatch.setenv(HOOK, "unroll_factor=16")
    best = fn.autotune(a, b, config=FAST, cache=db, progress=False)
    assert best.unroll_factor != 16
    rows = tc.OptionsCache(db).entries()
    assert rows and all(MappingOptions.from_json(r.options_json).unroll_factor != 16
                        for r in rows)


# ---------------------------------------------------------------- on the GPU


@pytest.mark.gpu
def test_gpu_tuning_rejects_a_planted_miscompile(monkeypatch, tmp_path):
    monkeypatch.setenv(HOOK, "unroll_factor=4")
    fn = tc.define(MATMUL, target="cuda")
    a, b = _inputs(96, 64, 80)
    db = tmp_path / "gpu.sqlite3"
    cfg = TunerConfig(generations=2, population=6, runs=2, seed=5, devices=(0,))
    result = tune(fn, (a, b), config=cfg, options=MappingOptions.naive().unroll(4), cache=db,
                  progress=False)
    planted = [e for e in result.evaluated.values() if e.options.unroll_factor == 4]
    assert planted and all(e.wrong for e in planted), [e.error for e in planted]
    assert result.stats["restarts"] == 0 and result.reference == "interpreter"
    assert result.best is not None and result.best.options.unroll_factor != 4
    assert all(MappingOptions.from_json(r.options_json).unroll_factor != 4
               for r in tc.OptionsCache(db).entries())
    monkeypatch.delenv(HOOK)
    np.testing.assert_allclose(np.asarray(fn(a, b, options=result.best.options)), a @ b,
                               rtol=1e-3, atol=1e-3)


@pytest.mark.gpu
def test_gpu_worker_survives_a_refused_launch():
    # a block of 64 x 32 = 2048 threads is refused before the driver launches anything: the
    # candidate is an error, and the worker (its CUDA context intact) takes the next one
    fn = tc.define(MATMUL, target="cuda")
    a, b = _inputs(64, 16, 64)
    pool = WorkerPoolEvaluator(fn, (a, b), TunerConfig(generations=1, population=2, runs=1,
                                                       devices=(0,)))
    try:
        refused, fine = pool.evaluate([MappingOptions.naive().map_to_threads(64, 32),
                                       MappingOptions.naive()], math.inf)
    finally:
        pool.close()
    assert "2048 threads" in refused.error and "crashed" not in refused.error
    assert fine.error is None and math.isfinite(fine.time_s)
    assert pool.restarts == 0


@pytest.mark.gpu
def test_gpu_cached_wrong_row_is_dropped(monkeypatch, tmp_path):
    fn = tc.define(MATMUL, target="cuda")
    a, b = _inputs(33, 17, 29)
    db = tmp_path / "gpu-rows.sqlite3"
    cache = _store_row(db, fn, (a, b), MappingOptions.naive().unroll(8))
    monkeypatch.setenv(HOOK, "unroll_factor=8")
    with pytest.warns(WrongResultWarning):
        got = tc.make_load_from_cache_options_factory(db)(fn, (a, b))
    # the fallback is what a call without a factory gets: the defaults at this call's sizes
    assert got == MappingOptions.default_for(fn.ir, "cuda", fn.size_values(a, b))
    assert cache.lookup(fn, a, b) is None
