"""Launch plans (runtime/launch_plan.py, host_plan.py, streams.py, pool.py) and the call's hot
path in api.py.

Without a GPU, the CUDA plan runs over `fake_cuda.FakeDriver`: device memory is host memory
and each launch runs the program's host build on the pointers the plan packed, so packing,
stream choice, staging, zero fills, copies back, pooling and the gather flag are checked
against real results. The ``gpu`` tests at the end check the same on a real device (torch
streams, CUDA graphs, CuPy streams, no driver allocation on a warm call).
"""

from __future__ import annotations

import numpy as np
import pytest
from fake_cuda import device_array, install_fake, simulate_with_host

import tcmlir as tc
from tcmlir import compiler
from tcmlir.binding import needs_zero_fill
from tcmlir.errors import CallError, CudaError
from tcmlir.runtime import cuda_memory
from tcmlir.runtime.cuda_launch import CudaRunner
from tcmlir.runtime.launch_plan import ParamBlock
from tcmlir.runtime.pool import BufferPool, size_class
from tcmlir.runtime.streams import stream_handle
from tcmlir.signature import call_key

ADD = "def add(float(N) x, float(N) y) -> (z) { z(i) = x(i) + y(i) }"
SOFTMAX = """
def softmax(float(N, D) I) -> (O) {
    mx(n) max=! I(n, d)
    e(n, d) = exp(I(n, d) - mx(n))
    s(n) +=! e(n, d)
    O(n, d) = e(n, d) / s(n)
}"""
ACCUMULATE = "def acc(float(N) x) -> (z) { z(i) += x(i) }"
GATHER = "def embedding(float(V, D) E, int32(L) idx) -> (O) { O(i, j) = E(idx(i), j) }"


def _softmax(x):
    e = np.exp(x - x.max(1, keepdims=True))
    return e / e.sum(1, keepdims=True)


# ------------------------------------------------------------------ pieces


def test_call_key_reads_type_shape_dtype_strides():
    a, b = np.ones((3, 4), np.float32), np.zeros((3, 4), np.float32)
    assert call_key([a, 2.0]) == call_key([b, 3.5])
    assert call_key([a]) != call_key([a.astype(np.float64)])
    assert call_key([a]) != call_key([np.ones((4, 3), np.float32).T])  # same shape, strides differ
    assert call_key([a, 2.0]) != call_key([a, np.float32(2.0)])
    assert call_key([[1.0, 2.0]]) is None


def test_needs_zero_fill_only_where_the_first_statement_covers_everything():
    fn = tc.define(SOFTMAX).ir
    sizes = {"N": 3, "D": 5}
    assert [needs_zero_fill(fn, t, sizes) for t in (*fn.outputs, *fn.temporaries)] == \
        [False, False, False, False]
    acc = tc.define(ACCUMULATE).ir
    assert needs_zero_fill(acc, acc.outputs[0], {"N": 4})  # `+=` accumulates onto zeros
    partial = tc.define("def p(float(N) x) -> (z) { z(i) = x(i) where i in 1:N }").ir
    assert needs_zero_fill(partial, partial.outputs[0], {"N": 4})
    selfread = tc.define("def s(float(N) x) -> (z) { z(i) = x(i) \n z(i) = z(i) + 1 }").ir
    assert not needs_zero_fill(selfread, selfread.outputs[0], {"N": 4})


def test_param_block_slots_are_what_the_driver_reads():
    block = ParamBlock(4)
    for k, v in enumerate((0x1000, 0x2000, 77, 0xFFFF_FFFF_0000)):
        block.values[k] = v
    assert block.slots() == [0x1000, 0x2000, 77, 0xFFFF_FFFF_0000]
    block.values[1] = 0x3000  # a call rewrites pointers in place
    assert block.slots()[1] == 0x3000
    assert ParamBlock(0).address == 0


def test_each_kernel_reads_its_own_slots_of_one_block():
    """Kernels take only the tensors and sizes they use: each has its own pointer array into
    the block's one array of values, so a call writes each pointer once."""
    block = ParamBlock(5, [(0, 2, 4), (1, 3, 4), (0, 1, 2, 3, 4), (4,)])
    for k, v in enumerate((0x1000, 0x2000, 0x3000, 9, 0xE000)):
        block.values[k] = v
    assert block.slots(0) == [0x1000, 0x3000, 0xE000]
    assert block.slots(1) == [0x2000, 9, 0xE000]
    assert block.kernel_addresses[2] == block.address  # every slot: the block's own array
    assert block.slots(3) == [0xE000]
    block.values[2] = 0x4000
    assert block.slots(0)[1] == 0x4000 and block.slots(2)[2] == 0x4000
    other = block.blank()
    assert other.layouts == block.layouts and other.slots(0) == [0, 0, 0]
    with pytest.raises(ValueError, match=r"outside 0\.\.4"):
        ParamBlock(5, [(0, 5)])


def test_stream_handle_accepts_the_libraries_streams():
    class TorchLike:
        cuda_stream = 0x1234

    class CupyLike:
        ptr = 0x5678

    class Protocol:
        def __cuda_stream__(self):
            return (0, 0x9ABC)

    assert [stream_handle(s) for s in (7, TorchLike(), CupyLike(), Protocol())] == \
        [7, 0x1234, 0x5678, 0x9ABC]
    for bad in ("stream", True, 1.5):
        with pytest.raises(CallError, match="stream="):
            stream_handle(bad)


def test_buffer_pool_reuses_per_stream(monkeypatch):
    driver, runtime = install_fake(monkeypatch)
    pool = BufferPool(runtime, 0)
    a = pool.acquire(1000, stream=5)
    assert a.nbytes == size_class(1000) == 1024
    pool.release(a, 5)
    assert pool.acquire(700, stream=6) is not a  # another stream: not ordered after a's use
    assert pool.acquire(900, stream=5) is a
    assert driver.names().count("cuMemAlloc") == 2


# ------------------------------------------------------------------ the CUDA plan, faked


@pytest.fixture(params=[False, True], ids=["cuda-python", "native"])
def native(request):
    """Both launch paths over the fake driver: cuda-python's calls, and the native launch
    thunk (`runtime.launch_thunk`, the real driver's path) calling back into the fake."""
    return request.param


def _faked(monkeypatch, source, *inputs, native=False):
    """A cuda TCFunction whose calls go to the fake driver, simulated by its host build."""
    driver, runtime = install_fake(monkeypatch, native=native)
    import tcmlir.cache.artifacts as artifacts

    monkeypatch.setattr(artifacts, "make_cuda_runner",
                        lambda image, key, device=0: CudaRunner(image, device, runtime=runtime))
    fn = tc.define(source, target="cuda")
    kernel = fn.compile(*inputs)
    host_inputs = [getattr(x, "array", x) for x in inputs]  # the fake device arrays' memory
    simulate_with_host(driver, kernel.runner.image,
                       tc.define(source, target="cpu").compile(*host_inputs))
    return fn, kernel, driver


INDEPENDENT = """def parts(float(N) A, float(N) B) -> (O0, O1, O2) {
    O0(i) = A(i) * 2.0
    O1(i) = B(i) + 1.0
    O2(i) = A(i) - B(i)
}"""


def test_each_kernel_is_launched_with_only_its_tensors(monkeypatch, rng, native):
    """Each kernel takes the tensors it reads or writes, nothing else (with every tensor of
    the function in every kernel, n independent outputs were n kernels of n + 1 parameters:
    compile and launch quadratic in n)."""
    a, b = (rng.standard_normal(50).astype(np.float32) for _ in range(2))
    da, db = device_array(a), device_array(b)
    fn, kernel, driver = _faked(monkeypatch, INDEPENDENT, da, db, native=native)
    image = kernel.runner.image
    assert sorted(k.tensors for k in image.kernels) == [("A", "B", "O2"), ("A", "O0"), ("B", "O1")]
    assert all(k.sizes == () for k in image.kernels)
    for _ in range(2):  # the warm call rewrites the same slots
        driver.calls.clear()
        o0, o1, o2 = fn(da, db)
        np.testing.assert_array_equal(o0.get(), a * 2)
        np.testing.assert_array_equal(o1.get(), b + 1)
        np.testing.assert_array_equal(o2.get(), a - b)
        (plan,) = kernel.runner.plans
        launched = [c[5] for c in driver.calls if c[0] == "cuLaunchKernel"]
        ptr = {"A": a.ctypes.data, "B": b.ctypes.data, "O0": o0.ptr, "O1": o1.ptr, "O2": o2.ptr}
        assert launched == [[*(ptr[t] for t in k.tensors), plan._err.ptr] for k in image.kernels]


def test_plan_packs_pointers_sizes_and_flag_and_launches_on_stream_0(monkeypatch, rng, native):
    x, y = (rng.standard_normal(1000).astype(np.float32) for _ in range(2))
    dx, dy = device_array(x), device_array(y)
    fn, kernel, driver = _faked(monkeypatch, ADD, dx, dy, native=native)
    z = fn(dx, dy)
    np.testing.assert_array_equal(z.get(), x + y)
    (launch,) = [c for c in driver.calls if c[0] == "cuLaunchKernel"]
    _, name, _grid, _block, stream, slots = launch
    (plan,) = kernel.runner.plans
    assert name == kernel.runner.image.kernels[0].name and stream == 0 == plan.last_stream
    # the kernel takes its tensors and the flag; N is folded into its code, not passed
    assert kernel.runner.image.kernels[0].sizes == ()
    assert slots == [x.ctypes.data, y.ctypes.data, z.ptr, plan._err.ptr]
    assert plan.block.slots() == [x.ctypes.data, y.ctypes.data, z.ptr, 1000, plan._err.ptr]
    assert z.__cuda_array_interface__["stream"] == 1  # the legacy default stream
    assert not any(c[0].startswith("cuMemset") and c[3] is not None for c in driver.calls), \
        "z's only statement sets every element: no zero fill"


def test_warm_numpy_call_allocates_nothing_and_reuses_the_plan(monkeypatch, rng, native):
    x = rng.standard_normal((7, 33)).astype(np.float32)
    fn, kernel, driver = _faked(monkeypatch, SOFTMAX, x, native=native)
    np.testing.assert_allclose(fn(x), _softmax(x), rtol=1e-5)
    driver.calls.clear()
    before = dict(cuda_memory.ALLOC_COUNTS)
    x2 = rng.standard_normal((7, 33)).astype(np.float32)
    np.testing.assert_allclose(fn(x2), _softmax(x2), rtol=1e-5)
    assert cuda_memory.ALLOC_COUNTS == before
    assert "cuMemAlloc" not in driver.names() and "cuMemFree" not in driver.names()
    assert len(kernel.runner.plans) == 1
    launches = [c for c in driver.calls if c[0] == "cuLaunchKernel"]
    assert [c[1] for c in launches] == [k.name for k in kernel.runner.image.kernels]
    # in, launches, out, and one synchronisation at the end (the numpy result is read)
    names = [n for n in driver.names() if n != "cuStreamIsCapturing"]
    assert names[0] == "cuMemcpyHtoDAsync" and names[-2:] == ["cuMemcpyDtoHAsync",
                                                              "cuStreamSynchronize"]


def test_fresh_accumulated_outputs_are_zeroed_on_the_stream(monkeypatch, rng, native):
    x = rng.standard_normal(10).astype(np.float32)
    fn, _, driver = _faked(monkeypatch, ACCUMULATE, x, native=native)
    np.testing.assert_array_equal(fn(x, stream=0x77), x)
    assert any(c[0] == "cuMemsetD32Async" and c[2] == 40 and c[3] == 0x77 for c in driver.calls)
    assert {c[4] for c in driver.calls if c[0] == "cuLaunchKernel"} == {0x77}
    assert ("cuStreamSynchronize", 0x77) in driver.calls


def test_outputs_argument_is_written_in_place(monkeypatch, rng, native):
    x = rng.standard_normal(10).astype(np.float32)
    fn, _, _ = _faked(monkeypatch, ACCUMULATE, x, native=native)
    out = np.full(10, 2.0, np.float32)
    assert fn(x, outputs=out) is out
    np.testing.assert_array_equal(out, x + 2)  # `+=` read the given values
    dev = np.full(10, 1.0, np.float32)
    fn(x, outputs=device_array(dev))
    np.testing.assert_array_equal(dev, x + 1)
    with pytest.raises(CallError, match="output z must be float32 of shape"):
        fn(x, outputs=np.zeros(9, np.float32))


def test_gather_error_raised_by_the_call_for_numpy_inputs(monkeypatch, rng):
    E = rng.standard_normal((13, 7)).astype(np.float32)
    idx = np.arange(31, dtype=np.int32) % 13
    fn, _, _ = _faked(monkeypatch, GATHER, E, idx)
    np.testing.assert_array_equal(fn(E, idx), E[idx])
    bad = idx.copy()
    bad[5] = 13
    with pytest.raises(CallError, match=r"out of bounds.*tensor E"):
        fn(E, bad)
    np.testing.assert_array_equal(fn(E, idx), E[idx])  # the flag was reset


def test_gather_error_of_device_arrays_is_reported_late_never_lost(monkeypatch, rng, native):
    E = rng.standard_normal((13, 7)).astype(np.float32)
    idx = np.arange(31, dtype=np.int32) % 13
    dE, didx = device_array(E), device_array(idx)
    fn, _, driver = _faked(monkeypatch, GATHER, dE, didx, native=native)
    fn(dE, didx)
    idx[5] = 13  # the "device" array changes under the plan, as device data does
    fn(dE, didx)  # asynchronous: this call returns
    assert "cuStreamSynchronize" not in driver.names() and "cuEventRecord" in driver.names()
    idx[5] = 3
    with pytest.raises(CallError, match=r"reported late.*TCMLIR_GATHER_CHECK=sync"):
        fn(dE, didx)  # the next call sees the failure of the previous one
    fn(dE, didx)
    fn.check_errors()  # nothing pending
    idx[5] = -1
    driver.events_ready = False  # the read has not landed: the next call does not wait
    fn(dE, didx)
    idx[5] = 3
    fn(dE, didx)
    with pytest.raises(CallError, match="out of bounds"):
        fn.check_errors()


def test_gather_check_sync_knob(monkeypatch, rng):
    E = rng.standard_normal((13, 7)).astype(np.float32)
    idx = np.arange(31, dtype=np.int32) % 13
    dE, didx = device_array(E), device_array(idx)
    fn, _, driver = _faked(monkeypatch, GATHER, dE, didx)
    monkeypatch.setenv("TCMLIR_GATHER_CHECK", "sync")
    fn(dE, didx)
    assert "cuStreamSynchronize" in driver.names()
    idx[0] = 99
    with pytest.raises(CallError, match="out of bounds") as info:
        fn(dE, didx)
    assert "reported late" not in str(info.value)


def test_graph_capture_reads_nothing_and_keeps_its_buffers(monkeypatch, rng, native):
    E = rng.standard_normal((13, 7)).astype(np.float32)
    idx = np.arange(31, dtype=np.int32) % 13
    dE, didx = device_array(E), device_array(idx)
    fn, _, driver = _faked(monkeypatch, GATHER, dE, didx, native=native)
    with pytest.raises(CallError, match=r"inside a CUDA graph capture.*once before"):
        driver.capturing.add(0x99)
        fn(dE, didx, stream=0x99)  # no plan yet: refused, nothing half-made
    kept = fn(dE, didx)
    out = device_array(np.zeros((31, 7), np.float32))
    driver.calls.clear()
    idx[2] = 50
    with pytest.raises(CallError, match=r"cannot be captured.*pass outputs="):
        fn(dE, didx, stream=0x99)
    fn(dE, didx, stream=0x99, outputs=out)  # "captured": launches only
    forbidden = {"cuStreamSynchronize", "cuCtxSynchronize", "cuEventQuery", "cuEventRecord",
                 "cuMemcpyDtoHAsync", "cuMemAlloc", "cuMemFree"}
    assert not forbidden & set(driver.names()), driver.names()
    driver.capturing.clear()
    with pytest.raises(CallError, match="out of bounds"):
        fn.check_errors()
    np.testing.assert_array_equal(kept.get(), E[np.arange(31) % 13])
    idx[2] = 2
    fn(E, idx)
    driver.capturing.add(0)
    with pytest.raises(CallError, match=r"cannot be captured.*host arrays"):
        fn(E, idx)


def test_softmax_temporaries_come_from_the_pool(monkeypatch, rng, native):
    x = rng.standard_normal((5, 9)).astype(np.float32)
    dx = device_array(x)
    fn, _, driver = _faked(monkeypatch, SOFTMAX, dx, native=native)
    np.testing.assert_allclose(fn(dx).get(), _softmax(x), rtol=1e-5)
    allocs = driver.names().count("cuMemAlloc")
    np.testing.assert_allclose(fn(dx).get(), _softmax(x), rtol=1e-5)
    # a second call allocates only its (caller-owned) output; temporaries are pooled
    assert driver.names().count("cuMemAlloc") - allocs == 1


def test_benchmark_times_the_launch_sequence_with_events(monkeypatch, rng, native):
    x = rng.standard_normal((4, 9)).astype(np.float32)
    _, kernel, driver = _faked(monkeypatch, SOFTMAX, x, native=native)
    # the fake events always measure 0.25 ms: the warm-up says 0.25 ms per call, so each
    # sample queues 4 calls back to back (a millisecond) and reports a quarter of its time
    assert kernel.benchmark(x, runs=3) == [0.25e-3 / 4] * 3
    launches = [c for c in driver.calls if c[0] == "cuLaunchKernel"]
    # warm-up, then per sample a lead call (untimed) and 4 timed calls
    assert len(launches) == (1 + 3 * (1 + 4)) * len(kernel.runner.image.kernels)
    assert len({c[5][0] for c in launches}) == 1  # one staged copy of the input, reused


# ------------------------------------------------------------------ the host plan


def test_host_fast_path_skips_binding_and_sees_knob_changes(monkeypatch, rng):
    monkeypatch.delenv("TCMLIR_ALWAYS_COMPILE", raising=False)
    fn = tc.define(ADD, target="cpu")
    x, y = np.ones(5, np.float32), np.arange(5, dtype=np.float32)
    np.testing.assert_array_equal(fn(x, y), x + y)
    import tcmlir.api as api

    def no_binding(*args):
        raise AssertionError("a cached call bound its inputs again")

    monkeypatch.setattr(api, "bind_host_inputs", no_binding)
    y2 = rng.standard_normal(5).astype(np.float32)
    np.testing.assert_array_equal(fn(x, y2), x + y2)
    monkeypatch.undo()
    monkeypatch.setenv("TCMLIR_ALWAYS_COMPILE", "1")
    before = compiler.COMPILE_COUNTS["compile_kernel"]
    fn(x, y)
    assert compiler.COMPILE_COUNTS["compile_kernel"] == before + 1


def test_host_plan_scalars_fresh_outputs_and_errors(rng):
    fn = tc.define("def sc(float(N) x, float a) -> (z) { z(i) = a * x(i) }", target="cpu")
    x = rng.standard_normal(6).astype(np.float32)
    first, second = fn(x, 2.0), fn(x, 3)
    assert first is not second
    np.testing.assert_allclose(second, 3 * x, rtol=1e-6)
    with pytest.raises(CallError, match="stream= is for target='cuda'"):
        fn(x, 2.0, stream=0)
    g = tc.define(GATHER, target="cpu")
    E = rng.standard_normal((4, 3)).astype(np.float32)
    idx = np.array([0, 3, 1], np.int32)
    np.testing.assert_array_equal(g(E, idx), E[idx])
    with pytest.raises(CallError, match="out of bounds"):
        g(E, np.array([0, 4, 1], np.int32))


# ------------------------------------------------------------------ on the GPU

def test_outputs_allocated_like_a_row_major_torch_input_only():
    torch = pytest.importorskip("torch")
    from tcmlir.dtypes import DType
    from tcmlir.runtime.arrays import ArrayKind, DeviceArrayView
    from tcmlir.runtime.launch_plan import _plain_torch_like

    def view(shape, strides, kind=ArrayKind.TORCH_CUDA, dtype=DType.FLOAT32):
        return DeviceArrayView(0, shape, dtype, strides, 0, None, kind)

    f32 = DType.FLOAT32
    assert _plain_torch_like(torch.Tensor, view((3, 5), (20, 4)), (3, 5), f32)
    assert not _plain_torch_like(torch.Tensor, view((3, 5), (4, 12)), (3, 5), f32)  # x.t()
    assert not _plain_torch_like(torch.Tensor, view((3, 5), (40, 4)), (3, 5), f32)  # a slice
    assert not _plain_torch_like(torch.Tensor, view((3, 5), (20, 4)), (5, 3), f32)
    assert not _plain_torch_like(torch.Tensor, view((3, 5), (40, 8), dtype=DType.FLOAT64), (3, 5), f32)
    assert not _plain_torch_like(torch.nn.Parameter, view((3, 5), (20, 4)), (3, 5), f32)
    assert not _plain_torch_like(torch.Tensor, view((3, 5), (20, 4), ArrayKind.CUPY), (3, 5), f32)


gpu = pytest.mark.gpu


@gpu
def test_outputs_like_an_input_are_fresh_row_major_tensors(torch_cuda):
    torch = torch_cuda
    fn = tc.define(ADD, target="cuda")
    x, y = torch.randn(1000, device="cuda"), torch.randn(1000, device="cuda")
    z1, z2 = fn(x, y), fn(x, y)
    assert z1.data_ptr() not in (x.data_ptr(), y.data_ptr(), z2.data_ptr())
    assert z1.is_contiguous() and not z1.requires_grad
    torch.testing.assert_close(z2, x + y)
    w = torch.randn(1001, device="cuda")[1:]  # 4 bytes off 16-byte alignment: its own plan
    z3 = fn(w, y)
    assert z3.data_ptr() != w.data_ptr() and z3.data_ptr() % 16 == 0
    torch.testing.assert_close(z3, w + y)


@pytest.fixture
def torch_cuda():
    torch = pytest.importorskip("torch")
    if not torch.cuda.is_available():
        pytest.skip("no CUDA device for torch")
    return torch


@gpu
def test_torch_side_stream_orders_with_the_callers_work(torch_cuda):
    torch = torch_cuda
    fn = tc.define(ADD, target="cuda")
    n = 1 << 20
    x, y = torch.randn(n, device="cuda"), torch.randn(n, device="cuda")
    fn(x, y)  # compile, load, make the plan
    side = torch.cuda.Stream()
    big = torch.randn(4096, 4096, device="cuda")
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        for _ in range(4):
            big = big @ big / 64  # long work queued before x changes
        x.mul_(0).add_(1)
        z = fn(x, y)
        (plan,) = [p for k in fn._kernels.values() for p in k.runner.plans]
        assert plan.last_stream == side.cuda_stream
    side.synchronize()
    torch.testing.assert_close(z, 1 + y)


@gpu
def test_stream_argument_and_current_stream(torch_cuda):
    torch = torch_cuda
    fn = tc.define(ADD, target="cuda")
    x, y = torch.randn(1000, device="cuda"), torch.randn(1000, device="cuda")
    fn(x, y)
    (plan,) = [p for k in fn._kernels.values() for p in k.runner.plans]
    assert plan.last_stream == torch.cuda.current_stream().cuda_stream
    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    z = fn(x, y, stream=s)
    assert plan.last_stream == s.cuda_stream
    s.synchronize()
    torch.testing.assert_close(z, x + y)
    z = fn(x, y, stream=s.cuda_stream)  # a raw handle
    s.synchronize()
    torch.testing.assert_close(z, x + y)


@gpu
def test_warm_torch_call_makes_no_driver_allocation_or_sync(torch_cuda, monkeypatch):
    torch = torch_cuda
    fn = tc.define(SOFTMAX, target="cuda")
    x = torch.randn(64, 1000, device="cuda")
    fn(x)
    from tcmlir.runtime import cuda_memory as cm
    from tcmlir.runtime import launch_plan

    before = dict(cm.ALLOC_COUNTS)
    synced = []
    monkeypatch.setattr(launch_plan.CudaPlan, "_synchronize", lambda self, h: synced.append(h))
    for _ in range(5):
        out = fn(x)
    assert cm.ALLOC_COUNTS == before and not synced
    torch.cuda.synchronize()
    torch.testing.assert_close(out, torch.softmax(x, 1), rtol=1e-5, atol=1e-6)


@gpu
def test_cuda_graph_capture_and_replay_matmul_and_softmax(torch_cuda):
    torch = torch_cuda
    mm = tc.define("def mm(float(M,K) A, float(K,N) B) -> (C) { C(m,n) +=! A(m,k) * B(k,n) }",
                   target="cuda")
    sm = tc.define(SOFTMAX, target="cuda")
    A, B = torch.randn(65, 33, device="cuda"), torch.randn(33, 47, device="cuda")
    X = torch.randn(31, 257, device="cuda")
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):  # warm-up, as torch.cuda.graph asks
        mm(A, B)
        sm(X)
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        C = mm(A, B)
        Y = sm(X)
    for _ in range(2):
        A.copy_(torch.randn_like(A))
        X.copy_(torch.randn_like(X))
        graph.replay()
        torch.cuda.synchronize()
        torch.testing.assert_close(C, A @ B, rtol=1e-4, atol=1e-4)
        torch.testing.assert_close(Y, torch.softmax(X, 1), rtol=1e-5, atol=1e-6)


TMM = "def tmm(float(M,K) A, float(N,K) B) -> (C) { C(m,n) +=! A(m,k) * B(n,k) }"


@gpu
def test_split_k_temporaries_are_kept_per_stream_and_not_in_graphs(torch_cuda):
    torch = torch_cuda
    fn = tc.define(TMM, target="cuda")  # 128 x 256 x 1024: split-K, a partial-sum temporary
    A, B = torch.randn(128, 1024, device="cuda"), torch.randn(256, 1024, device="cuda")
    fn(A, B)
    (plan,) = [p for k in fn._kernels.values() for p in k.runner.plans]
    (slot, _, _), = plan._temps
    first = fn(A, B)
    kept = plan.block.values[slot]
    second = fn(A, B)
    assert plan.block.values[slot] == kept  # reused on the stream that ordered it
    s1, s2 = torch.cuda.Stream(), torch.cuda.Stream()
    s1.wait_stream(torch.cuda.current_stream())
    s2.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s1):
        C1 = fn(A, B)
        on_s1 = plan.block.values[slot]
    with torch.cuda.stream(s2):
        C2 = fn(A * 2, B)
        assert plan.block.values[slot] not in (kept, on_s1)  # another stream, its own buffer
    with torch.cuda.stream(s1):  # warm-up on the side stream, as torch.cuda.graph asks
        fn(A, B)
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph, stream=s1):
        G = fn(A, B)
        assert plan.block.values[slot] != on_s1  # a capture takes fresh memory from its pool
    ref = A @ B.t()
    for _ in range(2):
        graph.replay()
        with torch.cuda.stream(s1):  # eager calls on the capture's stream beside the replay
            E = fn(A * 3, B)
        torch.cuda.synchronize()
        torch.testing.assert_close(G, ref, rtol=1e-4, atol=1e-3)
        torch.testing.assert_close(E, 3 * ref, rtol=1e-4, atol=3e-3)
    for got, want in ((first, ref), (second, ref), (C1, ref), (C2, 2 * ref)):
        torch.testing.assert_close(got, want, rtol=1e-4, atol=2e-3)


@gpu
def test_cupy_current_stream(rng):
    cupy = pytest.importorskip("cupy")
    fn = tc.define(ADD, target="cuda")
    x, y = cupy.arange(1000, dtype=cupy.float32), cupy.ones(1000, dtype=cupy.float32)
    fn(x, y)
    s = cupy.cuda.Stream(non_blocking=True)
    with s:
        z = fn(x, y)
        (plan,) = [p for k in fn._kernels.values() for p in k.runner.plans]
        assert plan.last_stream == s.ptr
    s.synchronize()
    assert bool(cupy.all(z == x + y))


@gpu
def test_gather_error_on_torch_inputs_is_reported(torch_cuda):
    torch = torch_cuda
    fn = tc.define(GATHER, target="cuda")
    E = torch.randn(13, 7, device="cuda")
    idx = torch.arange(31, dtype=torch.int32, device="cuda") % 13
    torch.testing.assert_close(fn(E, idx), E[idx.long()])
    idx[4] = 13
    fn(E, idx)
    with pytest.raises(CallError, match="out of bounds"):
        fn.check_errors()


def test_runtime_launch_checks_the_parameter_count_before_the_driver(monkeypatch):
    # what test_cuda_runtime's GPU test_invalid_launch_is_refused_before_the_driver asks
    import types

    from fake_cuda import H200_LIMITS, FakeContext

    from tcmlir.errors import CudaError
    from tcmlir.runtime import cuda as rcuda

    driver, _ = install_fake(monkeypatch)
    rt = rcuda.CudaRuntime()
    monkeypatch.setattr(rt, "device", lambda ordinal=0: types.SimpleNamespace(limits=H200_LIMITS))
    fn = types.SimpleNamespace(name="affine", module=types.SimpleNamespace(context=FakeContext()),
                               param_count=3, max_threads_per_block=1024, static_shared_bytes=0,
                               param_sizes=(8, 8, 8))
    buf = types.SimpleNamespace(ptr=0x1000)
    with pytest.raises(CudaError, match=r"affine.*takes 3 arguments, 2 given"):
        rt.launch(fn, (1, 1, 1), (32, 1, 1), [buf, buf])
    assert "cuLaunchKernel" not in driver.names()


def test_torch_kind_plan_over_fakes(monkeypatch, rng, native):
    # the torch path (the one the benchmark and CUDA graphs use) against a fake torch
    from fake_cuda import FakeStream, FakeTensor, install_fake_torch

    torch = install_fake_torch(monkeypatch)
    x, y = (FakeTensor(rng.standard_normal(100).astype(np.float32)) for _ in range(2))
    fn, kernel, driver = _faked(monkeypatch, ADD, x, y, native=native)
    z = fn(x, y)
    assert isinstance(z, FakeTensor)
    np.testing.assert_array_equal(z.array, x.array + y.array)
    (plan,) = kernel.runner.plans
    assert plan.last_stream == 0x51  # torch's current stream
    assert plan._torch_call is not None  # torch tensors only: the short warm path
    assert (plan._record is not None) == native  # the native launch thunk, or cuda-python's
    driver.calls.clear()
    torch.allocations.clear()
    with torch.cuda.stream(FakeStream(0x77)):
        z = fn(x, y)  # the cached path
    assert plan.last_stream == 0x77 and torch.allocations == [("empty", (100,), "float32", 0x77)]
    np.testing.assert_array_equal(z.array, x.array + y.array)
    assert driver.names() == ["cuLaunchKernel"], driver.names()  # nothing else: no sync, no alloc
    torch.allocations.clear()
    fn(x, y, stream=FakeStream(0x99))  # allocated while 0x99 is torch's current stream
    assert plan.last_stream == 0x99 and torch.allocations[0][3] == 0x99 and torch.current == 0x51
    driver.capturing.add(0x51)  # inside a capture the call just launches
    driver.calls.clear()
    np.testing.assert_array_equal(fn(x, y).array, x.array + y.array)
    assert driver.names() == ["cuLaunchKernel"]


def test_torch_warm_entry_is_guarded_by_the_call_key(monkeypatch, rng, native):
    # the first guess of a call (`torch_fast`'s entry for the latest plan) runs only for inputs
    # whose call key is its plan's, under the same knobs; anything else takes the keyed path
    from fake_cuda import FakeTensor, install_fake_torch

    from tcmlir.runtime.torch_fast import MISS

    install_fake_torch(monkeypatch)
    x, y = (FakeTensor(rng.standard_normal(64).astype(np.float32)) for _ in range(2))
    fn, _, _ = _faked(monkeypatch, ADD, x, y, native=native)
    np.testing.assert_array_equal(fn(x, y).array, x.array + y.array)
    entry = fn._fast
    assert entry is not None and "def entry(inputs)" in entry.source
    np.testing.assert_array_equal(entry((x, y)).array, x.array + y.array)
    other = FakeTensor(rng.standard_normal(65).astype(np.float32))
    double = FakeTensor(x.array.astype(np.float64))
    offset = FakeTensor(np.zeros(65, np.float32)[1:])  # 4 bytes past an aligned pointer
    strided = FakeTensor(np.zeros(128, np.float32)[::2])
    for bad in [(other, other), (double, y), (offset, y), (strided, y), (x,), (x, y, y)]:
        assert entry(bad) is MISS, bad
    np.testing.assert_array_equal(fn(offset, y).array, y.array)  # its own plan, and entry
    assert fn._fast is not entry and fn._fast((x, y)) is MISS
    np.testing.assert_array_equal(fn(x, y).array, x.array + y.array)  # the keyed path
    monkeypatch.setenv("TCMLIR_GATHER_CHECK", "sync")  # a hot knob: the guess stands down
    assert fn._fast((offset, y)) is MISS
    np.testing.assert_array_equal(fn(x, y).array, x.array + y.array)


def test_torch_warm_calls_with_two_outputs_and_temporaries(monkeypatch, rng, native):
    from fake_cuda import FakeTensor, install_fake_torch

    install_fake_torch(monkeypatch)
    two = "def two(float(N) x) -> (a, b) { t(i) = x(i) * 3 \n a(i) = t(i) + 1 \n b(i) += t(i) }"
    x = FakeTensor(rng.standard_normal(33).astype(np.float32))
    fn, _, driver = _faked(monkeypatch, two, x, native=native)
    for _ in range(3):  # the first call, then the guarded entry
        driver.calls.clear()
        a, b = fn(x)
        np.testing.assert_allclose(a.array, x.array * 3 + 1, rtol=1e-6)
        np.testing.assert_allclose(b.array, x.array * 3, rtol=1e-6)
    # t is a temporary (from torch, see the torch tests above), b is zeroed (`+=`)
    assert set(driver.names()) == {"cuMemsetD32Async", "cuLaunchKernel"}, driver.names()
    A, B = (FakeTensor(np.full(33, 1.0, np.float32)) for _ in range(2))
    assert fn(x, outputs=(A, B)) == (A, B)
    assert fn(x, outputs=[A, B]) == (A, B)  # the warm path into them
    np.testing.assert_allclose(B.array, 1 + 2 * (x.array * 3), rtol=1e-6)
    with pytest.raises(CallError, match="shares memory"):
        fn(x, outputs=(A, A))


def test_warm_torch_call_into_given_outputs(monkeypatch, rng, native):
    # outputs= with torch tensors takes the short warm path when they are exactly what the
    # kernel writes; anything else goes the full way, whose checks name the problem
    from fake_cuda import FakeTensor, install_fake_torch

    torch = install_fake_torch(monkeypatch)
    x = FakeTensor(rng.standard_normal(40).astype(np.float32))
    fn, kernel, driver = _faked(monkeypatch, ACCUMULATE, x, native=native)
    out = FakeTensor(np.full(40, 2.0, np.float32))
    assert fn(x, outputs=out) is out  # the first call: full checks, then the plan is kept
    np.testing.assert_array_equal(out.array, x.array + 2)
    (plan,) = kernel.runner.plans
    calls = []
    into = plan._torch_into
    monkeypatch.setattr(plan, "_torch_into", lambda *a: calls.append(a) or into(*a))
    fn._plans = {k: (*v[:3], plan._torch_into) for k, v in fn._plans.items()}
    driver.calls.clear()
    torch.allocations.clear()
    assert fn(x, outputs=[out]) is out
    np.testing.assert_array_equal(out.array, (x.array + 2) + x.array)  # `+=` read the given values
    assert len(calls) == 1 and torch.allocations == []
    assert driver.names() == ["cuLaunchKernel"], "no zero fill of a given output"
    # not the plan's case: the full path, with its messages
    with pytest.raises(CallError, match="must be float32 of shape"):
        fn(x, outputs=FakeTensor(np.zeros(41, np.float32)))
    with pytest.raises(CallError, match="shares memory"):
        fn(x, outputs=x)
    wide = FakeTensor(np.zeros(80, np.float32)[::2])
    with pytest.raises(CallError, match=r"not contiguous.*pass z\.contiguous\(\)"):
        fn(x, outputs=wide)
    assert len(calls) == 4 and all(a[1] is not out for a in calls[1:])


def test_native_launch_makes_the_context_current_and_names_a_failed_kernel(monkeypatch, rng):
    from fake_cuda import FakeContext, FakeTensor, install_fake_torch

    install_fake_torch(monkeypatch)
    x, y = (FakeTensor(rng.standard_normal(50).astype(np.float32)) for _ in range(2))
    fn, kernel, driver = _faked(monkeypatch, ADD, x, y, native=True)
    fn(x, y)
    FakeContext.current = 0  # another thread's view: no context current
    driver.calls.clear()
    np.testing.assert_array_equal(fn(x, y).array, x.array + y.array)
    assert FakeContext.current == FakeContext.handle  # made current, then launched once
    assert driver.names() == ["cuLaunchKernel"]
    driver.fail["cuLaunchKernel"] = 1
    name = kernel.runner.image.kernels[0].name
    with pytest.raises(CudaError, match=rf"cuLaunchKernel failed.*kernel {name} with grid"):
        fn(x, y)
    fn2, _, driver2 = _faked(monkeypatch, ACCUMULATE, x, native=True)
    np.testing.assert_array_equal(fn2(x).array, x.array)
    driver2.calls.clear()
    np.testing.assert_array_equal(fn2(x).array, x.array)  # the warm path
    assert driver2.names() == ["cuMemsetD32Async", "cuLaunchKernel"]  # the `+=` output's fill
    driver2.fail["cuMemsetD32Async"] = 1
    with pytest.raises(CudaError, match=r"cuMemsetD32Async failed.*zero-filling buffer 0"):
        fn2(x)


def test_torch_kind_temporaries_and_scalars_come_from_torch(monkeypatch, rng, native):
    from fake_cuda import FakeTensor, install_fake_torch

    torch = install_fake_torch(monkeypatch)
    x = FakeTensor(rng.standard_normal((6, 17)).astype(np.float32))
    fn, _, driver = _faked(monkeypatch, SOFTMAX, x, native=native)
    np.testing.assert_allclose(fn(x).array, _softmax(x.array), rtol=1e-5)
    before = driver.names().count("cuMemAlloc")
    torch.allocations.clear()
    np.testing.assert_allclose(fn(x).array, _softmax(x.array), rtol=1e-5)
    assert driver.names().count("cuMemAlloc") == before
    # the default (map-rows) kernel keeps softmax's temporaries on chip: only the output
    assert sorted(a[2] for a in torch.allocations) == ["float32"]
    naive = tc.MappingOptions.naive()  # one kernel per statement: temporaries in global memory
    np.testing.assert_allclose(fn(x, options=naive).array, _softmax(x.array), rtol=1e-5)
    torch.allocations.clear()
    np.testing.assert_allclose(fn(x, options=naive).array, _softmax(x.array), rtol=1e-5)
    assert sorted(a[2] for a in torch.allocations) == ["float32", "uint8", "uint8", "uint8"]
    scale = "def sc(float(N) x, float a) -> (z) { z(i) += a * x(i) }"
    v = FakeTensor(rng.standard_normal(9).astype(np.float32))
    sc, _, driver = _faked(monkeypatch, scale, v, 2.0, native=native)
    np.testing.assert_allclose(sc(v, 2.0).array, 2 * v.array, rtol=1e-6)
    torch.allocations.clear()
    np.testing.assert_allclose(sc(v, 3.0).array, 3 * v.array, rtol=1e-6)
    assert [a[0] for a in torch.allocations] == ["full", "empty"]
    assert any(c[0] == "cuMemsetD32Async" and c[3] == 0x51 for c in driver.calls)  # `+=` output


@gpu
def test_first_call_inside_a_capture_is_refused_with_advice(torch_cuda):
    torch = torch_cuda
    fn = tc.define(ADD, target="cuda")
    x, y = torch.randn(64, device="cuda"), torch.randn(64, device="cuda")
    graph = torch.cuda.CUDAGraph()
    with pytest.raises(CallError, match="once before capturing"), torch.cuda.graph(graph):
        fn(x, y)
    torch.testing.assert_close(fn(x, y), x + y)  # outside the capture it runs


def test_direct_driver_calls_only_for_the_real_driver():
    """The ctypes launch path is taken only with cuda-python's real driver module (never with
    the fake one, whose handles are not the driver's), and only where libcuda loads."""
    import types

    from tcmlir.runtime import fast_driver

    fake = types.ModuleType("fake_driver")
    assert fast_driver.direct_calls(fake) is None
    real_name = types.ModuleType("cuda.bindings.driver")
    calls = fast_driver.direct_calls(real_name)
    assert (calls is None) == (fast_driver._libcuda() is None)
    if calls is not None:  # a machine with the driver: the entry points answer
        err, _ = calls.current_context()
        assert isinstance(err, int)


@pytest.mark.gpu
def test_direct_launch_path_is_used_on_the_gpu():
    torch = pytest.importorskip("torch")
    if not torch.cuda.is_available():
        pytest.skip("no CUDA device")
    fn = tc.define("def add(float(N) x, float(N) y) -> (z) { z(i) = x(i) + y(i) }", target="cuda")
    x = torch.arange(1000, device="cuda", dtype=torch.float32)
    torch.testing.assert_close(fn(x, x), 2 * x)
    plan = fn._plans[next(iter(fn._plans))][1].__self__
    assert plan._direct is not None and plan._record is not None  # the native launch thunk
    assert all(r is not None for r in plan._fast_records)
    torch.testing.assert_close(fn(x, x + 1), 2 * x + 1)
    acc = tc.define("def acc(float(N) x) -> (z) { z(i) += x(i) }", target="cuda")
    for _ in range(3):  # the warm path's zero fill is the thunk's
        torch.testing.assert_close(acc(x), x)
