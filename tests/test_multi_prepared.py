"""A warm split call is prepared (tcmlir.multi.prepared): what it asks of the driver, per call.

Over the two-device fake (`fake_multi`, whose driver logs every call): after the first call of
an executor, a call creates no stream or event, allocates nothing the executor keeps (only
the outputs a caller owns), makes no plan (no isl, no binding, no preparation), and queues
exactly the event records and waits, copies and launches of the plan; results stay right.
Also: a capture of a call that keeps buffers is refused, and a gather failure of a split call
with numpy inputs (which synchronises) is reported by that call.
"""

from __future__ import annotations

import collections

import numpy as np
import pytest
from fake_cuda import FakeTensor, install_fake_torch
from fake_multi import device_array_on, two_devices

from tcmlir.errors import CallError
from tcmlir.multi import call_sharded, cuda_split, execute, prepared
from tcmlir.multi import plan as plan_module

MATMUL = "def matmul(float(M, K) A, float(K, N) B) -> (C) { C(m, n) +=! A(m, k) * B(k, n) }"
RELU = "def relu(float(M, N) X) -> (Y) { Y(i, j) = fmax(X(i, j), 0) }"


def _no_planning(monkeypatch, located: bool):
    """Make planning, binding and preparing fail loudly (``located``: locating too)."""
    def refuse(*args, **kwargs):
        raise AssertionError("a warm split call planned, bound or prepared again")

    monkeypatch.setattr(plan_module, "build_scop", refuse)
    monkeypatch.setattr(execute, "split_kernel", refuse)
    monkeypatch.setattr(cuda_split, "prepare", refuse)
    monkeypatch.setattr(cuda_split, "bind_device_inputs", refuse)
    if not located:
        monkeypatch.setattr(execute, "locate_inputs", refuse)


def _warm_counts(monkeypatch, driver, call, located: bool) -> tuple[collections.Counter, object]:
    call()
    call()  # the second call files the executor under the inputs' call key
    with monkeypatch.context() as m:
        _no_planning(m, located)
        driver.calls.clear()
        out = call()
    return collections.Counter(driver.names()), out


def _launches(fn) -> int:
    ex = list(fn._split_executors.values())[-1]
    return sum(len(k.runner.image.kernels) for k in ex.kernels)


def _check_common(counts):
    for name in ("cuStreamCreate", "cuEventCreate", "cuMemHostAlloc", "cuCtxSynchronize",
                 "cuDeviceCanAccessPeer", "cuCtxEnablePeerAccess", "cuMemFree"):
        assert counts[name] == 0, name


@pytest.mark.parametrize("native", [False, True], ids=["cuda-python", "native"])
def test_warm_numpy_call_on_two_devices(monkeypatch, rng, native):
    A = rng.standard_normal((8, 5)).astype(np.float32)
    B = rng.standard_normal((5, 3)).astype(np.float32)
    fn, _, driver, _ = two_devices(monkeypatch, MATMUL, A, B, native=native)
    counts, out = _warm_counts(monkeypatch, driver, lambda: fn(A, B, devices=[0, 1]), False)
    np.testing.assert_allclose(out, A @ B, rtol=1e-5)
    _check_common(counts)
    assert counts["cuMemAlloc"] == 0, "the pool's role: buffers kept by the executor"
    # callers: devices 0 and 1 (legacy streams); parts: 2
    assert counts["cuEventRecord"] == 2 + 2
    assert counts["cuStreamWaitEvent"] == 2 * 2 + 2 * 2
    assert counts["cuLaunchKernel"] == _launches(fn)
    assert counts["cuMemcpyHtoDAsync"] == 4 and counts["cuMemcpyPeerAsync"] == 1
    assert counts["cuMemcpyDtoHAsync"] == 1 and counts["cuStreamSynchronize"] == 1
    assert counts["cuStreamIsCapturing"] == 1, "one capture check per call, on the output stream"


@pytest.mark.parametrize("native", [False, True], ids=["cuda-python", "native"])
def test_warm_torch_call_in_place_on_one_device(monkeypatch, rng, native):
    torch = install_fake_torch(monkeypatch)
    A = rng.standard_normal((8, 5)).astype(np.float32)
    B = rng.standard_normal((5, 3)).astype(np.float32)
    fn, _, driver, runtime = two_devices(monkeypatch, MATMUL, A, B, devices=(0, 0), native=native)
    tA, tB = FakeTensor(runtime.place(A, 0), 0), FakeTensor(runtime.place(B, 0), 0)
    counts, out = _warm_counts(monkeypatch, driver, lambda: fn(tA, tB, devices=[0, 0]), False)
    np.testing.assert_allclose(out.array, A @ B, rtol=1e-5)
    _check_common(counts)
    ex = list(fn._split_executors.values())[-1]
    assert counts["cuMemAlloc"] == 0 and torch.allocations[-1][:2] == ("empty", (8, 3))
    assert counts["cuEventRecord"] == 1 + 2 and counts["cuStreamWaitEvent"] == 2 + 2
    assert counts["cuLaunchKernel"] == _launches(fn)
    assert not any(n.startswith("cuMemcpy") for n in counts), "inputs and outputs in place"
    assert counts["cuStreamIsCapturing"] == int(ex.prepared.check_capture)
    if not ex.prepared.held:  # nothing kept: torch's capture-aware allocator serves all
        assert not ex.prepared.check_capture


def test_warm_device_arrays_go_peer_to_peer_and_only_outputs_are_allocated(monkeypatch, rng):
    A = rng.standard_normal((8, 5)).astype(np.float32)
    B = rng.standard_normal((5, 3)).astype(np.float32)
    fn, _, driver, runtime = two_devices(monkeypatch, MATMUL, A, B)
    dA, dB = device_array_on(runtime, A, 1), device_array_on(runtime, B, 0)
    # CUDA-array-interface objects are located on every call (their device is the pointer's)
    counts, out = _warm_counts(monkeypatch, driver, lambda: fn(dA, dB, devices=[0, 1]), True)
    np.testing.assert_allclose(out.get(), A @ B, rtol=1e-5)
    _check_common(counts)
    assert counts["cuMemAlloc"] == 1, "the output the caller owns, nothing else"
    assert counts["cuMemcpyPeerAsync"] == 3 and counts["cuMemcpyHtoDAsync"] == 0


def test_warm_sharded_input_read_in_place(monkeypatch, rng):
    A = rng.standard_normal((8, 5)).astype(np.float32)
    B = rng.standard_normal((5, 3)).astype(np.float32)
    fn, _, driver, runtime = two_devices(monkeypatch, MATMUL, A, B)
    C = call_sharded(fn, A, B, devices=[0, 1])
    rfn, _, _, _ = two_devices(monkeypatch, RELU, A @ B, fake=(driver, runtime))
    counts, Y = _warm_counts(monkeypatch, driver, lambda: call_sharded(rfn, C, devices=[0, 1]),
                             True)
    _check_common(counts)
    assert not any(n.startswith("cuMemcpy") for n in counts)
    assert counts["cuMemAlloc"] == 2, "each part's shard of the output"
    np.testing.assert_allclose(Y.gather(0).get(), np.maximum(A @ B, 0), rtol=1e-5)


@pytest.mark.parametrize("native", [False, True], ids=["cuda-python", "native"])
def test_inputs_changing_between_calls_are_read_each_call(monkeypatch, rng, native):
    torch = install_fake_torch(monkeypatch)
    A = rng.standard_normal((8, 5)).astype(np.float32)
    B = rng.standard_normal((5, 3)).astype(np.float32)
    fn, _, _, runtime = two_devices(monkeypatch, MATMUL, A, B, devices=(0, 0), native=native)
    for _ in range(3):  # new tensors (new pointers), new values: the prepared slots follow
        A, B = A + 1, B * 2
        tA, tB = FakeTensor(runtime.place(A, 0), 0), FakeTensor(runtime.place(B, 0), 0)
        atol = 1e-5 * float((np.abs(A) @ np.abs(B)).max())  # sums of terms of ~100 cancel
        np.testing.assert_allclose(fn(tA, tB, devices=[0, 0]).array, A @ B, rtol=1e-5, atol=atol)
        np.testing.assert_allclose(fn(A, B, devices=[0, 0]), A @ B, rtol=1e-5, atol=atol)
    assert torch.allocations


def test_in_place_off_on_an_executor_prepares_it_again(monkeypatch, rng):
    A = rng.standard_normal((8, 5)).astype(np.float32)
    B = rng.standard_normal((5, 3)).astype(np.float32)
    fn, _, driver, runtime = two_devices(monkeypatch, MATMUL, A, B, devices=(0, 0))
    dA, dB = device_array_on(runtime, A, 0), device_array_on(runtime, B, 0)
    fn(dA, dB, devices=[0, 0])
    ex = list(fn._split_executors.values())[-1]
    assert ex.prepared is not None
    ex.in_place = False
    assert ex.prepared is None
    driver.calls.clear()
    np.testing.assert_allclose(fn(dA, dB, devices=[0, 0]).get(), A @ B, rtol=1e-5)
    assert sorted(c[1] for c in driver.calls if c[0] == "cuMemcpyDtoDAsync") == [60, 60, 80, 80]


def test_capturing_a_split_call_that_keeps_buffers_is_refused(monkeypatch, rng):
    A = rng.standard_normal((8, 5)).astype(np.float32)
    B = rng.standard_normal((5, 3)).astype(np.float32)
    fn, _, driver, _ = two_devices(monkeypatch, MATMUL, A, B)
    fn(A, B, devices=[0, 1])
    driver.capturing.add(0)
    with pytest.raises(CallError, match="cannot be captured in a CUDA graph"):
        fn(A, B, devices=[0, 1])
    driver.capturing.clear()
    np.testing.assert_allclose(fn(A, B, devices=[0, 1]), A @ B, rtol=1e-5)


def test_a_gather_failure_is_reported_by_the_synchronised_split_call(monkeypatch):
    src = "def gather(float(N) X, int32(M) I) -> (Y) { Y(i) = X(I(i)) }"
    X = np.arange(5, dtype=np.float32)
    index = np.array([0, 4, 2, 1, 3, 0], np.int32)
    fn, split, _, _ = two_devices(monkeypatch, src, X, index)
    assert split.plan.is_split
    np.testing.assert_array_equal(fn(X, index, devices=[0, 1]), X[index])
    bad = index.copy()
    bad[5] = 7
    with pytest.raises(CallError, match="gather index out of bounds") as err:
        fn(X, bad, devices=[0, 1])
    assert "reported late" not in str(err.value)
    np.testing.assert_array_equal(fn(X, index, devices=[0, 1]), X[index])
    ex = list(fn._split_executors.values())[-1]
    assert ex.prepared.gather_plans and all(p.plan.gathers for p in ex.prepared.parts)


def test_getters_follow_the_input_types(rng):
    from tcmlir.runtime.arrays import classify

    a = rng.standard_normal((4, 3)).astype(np.float32)
    assert prepared.getter_for(a, classify(a)) == prepared.G_NUMPY
    assert prepared.getter_for(a.T, classify(a.T)) == prepared.G_NUMPY_COPY
    assert prepared.getter_for(2.5, classify(np.asarray(2.5))) == prepared.G_SCALAR


def test_a_slab_in_place_off_16_bytes_gets_a_kernel_for_its_alignment(monkeypatch, rng):
    A = rng.standard_normal((6, 5)).astype(np.float32)  # part 1's rows start 60 bytes in
    B = rng.standard_normal((5, 3)).astype(np.float32)
    fn, split, _, runtime = two_devices(monkeypatch, MATMUL, A, B, devices=(0, 0))
    dA, dB = device_array_on(runtime, A, 0), device_array_on(runtime, B, 0)
    np.testing.assert_allclose(fn(dA, dB, devices=[0, 0]).get(), A @ B, rtol=1e-5)
    parts = list(fn._split_executors.values())[-1].prepared.parts
    if "A" in split.kernels[0].runner.image.aligned:  # kernels that specialise on it
        assert "A" in parts[0].plan._aligned and "A" not in parts[1].plan._aligned


# ------------------------------------------------------------------ on the GPU


@pytest.mark.gpu
def test_gpu_warm_split_calls_allocate_nothing(rng):
    torch = pytest.importorskip("torch")
    import tcmlir as tc
    from tcmlir.runtime.cuda_memory import ALLOC_COUNTS

    fn = tc.define(MATMUL, target="cuda")
    A = torch.randn(301, 64, device="cuda:0")
    B = torch.randn(64, 96, device="cuda:0")
    expected = (A.double() @ B.double()).float()
    for inputs in ((A, B), (A.cpu().numpy(), B.cpu().numpy())):
        fn(*inputs, devices=[0, 0])
        fn(*inputs, devices=[0, 0])
        before = dict(ALLOC_COUNTS)
        for _ in range(5):
            out = fn(*inputs, devices=[0, 0])
        torch.cuda.synchronize()
        assert ALLOC_COUNTS["cuMemAlloc"] == before["cuMemAlloc"]
        assert ALLOC_COUNTS["cuMemHostAlloc"] == before["cuMemHostAlloc"]
        torch.testing.assert_close(torch.as_tensor(out).to("cuda:0"), expected, rtol=1e-4,
                                   atol=1e-3)


@pytest.mark.gpu
def test_gpu_split_slabs_off_16_bytes_in_place(rng):
    torch = pytest.importorskip("torch")
    import tcmlir as tc

    fn = tc.define(MATMUL, target="cuda")
    # part 1's rows of A start 150 * 63 * 4 bytes in, of C 150 * 33 * 4: both 8 mod 16
    A = torch.randn(301, 63, device="cuda:0")
    B = torch.randn(63, 33, device="cuda:0")
    expected = (A.double() @ B.double()).float()
    for _ in range(3):
        torch.testing.assert_close(fn(A, B, devices=[0, 0]), expected, rtol=1e-4, atol=1e-3)
    # a tensor whose own pointer is 8 bytes off 16: an executor of its own
    storage = torch.randn(301 * 63 + 2, device="cuda:0")
    A8 = storage[2:].view(301, 63)
    torch.testing.assert_close(fn(A8, B, devices=[0, 0]),
                               (A8.double() @ B.double()).float(), rtol=1e-4, atol=1e-3)
