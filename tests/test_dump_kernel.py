"""What a compiled `Kernel` shows: a short ``repr`` and a `BenchmarkResult` from ``benchmark``."""

from __future__ import annotations

import re
import statistics

import numpy as np
import pytest

import tcmlir as tc
from tcmlir.api import options_digest
from tcmlir.benchmark import BenchmarkResult, format_seconds

MATMUL = "def matmul(float(M,K) A, float(K,N) B) -> (C) { C(m,n) +=! A(m,k) * B(k,n) }"


@pytest.fixture(scope="module")
def matmul_inputs():
    rng = np.random.default_rng(0)
    return (rng.standard_normal((8, 4)).astype(np.float32),
            rng.standard_normal((4, 6)).astype(np.float32))


def test_repr_names_the_kernel_not_its_ir(matmul_inputs):
    fn = tc.define(MATMUL, target="cpu")
    kernel = fn.compile(*matmul_inputs)
    text = repr(kernel)
    assert re.fullmatch(r"<tcmlir kernel matmul target=cpu arch=\S+ options=[0-9a-f]{12} "
                        r"sizes=M=8,K=4,N=6>", text), text
    assert f"arch={kernel.arch}" in text
    assert f"options={options_digest(kernel.options)}" in text
    assert len(text) < 120 and "\n" not in text and "domain" not in text
    other = fn.compile(*matmul_inputs, options=tc.MappingOptions.naive().tile(4, 4))
    assert options_digest(other.options) != options_digest(kernel.options)
    assert repr(other) != text
    cuda = fn.compile(*matmul_inputs, target="cuda", arch="sm_90")
    assert "target=cuda arch=sm_90 " in repr(cuda)
    parametric = fn.compile(*matmul_inputs, options=tc.MappingOptions.naive().with_parametric())
    assert repr(parametric).endswith("sizes=parametric>")


def test_options_digest_is_of_the_exact_options():
    a = tc.MappingOptions.naive()
    assert options_digest(a) == options_digest(tc.MappingOptions.from_json(a.to_json()))
    assert options_digest(a) != options_digest(a.unroll(2))


@pytest.mark.parametrize("target", ["cpu", "numpy"])
def test_benchmark_returns_a_result_that_prints_and_is_a_sequence(matmul_inputs, target):
    kernel = tc.define(MATMUL, target=target).compile(*matmul_inputs)
    result = kernel.benchmark(*matmul_inputs, runs=4)
    assert isinstance(result, BenchmarkResult)
    assert result.runs == len(result) == 4 and all(t > 0 for t in result)
    assert result.median == statistics.median(result.times)
    assert result.min == min(result.times) <= result.median <= result.max
    assert result.entry == "matmul" and result.target == target
    # what callers of the list it used to be do
    assert statistics.median(result) == result.median
    assert result[0] == result.times[0] and list(result[1:]) == list(result.times[1:])
    assert result == list(result.times) and list(result) == list(result.times)
    text = repr(result)
    assert text.startswith(f"BenchmarkResult(matmul on {target}: median ")
    assert ", min " in text and text.endswith(", 4 runs)")
    assert str(result) == text[len("BenchmarkResult("):-1]


@pytest.mark.parametrize("runs", [0, -1, 2.5, True])
def test_benchmark_refuses_bad_run_counts(matmul_inputs, runs):
    kernel = tc.define(MATMUL, target="numpy").compile(*matmul_inputs)
    with pytest.raises(tc.TCError, match="runs must be an integer >= 1"):
        kernel.benchmark(*matmul_inputs, runs=runs)


def test_benchmark_result_arithmetic_and_printing():
    r = BenchmarkResult.of([3e-3, 1e-3, 2e-3, 4e-3], "f", "cuda")
    assert (r.median, r.min, r.max, r.mean, r.runs) == (2.5e-3, 1e-3, 4e-3, 2.5e-3, 4)
    assert str(r) == "f on cuda: median 2.5 ms, min 1 ms, 4 runs"
    assert str(BenchmarkResult.of([2.0])) == "median 2 s, min 2 s, 1 run"
    assert r == BenchmarkResult.of([3e-3, 1e-3, 2e-3, 4e-3], "f", "cuda") and r != [1e-3]
    assert hash(r) == hash(BenchmarkResult.of(list(r), "f", "cuda"))
    assert [format_seconds(s) for s in (12.0, 0.0123, 4.56e-5, 7e-9)] == [
        "12 s", "12.3 ms", "45.6 µs", "7 ns"]
    with pytest.raises(ValueError, match="at least one run"):
        BenchmarkResult.of([])


@pytest.mark.gpu
def test_cuda_benchmark_result(matmul_inputs):
    kernel = tc.define(MATMUL, target="cuda").compile(*matmul_inputs)
    result = kernel.benchmark(*matmul_inputs, runs=3)
    assert isinstance(result, BenchmarkResult) and result.runs == 3 and result.min > 0
    assert str(result).startswith("matmul on cuda: median ")
