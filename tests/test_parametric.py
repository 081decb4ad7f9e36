"""Parametric kernels (sizes as kernel arguments): one compile serves every size; and the
autotuned options factory tunes once per new signature."""

from __future__ import annotations

import importlib

import numpy as np
import pytest

import tcmlir as tc
from tcmlir import compiler
from tcmlir.options import MappingOptions

autotune_mod = importlib.import_module("tcmlir.tune.autotune")  # the module, not the function
MATMUL = "def mm(float(M,K) A, float(K,N) B) -> (C) { C(m,n) +=! A(m,k) * B(k,n) }"
SIZES = ((5, 3, 7), (17, 9, 4), (33, 16, 31))


@pytest.fixture(autouse=True)
def _private_cache_dir(tmp_path, monkeypatch):
    monkeypatch.setenv("TCMLIR_CACHE_DIR", str(tmp_path / "default-cache"))


def _mm_inputs(m, k, n, rng):
    return (rng.standard_normal((m, k)).astype(np.float32),
            rng.standard_normal((k, n)).astype(np.float32))


@pytest.mark.parametrize("target", ["cpu", pytest.param("cuda", marks=pytest.mark.gpu)])
def test_parametric_kernel_compiled_once_serves_three_sizes(target, rng, monkeypatch):
    monkeypatch.delenv("TCMLIR_ALWAYS_COMPILE", raising=False)  # the in-memory cache is the point
    fn = tc.define(MATMUL, target=target)
    opts = MappingOptions.naive().with_parametric()
    before = compiler.COMPILE_COUNTS["compile_kernel"]
    kernels = set()
    for m, k, n in SIZES:
        a, b = _mm_inputs(m, k, n, rng)
        kernels.add(id(fn.compile(a, b, options=opts)))
        np.testing.assert_allclose(np.asarray(fn(a, b, options=opts)), a @ b, rtol=1e-4, atol=1e-4)
    assert compiler.COMPILE_COUNTS["compile_kernel"] - before == 1
    assert len(kernels) == 1


def test_one_parametric_kernel_launched_at_other_sizes(rng):
    fn = tc.define(MATMUL, target="cpu")
    a, b = _mm_inputs(4, 4, 4, rng)
    kernel = fn.compile(a, b, options=MappingOptions.naive().with_parametric())
    for m, k, n in SIZES:
        a, b = _mm_inputs(m, k, n, rng)
        np.testing.assert_allclose(kernel.launch(a, b), a @ b, rtol=1e-4, atol=1e-4)


def test_specialised_kernel_refuses_another_size(rng):
    fn = tc.define(MATMUL, target="cpu")
    kernel = fn.compile(*_mm_inputs(4, 4, 4, rng))
    with pytest.raises(tc.TCError):
        kernel.launch(*_mm_inputs(5, 4, 4, rng))


def test_parametric_and_specialised_kernels_are_distinct(rng):
    fn = tc.define("def add(float(N) A, float(N) B) -> (C) { C(i) = A(i) + B(i) }", target="cpu")
    opts = MappingOptions.naive().with_parametric()
    x5, x9 = np.ones(5, np.float32), np.ones(9, np.float32)
    par = fn.compile(x5, x5, options=opts)
    assert fn.compile(x9, x9, options=opts) is par
    spec5, spec9 = fn.compile(x5, x5), fn.compile(x9, x9)
    assert len({id(par), id(spec5), id(spec9)}) == 3
    np.testing.assert_allclose(par.launch(np.ones(3, np.float32), np.full(3, 2, np.float32)),
                               np.full(3, 3.0))


def test_autotuned_factory_tunes_once_per_signature(tmp_path, monkeypatch, rng):
    calls = []
    real = autotune_mod.tune

    def counting(fn, inputs, **kw):
        calls.append(fn.signature(*inputs))
        return real(fn, inputs, **kw)

    monkeypatch.setattr(autotune_mod, "tune", counting)
    db = tmp_path / "auto.sqlite3"
    cfg = tc.TunerConfig(generations=1, population=2, runs=1, seed=0)
    factory = tc.make_autotuned_options_factory(cfg, cache=db, progress=False)
    fn = tc.define(MATMUL, target="cpu", options_factory=factory)
    a, b = _mm_inputs(6, 5, 4, rng)
    for _ in range(3):
        np.testing.assert_allclose(fn(a, b), a @ b, rtol=1e-4, atol=1e-4)
    assert len(calls) == 1
    c, d = _mm_inputs(7, 5, 4, rng)
    np.testing.assert_allclose(fn(c, d), c @ d, rtol=1e-4, atol=1e-4)
    assert len(calls) == 2
    # a new factory (as in a new process) finds both signatures in the cache
    fresh = tc.define(MATMUL, target="cpu",
                      options_factory=tc.make_autotuned_options_factory(cfg, cache=db,
                                                                        progress=False))
    fresh(a, b)
    fresh(c, d)
    assert len(calls) == 2


def test_parametric_cuda_kernel_one_plan_per_size(monkeypatch, rng):
    # no GPU: the fake driver (tests/fake_cuda.py) runs the parametric host build on the
    # pointers and sizes each plan packs
    from fake_cuda import install_fake, kernel_slots, simulate_with_host

    import tcmlir.cache.artifacts as artifacts
    from tcmlir.runtime.cuda_launch import CudaRunner

    driver, runtime = install_fake(monkeypatch)
    monkeypatch.setattr(artifacts, "make_cuda_runner",
                        lambda image, key, device=0: CudaRunner(image, device, runtime=runtime))
    monkeypatch.delenv("TCMLIR_ALWAYS_COMPILE", raising=False)
    opts = MappingOptions.naive().with_parametric()
    fn = tc.define(MATMUL, target="cuda")
    host = tc.define(MATMUL, target="cpu").compile(*_mm_inputs(4, 4, 4, rng), options=opts)
    before = compiler.COMPILE_COUNTS["compile_kernel"]
    for m, k, n in SIZES:
        a, b = _mm_inputs(m, k, n, rng)
        kernel = fn.compile(a, b, options=opts)
        simulate_with_host(driver, kernel.runner.image, host)
        np.testing.assert_allclose(fn(a, b, options=opts), a @ b, rtol=1e-4, atol=1e-4)
        image = kernel.runner.image
        launch = [c for c in driver.calls if c[0] == "cuLaunchKernel"][-1]
        passed = kernel_slots(image, launch[1], launch[-1])
        # a parametric kernel takes the sizes it reads (matmul: all three), this call's values
        assert sorted(image.kernels[-1].sizes) == ["K", "M", "N"]
        assert {s: passed[s] for s in image.kernels[-1].sizes} == {"M": m, "K": k, "N": n}
    assert compiler.COMPILE_COUNTS["compile_kernel"] - before == 1
    assert len(kernel.runner.plans) == len(SIZES)
