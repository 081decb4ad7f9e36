"""The tuner does not compile candidates the contraction model calls hopeless (issue 28,
`tune/model_prune.py`): their answers say so, they are counted, the default is never one."""

from __future__ import annotations

import importlib
import math
import types

import pytest

import tcmlir as tc
from tcmlir.tune.evaluate import Evaluation
from tcmlir.tune.model_prune import PRUNE_RATIO, ModelPruner, predict

autotune_mod = importlib.import_module("tcmlir.tune.autotune")  # the module, not the function

MM = "def mm(float(M,K) A, float(K,N) B) -> (C) { C(m,n) +=! A(m,k) * B(k,n) }"
SIZES = {"M": 4096, "K": 4096, "N": 4096}


def _contraction(tile, reg, ways=1):
    opts = tc.MappingOptions.cuda_contraction(tile, reg)
    return opts.split_reduction(ways) if ways > 1 else opts


def test_predictions_exist_only_for_the_modelled_kernel():
    fn = tc.define(MM).ir
    default = tc.MappingOptions.default_for(fn, "cuda", SIZES)
    assert predict(fn, SIZES, default) > 0
    assert predict(fn, None, default) is None                     # sizes unknown
    assert predict(fn, SIZES, tc.MappingOptions.naive()) is None  # no register tiles
    odd = tc.MappingOptions.cuda_contraction((128, 128, 16), (8, 8)).map_to_threads(8, 8)
    assert predict(fn, SIZES, odd) is None                       # not 16 x 16 threads
    row = tc.define("def r(float(N,D) X) -> (S) { S(n) +=! X(n,d) }").ir
    assert predict(row, {"N": 8, "D": 8}, default) is None       # not a contraction


def test_hopeless_tiles_are_answered_without_compiling():
    fn = tc.define(MM).ir
    default = tc.MappingOptions.default_for(fn, "cuda", SIZES)
    pruner = ModelPruner(fn, SIZES, default)
    small = _contraction((32, 32, 16), (2, 2))  # 4096^3 on 2x2 register tiles: issue-bound
    assert predict(fn, SIZES, small) > PRUNE_RATIO * predict(fn, SIZES, default)
    keep, answers = pruner.split([default, small, tc.MappingOptions.naive()])
    assert keep == [default, tc.MappingOptions.naive()]
    assert list(answers) == [1] and not answers[1].ok and not answers[1].wrong
    assert "pruned by the cost model" in answers[1].error and pruner.pruned == 1
    # no prediction for the baseline (sizes unknown): nothing is pruned
    assert ModelPruner(fn, None, default).split([small])[0] == [small]


@pytest.mark.parametrize("target", ["cuda", "cpu"])
def test_autotune_counts_the_pruned_and_keeps_the_order(monkeypatch, target):
    """The search gets one answer per candidate in order; only cuda prunes (the model prices
    the GPU's kernels); the count lands in the result's stats."""
    seen: list[list[str]] = []

    class Fake:
        compiles = restarts = 0
        reference = types.SimpleNamespace(source="fake")

        def __init__(self, *a, **k):
            pass

        def evaluate(self, candidates, best):
            seen.append([c.to_json() for c in candidates])
            return [Evaluation(c, 1e-3 * (1 + i), 3) for i, c in enumerate(candidates)]

        def remeasure(self, candidates, *a, **k):
            return [Evaluation(c, 1e-3, 3) for c in candidates]

        def close(self):
            pass

    monkeypatch.setattr(autotune_mod, "WorkerPoolEvaluator", Fake)
    monkeypatch.setattr(autotune_mod, "HostEvaluator", Fake)
    monkeypatch.setattr(autotune_mod, "check_cuda_usable", lambda devices: None)
    monkeypatch.setattr(autotune_mod, "compute_reference", lambda *a, **k: None)
    monkeypatch.setattr(autotune_mod, "choose_final", lambda *a, **k: None)
    monkeypatch.setattr(autotune_mod, "mark_verified", lambda *a, **k: None)
    np = pytest.importorskip("numpy")
    a = np.zeros((4096, 4096), np.float32)
    fn = tc.define(MM, target=target)
    small = _contraction((32, 32, 16), (2, 2))
    default = tc.MappingOptions.default_for(fn.ir, "cuda", SIZES)
    monkeypatch.setattr(autotune_mod, "GeneticSearch", _OneGeneration([small, default]))
    result = autotune_mod.tune(fn, [a, a], generations=1, population=2, cache=False,
                               progress=False, target=target)
    answers = [result.evaluated[o.to_json()] for o in (small, default)]
    if target == "cuda":
        assert seen == [[default.to_json()]]
        assert result.stats["pruned"] == 1 and "pruned" in answers[0].error
        assert answers[1].ok and result.best.options == default
    else:
        assert seen == [[small.to_json(), default.to_json()]]
        assert result.stats["pruned"] == 0 and all(e.ok for e in answers)


class _OneGeneration:
    def __init__(self, population):
        self.population = population

    def __call__(self, space, config, start):
        outer = self

        class Search:
            def run(self, evaluate, on_generation=None, should_stop=lambda: False):
                from tcmlir.tune.genetic import TuningResult

                result = TuningResult(best=None)
                for ev in evaluate(list(outer.population), math.inf):
                    result.evaluated[ev.options.to_json()] = ev
                    if ev.ok and (result.best is None or ev.time_s < result.best.time_s):
                        result.best = ev
                result.generations_run = 1
                return result
        return Search()
