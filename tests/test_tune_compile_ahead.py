"""Compile workers of a cuda tuning run: candidates compiled on the CPUs ahead of the GPU
workers and handed over whole (`tune.worker_loops.compile_worker_main`, `cache.kernel_image`).

The compile side runs without a GPU: a compile worker's payload must make the very kernel a
direct compile makes, and a candidate that crashes or hangs its compile worker must fail only
that candidate. The GPU tests run the whole tuner with them.
"""

from __future__ import annotations

import math
import time

import numpy as np
import pytest

import tcmlir as tc
from tcmlir.cache.kernel_image import FORMAT, pack_cuda_kernel, unpack_cuda_kernel
from tcmlir.compiler import cuda_kernel_from
from tcmlir.options import MappingOptions
from tcmlir.runtime.arrays import bind_device_inputs
from tcmlir.tune import TunerConfig, tune
from tcmlir.tune.evaluate import FAULT_ENV, WorkerPoolEvaluator, default_compile_workers
from tcmlir.tune.worker import WorkerProcess
from tcmlir.tune.worker_loops import fault_action as _fault

MATMUL = "def mm(float(M,K) A, float(K,N) B) -> (C) { C(m,n) +=! A(m,k) * B(k,n) }"


def _answer(worker: WorkerProcess, timeout: float = 120.0):
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        msg = worker.receive()
        if msg is not None:
            return msg
        time.sleep(0.02)
    return None


def _bound(m: int, k: int, n: int):
    fn = tc.define(MATMUL, target="cuda")
    a = np.ones((m, k), np.float32)
    b = np.ones((k, n), np.float32)
    return fn, bind_device_inputs(fn.ir, [a, b])


def test_fault_hook_names_its_stage(monkeypatch):
    opts = MappingOptions.naive().unroll(8).to_json()
    monkeypatch.setenv(FAULT_ENV, "crash:unroll_factor=8")
    assert _fault(opts) == "crash" and _fault(opts, "compile") is None
    monkeypatch.setenv(FAULT_ENV, "compile-hang:unroll_factor=8")
    assert _fault(opts) is None and _fault(opts, "compile") == "hang"
    assert _fault(MappingOptions.naive().to_json(), "compile") is None


def test_default_compile_workers():
    assert default_compile_workers(TunerConfig(compile_workers=0)) == 0
    assert default_compile_workers(TunerConfig(compile_workers=3)) == 3
    auto = default_compile_workers(TunerConfig(population=4, devices=(0,)))
    assert 1 <= auto <= 4
    with pytest.raises(tc.OptionsError, match="compile_workers"):
        TunerConfig(compile_workers=-1)


def test_packed_kernel_is_the_kernel_a_direct_compile_makes(tmp_path, monkeypatch):
    monkeypatch.setenv("TCMLIR_ALWAYS_COMPILE", "1")  # no cache: the payload alone carries it
    fn, bound = _bound(64, 1024, 48)
    opts = MappingOptions.default_for(fn.ir, "cuda", bound.sizes).split_reduction(4)
    direct = fn.compile(np.ones((64, 1024), np.float32), np.ones((1024, 48), np.float32),
                        options=opts, arch="sm_90")
    fields = unpack_cuda_kernel(pack_cuda_kernel(direct))
    assert fields is not None and fields["format"] == FORMAT
    again = cuda_kernel_from(fn, opts, bound.signature, bound.sizes, fields)
    assert again.ptx == direct.ptx and again.loops == direct.loops
    assert again.schedule == direct.schedule and again.compiled_ir == direct.compiled_ir
    assert again.runner.image == direct.runner.image
    assert unpack_cuda_kernel(b"\x00junk") is None


def test_packed_kernel_is_json_of_known_classes_only():
    # no pickle (DESIGN.md section 6): the payload is JSON, and reading builds only tcmlir's
    # own IR and image classes: a payload naming anything else is a miss
    import json
    import zlib

    fn, _ = _bound(16, 8, 12)
    kernel = fn.compile(np.ones((16, 8), np.float32), np.ones((8, 12), np.float32), arch="sm_90")
    doc = json.loads(zlib.decompress(pack_cuda_kernel(kernel)))
    assert doc["m"][0] == ["format", FORMAT]
    doc["m"][1][1]["c"] = "Popen"  # the image, renamed to a class outside the allow-list
    assert unpack_cuda_kernel(zlib.compress(json.dumps(doc).encode())) is None


def test_compile_worker_compiles_and_survives_bad_candidates(monkeypatch):
    # one compile worker: a good candidate, one the compiler refuses, one that crashes the
    # worker (SIGSEGV through the test hook), one that hangs it; a replacement goes on
    monkeypatch.setenv("TCMLIR_ALWAYS_COMPILE", "1")
    monkeypatch.setenv(FAULT_ENV, "compile-crash:unroll_factor=8")
    fn, bound = _bound(32, 16, 24)
    args = (fn.definer(), "sm_90", bound.signature.to_json(), dict(bound.sizes))
    worker = WorkerProcess("compile", args, "compile worker")
    try:
        assert worker.wait_ready(120.0) is None
        naive = MappingOptions.naive()
        worker.parent.send(naive.tile(8, 8).to_json())
        kind, payload = _answer(worker)
        assert kind == "ok"
        kernel = cuda_kernel_from(fn, naive.tile(8, 8), bound.signature, bound.sizes,
                                  unpack_cuda_kernel(payload))
        direct = fn.compile(np.ones((32, 16), np.float32), np.ones((16, 24), np.float32),
                            options=naive.tile(8, 8), arch="sm_90")
        assert kernel.ptx == direct.ptx
        worker.parent.send(naive.tile(8, 8).register_tiling(3, 3).to_json())
        assert _answer(worker) == ("error", "register tile (3, 3) needs tile sizes that are "
                                   "multiples of it, got tile sizes (8, 8)")
        worker.parent.send(naive.unroll(8).to_json())
        assert _answer(worker) == ("crash", "worker was killed by SIGSEGV")
        assert not worker.proc.is_alive()
    finally:
        worker.kill()
    monkeypatch.setenv(FAULT_ENV, "compile-hang:unroll_factor=8")
    worker = WorkerProcess("compile", args, "compile worker")
    try:
        worker.wait_ready(120.0)
        worker.parent.send(MappingOptions.naive().unroll(8).to_json())
        assert _answer(worker, timeout=3.0) is None and worker.proc.is_alive()
    finally:
        worker.kill()
    assert not worker.proc.is_alive()


def test_a_cpu_tuning_pool_starts_no_compile_workers():
    fn = tc.define(MATMUL, target="cpu")
    a = np.ones((8, 8), np.float32)
    pool = WorkerPoolEvaluator(fn, (a, a), TunerConfig(runs=1, devices=(0,), compile_workers=2),
                               target="cpu")
    try:
        assert pool.compilers == []
        (ev,) = pool.evaluate([MappingOptions.naive()], math.inf)
        assert ev.ok
    finally:
        pool.close()


@pytest.mark.gpu
def test_gpu_tuning_with_compile_workers(monkeypatch):
    # the candidates come compiled from two compile workers; one that crashes its compile
    # worker and one that hangs it fail alone, and the best is right
    monkeypatch.setenv(FAULT_ENV, "compile-crash:unroll_factor=16")
    fn = tc.define(MATMUL, target="cuda")
    rng = np.random.default_rng(0)
    a = rng.standard_normal((96, 64)).astype(np.float32)
    b = rng.standard_normal((64, 80)).astype(np.float32)
    cfg = TunerConfig(generations=2, population=6, runs=2, seed=3, devices=(0,),
                      compile_workers=2, timeout_s=30.0)
    result = tune(fn, (a, b), config=cfg, options=MappingOptions.naive().unroll(16),
                  progress=False)
    assert result.stats["compile_workers"] == 2 and result.stats["compile_restarts"] >= 1
    crashed = [e for e in result.evaluated.values() if e.error and "compile worker" in e.error]
    assert crashed and all(e.options.unroll_factor == 16 for e in crashed)
    np.testing.assert_allclose(np.asarray(fn(a, b, options=result.best.options)), a @ b,
                               rtol=1e-3, atol=1e-3)


@pytest.mark.gpu
def test_gpu_tuning_outlives_a_compile_that_hangs(monkeypatch):
    monkeypatch.setenv(FAULT_ENV, "compile-hang:unroll_factor=16")
    fn = tc.define(MATMUL, target="cuda")
    a = np.ones((40, 24), np.float32)
    b = np.ones((24, 56), np.float32)
    cfg = TunerConfig(generations=1, population=4, runs=1, seed=1, devices=(0,),
                      compile_workers=2, timeout_s=5.0)
    result = tune(fn, (a, b), config=cfg, options=MappingOptions.naive().unroll(16),
                  progress=False)
    hung = result.evaluated[MappingOptions.naive().unroll(16).to_json()]
    assert hung.error == "compile timed out after 5 s"
    assert result.stats["compile_restarts"] >= 1 and result.best.ok
