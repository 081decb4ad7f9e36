"""Tuning for a split (tcmlir.multi.tune): options cached under the chunk's signature, found
by split calls through an options factory and shared with one-device calls at that size."""

from __future__ import annotations

import importlib

import numpy as np
import pytest

import tcmlir as tc
from tcmlir.multi.tune import autotune_split, chunk_inputs
from tcmlir.tune.config import TunerConfig

MATMUL = "def matmul(float(M, K) A, float(K, N) B) -> (C) { C(m, n) +=! A(m, k) * B(k, n) }"
autotune_module = importlib.import_module("tcmlir.tune.autotune")  # (tcmlir.tune.autotune
# is also the name of the function the package exports)
FAST = TunerConfig(generations=1, population=3, runs=2, seed=3)


@pytest.fixture(autouse=True)
def _private_cache_dir(tmp_path, monkeypatch):
    monkeypatch.setenv("TCMLIR_CACHE_DIR", str(tmp_path / "default-cache"))


def _inputs(rng, m=24, k=16, n=20):
    return (rng.standard_normal((m, k)).astype(np.float32),
            rng.standard_normal((k, n)).astype(np.float32))


def test_chunk_inputs_are_the_distinct_parts(rng):
    fn = tc.define(MATMUL, target="cpu")
    A, B = _inputs(rng, m=25)
    subs = chunk_inputs(fn, (A, B), [0, 0, 0])  # rows 0..7, 8..15, 16..24
    assert [s[0].shape for s in subs] == [(8, 16), (9, 16)]
    np.testing.assert_array_equal(subs[1][0], A[16:25])
    assert all(s[1].shape == B.shape and np.shares_memory(s[1], B) for s in subs)  # no copy


def test_split_tuning_is_stored_under_the_chunk_signature_and_reused(tmp_path, rng):
    fn = tc.define(MATMUL, target="cpu")
    A, B = _inputs(rng)
    db = tmp_path / "tune.sqlite3"
    (best,) = autotune_split(fn, A, B, devices=[0, 0], config=FAST, cache=db, progress=False)
    cache = tc.OptionsCache(db)
    assert cache.lookup(fn, A[:12], B) == best   # the chunk's signature (M=12)
    assert cache.lookup(fn, A, B) is None         # not the whole call's
    user = tc.define(MATMUL, target="cpu",
                     options_factory=tc.make_load_from_cache_options_factory(db))
    split = user.compile(A, B, devices=[0, 0])
    assert [k.options for k in split.kernels] == [best, best]
    np.testing.assert_allclose(user(A, B, devices=[0, 0]), A @ B, rtol=1e-4, atol=1e-4)


def test_options_tuned_for_one_device_at_the_chunk_size_serve_the_split(tmp_path, rng,
                                                                        monkeypatch):
    fn = tc.define(MATMUL, target="cpu")
    A, B = _inputs(rng)
    db = tmp_path / "tune.sqlite3"
    single = fn.autotune(A[12:], B, config=FAST, cache=db, progress=False)

    def no_tuning(*args, **kwargs):
        raise AssertionError("the chunk's signature was tuned already: no search expected")

    monkeypatch.setattr(autotune_module, "tune", no_tuning)
    assert autotune_split(fn, A, B, devices=[0, 1], config=FAST, cache=db,
                          progress=False) == [single]
