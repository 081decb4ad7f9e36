"""Running split calls (tcmlir.multi.execute) without a GPU.

* host targets: every corpus program called with ``devices=[0, 0]`` (the parts run one after
  another on row slices) equals its numpy oracle — the decomposition itself is right;
* CUDA over a fake driver with two "devices" (`fake_cuda`, extended here with streams,
  events, peer and device-local copies): each part on its own stream, input slabs copied
  (host → device, device-local, peer, or staged through the host) or used in place, outputs
  written in place on the output device or copied there, no host round trip, and the results
  (the fake runs each part's host build on the pointers the plan packed) are right.

The ``gpu`` tests at the end check the same on a real device with ``devices=[0, 0]``.
"""

from __future__ import annotations

import ctypes
import types

import numpy as np
import pytest
from corpus import as_tuple
from corpus.programs import CASES
from fake_cuda import (
    FakeContext,
    FakeDriver,
    FakeRuntime,
    FakeTensor,
    install_fake,
    install_fake_torch,
    simulate_with_host,
)
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from strategies_programs import model_close, programs

import tcmlir as tc
from tcmlir import compiler
from tcmlir.errors import CallError
from tcmlir.multi import cuda_split
from tcmlir.runtime import arrays, cuda_memory, peer
from tcmlir.runtime.cuda_launch import CudaRunner

MATMUL = "def matmul(float(M, K) A, float(K, N) B) -> (C) { C(m, n) +=! A(m, k) * B(k, n) }"
ACC = "def acc(float(N, D) x, float(D) b) -> (z) { z(i, j) += x(i, j) * b(j) }"


# ------------------------------------------------------------------ host targets


def _check(case, got, expected):
    got = got if isinstance(got, tuple) else (got,)
    for g, e in zip(got, expected, strict=True):
        g, e = np.asarray(g), np.asarray(e)
        assert g.shape == e.shape and g.dtype == e.dtype, case.name
        if g.dtype.kind == "f" or g.dtype.name == "bfloat16":
            tol = case.rtol or {2: 1e-2, 4: 1e-4, 8: 1e-10}[g.dtype.itemsize]
            scale = max(float(np.max(np.abs(e.astype(np.float64)))), 1e-30) if e.size else 1
            assert np.max(np.abs(g.astype(np.float64) - e), initial=0) <= tol * scale, case.name
        else:
            np.testing.assert_array_equal(g, e, err_msg=case.name)


@pytest.mark.parametrize("case", CASES, ids=lambda c: c.name)
def test_corpus_split_on_the_host_matches_the_oracle(case, rng):
    fn = tc.define(case.source, case.entry, target="numpy")
    for sizes in reversed(case.sizes):  # down to the last sizes that split (the largest)
        inputs = case.make_inputs(rng, **sizes)
        _check(case, fn(*inputs, devices=[0, 0]), case.expected(*inputs))
        plan = list(fn._split_executors.values())[-1].plan
        if plan.is_split:
            break
    assert plan.is_split == (case.name not in _NOT_SPLIT), plan.reason


_NOT_SPLIT = {"constant_dims", "transpose", "fused_diagonal_stencil", "reversed_temporary",
              "reduce_sum_rows_cols", "lower_triangle_index_compare", "exists_fill", "dim_ref",
              "sizes_and_indices_as_values", "partial_write_annotated",
              "stencil_negative_offset"}


def _random_program_split_matches_model(target: str, examples: int) -> None:
    @settings(max_examples=examples, deadline=None, database=None,
              suppress_health_check=[HealthCheck.too_slow])
    @given(program=programs(), seed=st.integers(0, 2**32 - 1))
    def check(program, seed):
        inputs = program.make_inputs(np.random.default_rng(seed))
        fn = tc.define(program.source, target=target)
        got = as_tuple(fn(*inputs, devices=[0, 0]))
        want = program.numpy_fn(*inputs)
        for k, (g, w) in enumerate(zip(got, want, strict=True)):
            assert model_close(np.asarray(g), w), (
                f"output {k} of the split call differs from the numpy model\n{program.source}"
                f"{program.sizes}\n{fn.plan(*inputs, devices=[0, 0])}")

    check()


def test_random_programs_split_on_the_host_match_their_model():
    _random_program_split_matches_model("numpy", 12)


def test_host_split_on_the_cpu_target_and_its_errors(rng):
    fn = tc.define(MATMUL, target="cpu")
    A, B = rng.standard_normal((9, 4)).astype(np.float32), rng.standard_normal((4, 3)).astype(
        np.float32)
    np.testing.assert_allclose(fn(A, B, devices=[0, 1, 2]), A @ B, rtol=1e-5)
    opts = tc.MappingOptions.naive().on_devices(0, 1)
    np.testing.assert_allclose(fn(A, B, options=opts), A @ B, rtol=1e-5)
    with pytest.raises(CallError, match="outputs= is not supported with devices="):
        fn(A, B, devices=[0, 1], outputs=np.zeros((9, 3), np.float32))
    with pytest.raises(CallError, match="stream= is for target='cuda'"):
        fn(A, B, devices=[0, 1], stream=5)


# ------------------------------------------------------------------ a fake with two devices


class TwoDeviceDriver(FakeDriver):
    """The fake driver plus what a split call uses: streams, stream waits, peer queries and
    device-to-device copies (memory is host memory, so copies really move bytes)."""

    def __init__(self, peer_access: bool = True):
        super().__init__()
        self.peer_access = peer_access
        self._next_stream = 0x100

    def cuStreamWaitEvent(self, stream, event, flags):
        self.calls.append(("cuStreamWaitEvent", int(stream)))
        return (self.CUresult.CUDA_SUCCESS,)

    def cuMemcpyPeerAsync(self, dst, dst_ctx, src, src_ctx, nbytes, stream):
        self.calls.append(("cuMemcpyPeerAsync", nbytes, int(stream), dst_ctx, src_ctx))
        ctypes.memmove(int(dst), int(src), nbytes)
        return (self.CUresult.CUDA_SUCCESS,)

    def cuMemcpyDtoD(self, dst, src, nbytes):
        return self._copy("cuMemcpyDtoD", dst, src, nbytes)

    def cuMemcpyPeer(self, dst, dst_ctx, src, src_ctx, nbytes):
        self.calls.append(("cuMemcpyPeer", nbytes, None, dst_ctx, src_ctx))
        ctypes.memmove(int(dst), int(src), nbytes)
        return (self.CUresult.CUDA_SUCCESS,)

    def cuMemcpyDtoDAsync(self, dst, src, nbytes, stream):
        return self._copy("cuMemcpyDtoDAsync", dst, src, nbytes, int(stream))

    def cuDeviceGet(self, ordinal):
        return self.CUresult.CUDA_SUCCESS, ordinal

    def cuDeviceCanAccessPeer(self, dev, peer_dev):
        self.calls.append(("cuDeviceCanAccessPeer", dev, peer_dev))
        return self.CUresult.CUDA_SUCCESS, int(self.peer_access)

    def cuCtxEnablePeerAccess(self, ctx, flags):
        self.calls.append(("cuCtxEnablePeerAccess", ctx))
        return (self.CUresult.CUDA_SUCCESS,)

    def new_stream(self) -> int:
        self._next_stream += 0x100
        self.calls.append(("cuStreamCreate", self._next_stream))
        return self._next_stream


class DeviceContext(FakeContext):
    def __init__(self, ordinal: int):
        self.ordinal = ordinal
        self.handle = f"ctx{ordinal}"


class TwoDeviceRuntime(FakeRuntime):
    """Per-device contexts, streams, and a record of which device each allocation is on."""

    def __init__(self, driver: TwoDeviceDriver):
        super().__init__(driver)
        self.contexts = {d: DeviceContext(d) for d in (0, 1)}
        self.placed: list[tuple[int, int, int]] = []  # (address, nbytes, device)

    def context(self, device: int = 0):
        return self.contexts[device]

    def stream(self, device: int = 0):
        return types.SimpleNamespace(handle=self.driver.new_stream(), context=self.contexts[device])

    def alloc(self, nbytes: int, device: int = 0):
        buf = cuda_memory.DeviceBuffer(self.contexts[device], nbytes)
        self.placed.append((buf.ptr, max(1, nbytes), device))
        return buf

    def pinned(self, nbytes: int, device: int = 0):
        return cuda_memory.PinnedHostBuffer(self.contexts[device], nbytes)

    def place(self, array: np.ndarray, device: int) -> np.ndarray:
        self.placed.append((array.ctypes.data, max(1, array.nbytes), device))
        return array

    def pointer_device(self, ptr: int) -> int:
        for address, nbytes, device in reversed(self.placed):
            if address <= ptr < address + nbytes:
                return device
        return 0


def _two_devices(monkeypatch, source, *host_inputs, peer_access=True, devices=(0, 1),
                 fake=None):
    """A cuda TCFunction over the two-device fake (a new one, or ``fake``: an earlier call's
    (driver, runtime)); each launch runs the host build."""
    if fake is None:
        driver = TwoDeviceDriver(peer_access)
        install_fake(monkeypatch)
        from tcmlir.runtime import cuda as rcuda
        from tcmlir.runtime import cuda_launch, launch_plan, streams

        for module in (cuda_memory, rcuda, cuda_launch, launch_plan, streams, peer):
            monkeypatch.setattr(module, "driver", driver)
        runtime = TwoDeviceRuntime(driver)
        monkeypatch.setattr(cuda_launch, "get_runtime", lambda: runtime)
        monkeypatch.setattr(arrays, "get_runtime", lambda: runtime)
        import tcmlir.cache.artifacts as artifacts

        monkeypatch.setattr(artifacts, "make_cuda_runner",
                            lambda image, key, device=0: CudaRunner(image, device,
                                                                    runtime=runtime))
    else:
        driver, runtime = fake
    fn = tc.define(source, target="cuda")
    split = fn.compile(*host_inputs, devices=list(devices), arch="sm_90")
    (kernel,) = {id(k): k for k in split.kernels}.values()  # equal chunks: one kernel
    sub = [x[: split.plan.parts[0].slabs[t.name][1]] if t.name in split.plan.sliced else x
           for t, x in zip(fn.ir.inputs, host_inputs, strict=True)]
    simulate_with_host(driver, kernel.runner.image, tc.define(source, target="cpu").compile(*sub))
    return fn, split, driver, runtime


def _device_array(runtime, host, device):
    """A CUDA-array-interface object whose "device" memory is ``host``'s, on ``device``."""
    from fake_cuda import device_array

    return device_array(runtime.place(host, device))


def _launch_streams(driver):
    return [c[4] for c in driver.calls if c[0] == "cuLaunchKernel"]


def test_numpy_inputs_two_devices_slabs_copied_in_output_gathered_by_peer_copy(monkeypatch, rng):
    A = rng.standard_normal((8, 5)).astype(np.float32)
    B = rng.standard_normal((5, 3)).astype(np.float32)
    fn, split, driver, _ = _two_devices(monkeypatch, MATMUL, A, B)
    driver.calls.clear()
    np.testing.assert_allclose(fn(A, B, devices=[0, 1]), A @ B, rtol=1e-5)
    streams = sorted(set(_launch_streams(driver)))
    assert len(streams) == 2 and 0 not in streams, "each part on its own stream"
    copies = [(c[1], c[2]) for c in driver.calls if c[0] == "cuMemcpyHtoDAsync"]
    # per part: its 4 rows of A (4*5*4 bytes) and all of B (5*3*4), on its own stream
    assert sorted(copies) == sorted([(80, s) for s in streams] + [(60, s) for s in streams])
    peer_copies = [c for c in driver.calls if c[0] == "cuMemcpyPeerAsync"]
    assert [(c[1], c[3], c[4]) for c in peer_copies] == [(4 * 3 * 4, "ctx0", "ctx1")]
    assert sum(p.bytes_in for p in split.plan.parts) == 2 * (80 + 60)
    # the output comes back once, at the end, on the caller's stream; nothing else reads back
    reads = [c for c in driver.calls if c[0].startswith("cuMemcpyDtoH")]
    assert [(c[0], c[1], c[2]) for c in reads] == [("cuMemcpyDtoHAsync", 8 * 3 * 4, 0)]
    assert driver.names()[-1] == "cuStreamSynchronize"


def test_part_streams_wait_for_the_caller_and_the_caller_for_the_parts(monkeypatch, rng):
    A = rng.standard_normal((8, 5)).astype(np.float32)
    B = rng.standard_normal((5, 3)).astype(np.float32)
    fn, _, driver, _ = _two_devices(monkeypatch, MATMUL, A, B)
    fn(A, B, devices=[0, 1])
    driver.calls.clear()
    compiles = compiler.COMPILE_COUNTS["compile_kernel"]
    fn(A, B, devices=[0, 1])
    assert compiler.COMPILE_COUNTS["compile_kernel"] == compiles, "a warm call compiles nothing"
    names = driver.names()
    streams = sorted(set(_launch_streams(driver)))
    for s in streams:  # a part waits for the caller's event before its first copy in
        first_wait = names.index("cuStreamWaitEvent")
        first_copy = next(i for i, c in enumerate(driver.calls)
                          if c[0] == "cuMemcpyHtoDAsync" and c[2] == s)
        assert first_wait < first_copy
    records = [c[1] for c in driver.calls if c[0] == "cuEventRecord"]
    assert records[0] == 0 and set(streams) <= set(records)
    waits = [c[1] for c in driver.calls if c[0] == "cuStreamWaitEvent"]
    assert waits.count(0) == 4, "the callers' streams (legacy, both devices) wait for both parts"
    assert "cuMemAlloc" not in names and "cuStreamCreate" not in names, "a warm call allocates nothing"


def test_same_device_inputs_used_in_place_and_outputs_written_in_place(monkeypatch, rng):
    A = rng.standard_normal((8, 5)).astype(np.float32)
    B = rng.standard_normal((5, 3)).astype(np.float32)
    fn, _, driver, runtime = _two_devices(monkeypatch, MATMUL, A, B, devices=(0, 0))
    dA, dB = _device_array(runtime, A, 0), _device_array(runtime, B, 0)
    assert [p.bytes_in for p in fn.plan(dA, dB, devices=[0, 0]).parts] == [0, 0]
    driver.calls.clear()
    out = fn(dA, dB, devices=[0, 0])
    np.testing.assert_allclose(out.get(), A @ B, rtol=1e-5)
    assert len(set(_launch_streams(driver))) == 2
    moved = [c for c in driver.calls if c[0].startswith("cuMemcpy")]
    assert [c[0] for c in moved] == ["cuMemcpyDtoH"], "only .get() reads; no copy in or out"
    launches = [c for c in driver.calls if c[0] == "cuLaunchKernel"]
    a_slots = sorted(c[5][0] for c in launches)
    assert a_slots == [A.ctypes.data, A.ctypes.data + 4 * 5 * 4], "A's rows used where they are"
    c_slots = sorted(c[5][2] for c in launches)
    assert c_slots[1] - c_slots[0] == 4 * 3 * 4, "each part writes its rows of the one output"


def test_same_device_copies_are_device_local_when_not_in_place(monkeypatch, rng):
    A = rng.standard_normal((8, 5)).astype(np.float32)
    B = rng.standard_normal((5, 3)).astype(np.float32)
    fn, _, driver, runtime = _two_devices(monkeypatch, MATMUL, A, B, devices=(0, 0))
    monkeypatch.setattr(cuda_split.SplitExecutor, "in_place", False)
    dA, dB = _device_array(runtime, A, 0), _device_array(runtime, B, 0)
    driver.calls.clear()
    np.testing.assert_allclose(fn(dA, dB, devices=[0, 0]).get(), A @ B, rtol=1e-5)
    local = sorted(c[1] for c in driver.calls if c[0] == "cuMemcpyDtoDAsync")
    assert local == [60, 60, 80, 80]
    assert not any(c[0] in ("cuMemcpyPeerAsync", "cuMemcpyHtoDAsync") for c in driver.calls)


def test_inputs_on_different_devices_go_peer_to_peer(monkeypatch, rng):
    A = rng.standard_normal((8, 5)).astype(np.float32)
    B = rng.standard_normal((5, 3)).astype(np.float32)
    fn, _, driver, runtime = _two_devices(monkeypatch, MATMUL, A, B)
    dA, dB = _device_array(runtime, A, 1), _device_array(runtime, B, 0)
    plan = fn.plan(dA, dB, devices=[0, 1])
    assert [p.bytes_in for p in plan.parts] == [80, 60]
    driver.calls.clear()
    np.testing.assert_allclose(fn(dA, dB, devices=[0, 1]).get(), A @ B, rtol=1e-5)
    peers = sorted((c[1], c[3], c[4]) for c in driver.calls if c[0] == "cuMemcpyPeerAsync")
    # A's rows 0..3 to device 0, all of B to device 1, C's rows 4..7 back to device 0
    assert peers == [(48, "ctx0", "ctx1"), (60, "ctx1", "ctx0"), (80, "ctx0", "ctx1")]
    assert ("cuCtxEnablePeerAccess", "ctx1") in driver.calls
    assert [c[1] for c in driver.calls if c[0] == "cuMemcpyDtoH"] == [8 * 3 * 4], \
        "no host round trip: the only read is .get()"
    assert "cuMemcpyHtoDAsync" not in driver.names()


def test_without_peer_access_copies_are_staged_through_the_host(monkeypatch, rng):
    A = rng.standard_normal((8, 5)).astype(np.float32)
    B = rng.standard_normal((5, 3)).astype(np.float32)
    fn, _, driver, runtime = _two_devices(monkeypatch, MATMUL, A, B, peer_access=False)
    dA, dB = _device_array(runtime, A, 1), _device_array(runtime, B, 0)
    for _ in range(2):  # the second call reuses the staging buffers
        driver.calls.clear()
        np.testing.assert_allclose(fn(dA, dB, devices=[0, 1]).get(), A @ B, rtol=1e-5)
    assert not any(c[0] == "cuMemcpyPeerAsync" for c in driver.calls)
    staged = sorted(c[1] for c in driver.calls if c[0] == "cuMemcpyDtoH")
    assert staged[:3] == [48, 60, 80]  # (+ the final .get() of 96 bytes)
    assert "cuMemHostAlloc" not in driver.names()


def test_accumulating_outputs_start_at_zero_in_every_part(monkeypatch, rng):
    x = rng.standard_normal((6, 4)).astype(np.float32)
    b = rng.standard_normal(4).astype(np.float32)
    fn, _, driver, _ = _two_devices(monkeypatch, ACC, x, b)
    driver.calls.clear()
    np.testing.assert_allclose(fn(x, b, devices=[0, 1]), x * b, rtol=1e-6)
    zeroed = [c for c in driver.calls if c[0] == "cuMemsetD32Async"]
    assert sorted(c[2] for c in zeroed) == [48, 48]  # each part's 3 rows, on its stream


def test_torch_tensors_on_two_devices_give_a_torch_tensor_on_the_output_device(monkeypatch, rng):
    torch = install_fake_torch(monkeypatch)
    A = rng.standard_normal((8, 5)).astype(np.float32)
    B = rng.standard_normal((5, 3)).astype(np.float32)
    fn, _, driver, runtime = _two_devices(monkeypatch, MATMUL, A, B)
    tA, tB = FakeTensor(runtime.place(A, 1), 1), FakeTensor(runtime.place(B, 0), 0)
    out = fn(tA, tB, devices=[0, 1])
    assert isinstance(out, FakeTensor) and out.device.index == 0
    np.testing.assert_allclose(out.array, A @ B, rtol=1e-5)
    assert torch.allocations[0][:3] == ("empty", (8, 3), "float32")
    waits = [c[1] for c in driver.calls if c[0] == "cuStreamWaitEvent"]
    assert waits.count(torch.current) == 4, "both devices' torch streams wait for both parts"


def test_sharded_outputs_stay_on_their_devices_and_feed_the_next_call_in_place(monkeypatch,
                                                                               rng):
    from tcmlir.multi import Sharded, call_sharded

    A = rng.standard_normal((8, 5)).astype(np.float32)
    B = rng.standard_normal((5, 3)).astype(np.float32)
    fn, _, driver, runtime = _two_devices(monkeypatch, MATMUL, A, B)
    driver.calls.clear()
    C = call_sharded(fn, A, B, devices=[0, 1])
    assert isinstance(C, Sharded) and C.shape == (8, 3)
    assert C.locations == ((0, 0, 4), (1, 4, 8))
    assert not any(c[0] == "cuMemcpyPeerAsync" for c in driver.calls), "nothing gathered"
    for shard in C.shards:
        np.testing.assert_allclose(shard.array.get(), (A @ B)[slice(*shard.rows)], rtol=1e-5)
    # the next split call of the same rows reads the shards where they are
    relu = "def relu(float(M, N) X) -> (Y) { Y(i, j) = fmax(X(i, j), 0) }"
    rfn, _, rdriver, _ = _two_devices(monkeypatch, relu, A @ B, fake=(driver, runtime))
    plan = rfn.plan(C, devices=[0, 1])
    assert [p.bytes_in for p in plan.parts] == [0, 0]
    rdriver.calls.clear()
    Y = call_sharded(rfn, C, devices=[0, 1])
    assert not any(c[0].startswith("cuMemcpy") for c in rdriver.calls), "no copy at all"
    launches = sorted(c[5][0] for c in rdriver.calls if c[0] == "cuLaunchKernel")
    assert launches == sorted(s.ptr for s in C.shards)
    np.testing.assert_allclose(Y.gather(0).get(), np.maximum(A @ B, 0), rtol=1e-5)
    # rows split differently (three parts) are copied from the shards that hold them
    plan3 = rfn.plan(C, devices=[0, 1, 0])
    assert [p.slabs["X"] for p in plan3.parts] == [(0, 2), (2, 5), (5, 8)]
    # device 1 needs rows 2..3 from device 0's shard (row 4 is its own); device 0 rows 5..7
    assert [p.bytes_in for p in plan3.parts] == [0, 2 * 12, 3 * 12]
    rdriver.calls.clear()
    Y3 = rfn(C, devices=[0, 1, 0])
    np.testing.assert_allclose(Y3.get(), np.maximum(A @ B, 0), rtol=1e-5)
    moved = sorted((c[0], c[1]) for c in rdriver.calls if c[0] in ("cuMemcpyPeerAsync",
                                                                   "cuMemcpyDtoDAsync"))
    # in: 24 (peer) + 12 (device-local, row 4 into part 1's buffer) + 36 (peer, part 2 is on
    # device 0 but the rows are on device 1); out: part 1's 3 rows back to device 0 (peer);
    # part 2 writes rows 5..7 of the output, 60 bytes in: not 16-byte aligned, so its kernel
    # (which takes outputs aligned) runs on an aligned copy moved in and back (2 x 36)
    assert moved == [("cuMemcpyDtoDAsync", 12), ("cuMemcpyDtoDAsync", 36), ("cuMemcpyDtoDAsync", 36),
                     ("cuMemcpyPeerAsync", 24), ("cuMemcpyPeerAsync", 36), ("cuMemcpyPeerAsync", 36)]


def test_unsplittable_program_runs_as_one_part_on_the_first_device(monkeypatch, rng):
    src = "def total(float(N, D) A) -> (s) { s +=! A(i, j) }"
    A = rng.standard_normal((6, 4)).astype(np.float32)
    fn, split, driver, runtime = _two_devices(monkeypatch, src, A, devices=(1, 0))
    assert not split.plan.is_split and split.plan.parts[0].device == 1
    dA = _device_array(runtime, A, 0)
    out = fn(dA, devices=[1, 0])
    np.testing.assert_allclose(out.get(), A.sum(), rtol=1e-5)
    assert out.buffer.device_ordinal == 1  # the first device of the list holds the output
    assert [c[1] for c in driver.calls if c[0] == "cuMemcpyPeerAsync"] == [96]  # A to device 1


# ------------------------------------------------------------------ on the GPU


@pytest.mark.gpu
@pytest.mark.parametrize("case", CASES, ids=lambda c: c.name)
def test_gpu_corpus_split_on_one_device_matches_the_oracle(case, rng):
    fn = tc.define(case.source, case.entry, target="cuda")
    for sizes in case.sizes:
        inputs = case.make_inputs(rng, **sizes)
        _check(case, fn(*inputs, devices=[0, 0]), case.expected(*inputs))


@pytest.mark.gpu
def test_gpu_random_programs_split_match_their_model():
    _random_program_split_matches_model("cuda", 40)


@pytest.mark.gpu
def test_gpu_torch_inputs_split_in_place_and_copied(rng):
    torch = pytest.importorskip("torch")
    fn = tc.define(MATMUL, target="cuda")
    A = torch.randn(301, 64, device="cuda:0")
    B = torch.randn(64, 96, device="cuda:0")
    expected = (A.double() @ B.double()).float()
    out = fn(A, B, devices=[0, 0])
    assert isinstance(out, torch.Tensor) and out.device == torch.device("cuda", 0)
    torch.testing.assert_close(out, expected, rtol=1e-4, atol=1e-3)
    key = next(k for k in fn._split_executors if k[1] == (0, 0))
    executor = fn._split_executors[key]
    assert len({p.handle for p in executor.parts}) == 2
    executor.in_place = False  # the device-local copy path (cuMemcpyDtoDAsync)
    torch.testing.assert_close(fn(A, B, devices=[0, 0]), expected, rtol=1e-4, atol=1e-3)
    # "different" devices on one GPU: one input from the host, one on the device
    torch.testing.assert_close(torch.as_tensor(fn(A.cpu().numpy(), B.cpu().numpy(),
                                                  devices=[0, 0])).cuda(),
                               expected, rtol=1e-4, atol=1e-3)


@pytest.mark.gpu
def test_gpu_cupy_inputs_split(rng):
    cupy = pytest.importorskip("cupy")
    fn = tc.define(MATMUL, target="cuda")
    A = rng.standard_normal((130, 40)).astype(np.float32)
    B = rng.standard_normal((40, 24)).astype(np.float32)
    out = fn(cupy.asarray(A), cupy.asarray(B), devices=[0, 0])
    assert isinstance(out, cupy.ndarray)
    np.testing.assert_allclose(out.get(), A @ B, rtol=1e-4, atol=1e-4)
