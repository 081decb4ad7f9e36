"""The tuner's last step: the finalists and the default re-measured side by side.

The search's timings only shortlist; the options returned are the fastest of the finalists and
the default as measured together (`tune.autotune.choose_final`, `evaluate.measure_side_by_side`),
so they are never slower than the default measured beside them, and the cache stores those
times with their spread. Timings are faked here (real ones are noise at these sizes): the
search sees one ranking (`runs` > 1) and the side-by-side rounds (one run each) another.
"""

from __future__ import annotations

import logging

import numpy as np
import pytest

import tcmlir as tc
from tcmlir.options import MappingOptions
from tcmlir.tune import TunerConfig, tune
from tcmlir.tune import evaluate as evaluate_mod
from tcmlir.tune.evaluate import FINAL_ROUNDS, spread_of

MATMUL = "def mm(float(M,K) A, float(K,N) B) -> (C) { C(m,n) +=! A(m,k) * B(k,n) }"
CONFIG = TunerConfig(generations=1, population=4, runs=3, seed=0)


@pytest.fixture
def problem():
    rng = np.random.default_rng(0)
    a = rng.standard_normal((12, 8)).astype(np.float32)
    b = rng.standard_normal((8, 10)).astype(np.float32)
    fn = tc.define(MATMUL, target="cpu")
    default = MappingOptions.default_for(fn.ir, "cpu", {"M": 12, "K": 8, "N": 10})
    return fn, (a, b), default


def _fake_times(monkeypatch, search, side_by_side):
    calls = []

    def fake_time(kernel, inputs, runs, best, prune_factor, timeout_s):
        pick = search if runs > 1 else side_by_side
        calls.append(runs)
        return pick(kernel.options), runs, False, 0.0

    monkeypatch.setattr(evaluate_mod, "time_kernel", fake_time)
    return calls


def test_the_default_is_returned_when_it_is_faster_side_by_side(problem, monkeypatch, caplog,
                                                                tmp_path):
    fn, inputs, default = problem
    fast_in_search = MappingOptions.naive().unroll(4)
    assert fast_in_search != default
    calls = _fake_times(
        monkeypatch, search=lambda o: 1e-5 if o.unroll_factor == 4 else 1e-3,
        side_by_side=lambda o: 1e-4 if o == default else 2e-4)
    with caplog.at_level(logging.INFO, logger="tcmlir.tune"):
        result = tune(fn, inputs, config=CONFIG, options=fast_in_search, progress=False,
                      cache=tmp_path / "c.db")
    assert result.evaluated[fast_in_search.to_json()].time_s == 1e-5  # the search's pick
    assert result.best.options == default and result.best.time_s == 1e-4
    assert result.final_default.time_s == 1e-4
    assert fast_in_search in [e.options for e in result.final]
    assert calls.count(1) >= FINAL_ROUNDS * 2  # every contender, every round
    assert "the default 0.1000 ms (the default itself)" in caplog.text
    with tc.OptionsCache(tmp_path / "c.db") as cache:
        rec = cache.lookup_record(fn, *inputs)
        assert MappingOptions.from_json(rec.options_json) == default
        assert rec.time_s == 1e-4 and rec.spread_s == 0.0 and rec.runs == FINAL_ROUNDS


def test_a_finalist_faster_side_by_side_is_returned_with_both_times(problem, monkeypatch,
                                                                    caplog):
    fn, inputs, _ = problem
    winner = MappingOptions.naive().unroll(4)
    _fake_times(monkeypatch, search=lambda o: 1e-5 if o.unroll_factor == 4 else 1e-3,
                side_by_side=lambda o: 5e-5 if o == winner else 2e-4)
    with caplog.at_level(logging.INFO, logger="tcmlir.tune"):
        result = tune(fn, inputs, config=CONFIG, options=winner, progress=False)
    assert result.best.options == winner and result.best.time_s == 5e-5
    assert result.final_default.time_s == 2e-4 <= 4 * result.best.time_s
    assert "chose 0.0500 ms, the default 0.2000 ms" in caplog.text


def test_side_by_side_measures_real_kernels_in_turn(problem):
    fn, inputs, default = problem
    answers = evaluate_mod.measure_side_by_side(
        fn, inputs, [default, MappingOptions.naive().tile(4, 4)], "cpu", 4, 60.0)
    for median, spread, samples in answers:
        assert median > 0 and spread >= 0 and samples == 4


def test_spread_is_half_the_interquartile_range():
    assert spread_of([1.0]) == 0.0
    assert spread_of([1.0, 2.0, 3.0, 4.0, 5.0]) == pytest.approx(1.0)


def test_options_tuned_at_the_nearest_sizes_seed_the_first_generation(problem, tmp_path,
                                                                       caplog, monkeypatch):
    fn, (a, b), _ = problem
    _fake_times(monkeypatch, search=lambda o: 1e-3, side_by_side=lambda o: 1e-3)
    near, far = MappingOptions.naive().tile(4, 4).unroll(2), MappingOptions.naive().tile(2, 2)
    with tc.OptionsCache(tmp_path / "c.db") as cache:
        cache.record(fn, np.ones((12, 9), np.float32), np.ones((9, 10), np.float32),
                     options=near, time_s=1e-3, runs=3)
        cache.record(fn, np.ones((500, 8), np.float32), np.ones((8, 400), np.float32),
                     options=far, time_s=1e-4, runs=3)
        seeds = cache.nearest_records(fn, a, b, count=3)
        assert [MappingOptions.from_json(r.options_json) for r in seeds] == [near, far]
        assert cache.nearest_records(fn, a, b, count=1)[0].sizes == {"K": 9, "M": 12, "N": 10}
    with caplog.at_level(logging.INFO, logger="tcmlir.tune"):
        result = tune(fn, (a, b), config=TunerConfig(generations=1, population=4, seed=0),
                      cache=tmp_path / "c.db", progress=False)
    first = result.order[:4]
    assert near.to_json() in first and far.to_json() in first
    assert "seeded with 2 option(s) tuned at the nearest sizes" in caplog.text
