"""The CUDA runtime (runtime/cuda.py, cuda_memory.py), array interop (runtime/arrays.py) and
offline PTX checks (codegen/ptx_tools.py).

Kernels here are written by hand in LLVM IR and turned into PTX with llvmlite, so these tests
depend on no other part of the compiler. Tests marked ``gpu`` need a visible CUDA device; the
others (argument packing, launch validation, array classification, ptxas) run anywhere. The
faulting-kernel test runs last, in a subprocess, because an illegal address poisons the context.
"""

from __future__ import annotations

import math
import subprocess
import sys
import textwrap
import threading

import numpy as np
import pytest

from tcmlir.codegen.ptx_tools import find_ptxas, ptxas_check
from tcmlir.dtypes import DType
from tcmlir.errors import CallError, CodegenError, CudaError
from tcmlir.runtime import arrays
from tcmlir.runtime import cuda as rcuda
from tcmlir.runtime.arrays import ArrayKind, DeviceArrayView, HostArrayView, classify
from tcmlir.runtime.cuda import LaunchLimits, pack_kernel_args, validate_launch

_SREGS = "\n".join(f"declare i32 @llvm.nvvm.read.ptx.sreg.{r}.x()" for r in ("tid", "ctaid", "ntid"))
_INDEX = """
  %tid = call i32 @llvm.nvvm.read.ptx.sreg.tid.x()
  %bid = call i32 @llvm.nvvm.read.ptx.sreg.ctaid.x()
  %bdim = call i32 @llvm.nvvm.read.ptx.sreg.ntid.x()
  %t = zext i32 %tid to i64
  %b = zext i32 %bid to i64
  %d = zext i32 %bdim to i64
  %bd = mul i64 %b, %d
  %i = add i64 %bd, %t"""

# y[i] = 2 * x[i] + 1 for i < n
AFFINE = f"""
define ptx_kernel void @affine(ptr addrspace(1) %x, ptr addrspace(1) %y, i64 %n) {{
entry:{_INDEX}
  %in = icmp ult i64 %i, %n
  br i1 %in, label %body, label %exit
body:
  %px = getelementptr float, ptr addrspace(1) %x, i64 %i
  %v = load float, ptr addrspace(1) %px
  %v2 = fmul float %v, 2.0
  %v3 = fadd float %v2, 1.0
  %py = getelementptr float, ptr addrspace(1) %y, i64 %i
  store float %v3, ptr addrspace(1) %py
  br label %exit
exit:
  ret void
}}
"""

# y[i] = a * x[i] + (float) b for i < n, with i32 n, float a, double b: mixed parameter widths
AXPB = f"""
define ptx_kernel void @axpb(ptr addrspace(1) %x, ptr addrspace(1) %y, i32 %n, float %alpha,
                             double %beta) {{
entry:{_INDEX}
  %n64 = sext i32 %n to i64
  %in = icmp slt i64 %i, %n64
  br i1 %in, label %body, label %exit
body:
  %px = getelementptr float, ptr addrspace(1) %x, i64 %i
  %v = load float, ptr addrspace(1) %px
  %bf = fptrunc double %beta to float
  %m = fmul float %v, %alpha
  %r = fadd float %m, %bf
  %py = getelementptr float, ptr addrspace(1) %y, i64 %i
  store float %r, ptr addrspace(1) %py
  br label %exit
exit:
  ret void
}}
"""

# y[block*ntid + t] = x[block*ntid + ntid-1-t] through dynamic shared memory (n % ntid == 0)
REVERSE = f"""
@smem = external addrspace(3) global [0 x float], align 16
declare void @llvm.nvvm.barrier0()
define ptx_kernel void @reverse(ptr addrspace(1) %x, ptr addrspace(1) %y) {{
entry:{_INDEX}
  %px = getelementptr float, ptr addrspace(1) %x, i64 %i
  %v = load float, ptr addrspace(1) %px
  %ps = getelementptr [0 x float], ptr addrspace(3) @smem, i64 0, i64 %t
  store float %v, ptr addrspace(3) %ps
  call void @llvm.nvvm.barrier0()
  %last = sub i64 %d, 1
  %rt = sub i64 %last, %t
  %pr = getelementptr [0 x float], ptr addrspace(3) @smem, i64 0, i64 %rt
  %w = load float, ptr addrspace(3) %pr
  %py = getelementptr float, ptr addrspace(1) %y, i64 %i
  store float %w, ptr addrspace(1) %py
  ret void
}}
"""


def build_ptx(*kernels: str, arch: str = "sm_90") -> str:
    """PTX for hand-written NVPTX LLVM IR, through llvmlite's target machine."""
    import llvmlite.binding as llvm

    llvm.initialize_all_targets()
    llvm.initialize_all_asmprinters()
    text = 'target triple = "nvptx64-nvidia-cuda"\n' + _SREGS + "\n" + "\n".join(kernels)
    module = llvm.parse_assembly(text)
    module.verify()
    target = llvm.Target.from_triple("nvptx64-nvidia-cuda")
    machine = target.create_target_machine(cpu=arch, features="+ptx80", opt=2)
    return machine.emit_assembly(module)


H200_LIMITS = LaunchLimits(1024, (1024, 1024, 64), (2**31 - 1, 65535, 65535), 48 * 1024,
                           227 * 1024)


class FakeCudaArray:
    """Just enough of a CuPy/Numba array: the __cuda_array_interface__ dict."""

    def __init__(self, shape, typestr="<f4", strides=None, ptr=0x7F0000, **extra):
        self.__cuda_array_interface__ = {"shape": shape, "typestr": typestr, "data": (ptr, False),
                                         "version": 3, "strides": strides, **extra}


class FakeDLPackCuda:
    """A numpy array that claims, through DLPack, to live on CUDA device ``dev``."""

    def __init__(self, array, dev=0):
        self.array, self.dev = array, dev

    def __dlpack__(self, stream=None):
        return self.array.__dlpack__()

    def __dlpack_device__(self):
        return (2, self.dev)


# ------------------------------------------------------------------ no GPU needed


def test_is_available_is_a_bool_and_never_raises():
    assert isinstance(rcuda.is_available(), bool)


def test_is_available_false_when_the_driver_fails(monkeypatch):
    class BrokenDriver:
        def cuInit(self, flags):
            raise RuntimeError("libcuda.so: cannot open shared object file")

    monkeypatch.setattr(rcuda, "driver", BrokenDriver())
    rt = rcuda.CudaRuntime()
    assert rt.is_available() is False
    assert rt.device_count() == 0
    assert "libcuda" in rt.unavailable_reason
    with pytest.raises(CudaError, match="no usable CUDA GPU"):
        rt.require()


@pytest.mark.skipif(rcuda.is_available(), reason="a GPU is visible")
def test_without_gpu_loading_ptx_is_a_cuda_error():
    with pytest.raises(CudaError, match="no usable CUDA GPU"):
        rcuda.CudaRuntime().load_ptx(".version 8.0")


def _slots(packed):
    import ctypes

    pointers = (ctypes.c_void_p * len(packed.raw)).from_address(packed.address)
    return [ctypes.string_at(p, len(raw)) for p, raw in zip(pointers, packed.raw, strict=True)]


def test_kernel_args_layout_without_parameter_sizes():
    class Buf:
        ptr = 0x1234_5678_9ABC

    packed = pack_kernel_args([Buf(), 7, 2.5, np.float32(1.5), np.int32(-3), True, np.float16(1)])
    assert [len(r) for r in packed.raw] == [8, 8, 8, 4, 4, 1, 2]
    assert _slots(packed) == [
        (0x1234_5678_9ABC).to_bytes(8, "little"), (7).to_bytes(8, "little"),
        np.float64(2.5).tobytes(), np.float32(1.5).tobytes(), np.int32(-3).tobytes(), b"\x01",
        np.float16(1).tobytes()]
    assert pack_kernel_args([]).address == 0


def test_kernel_args_follow_the_kernels_parameter_sizes():
    packed = pack_kernel_args([0xABC, 0xDEF, 5, 2.0, 0.5], param_sizes=[8, 8, 4, 4, 8])
    assert packed.raw == [(0xABC).to_bytes(8, "little"), (0xDEF).to_bytes(8, "little"),
                          np.int32(5).tobytes(), np.float32(2.0).tobytes(),
                          np.float64(0.5).tobytes()]
    assert pack_kernel_args([np.int64(9)], param_sizes=[4]).raw == [np.int32(9).tobytes()]


@pytest.mark.parametrize("args, sizes, message", [
    ([1, 2], [8], "takes 1 arguments, 2 given"),
    ([2**40], [4], "does not fit"),
    ([np.float64(1.0)], [4], "float64"),
    (["text"], None, "unsupported type str"),
])
def test_kernel_args_errors(args, sizes, message):
    with pytest.raises(CudaError, match=message):
        pack_kernel_args(args, param_sizes=sizes)


def test_validate_launch_accepts_a_legal_configuration():
    validate_launch(H200_LIMITS, (100000, 3, 1), (32, 8, 4), 100 * 1024, kernel="k",
                    kernel_max_threads=1024, static_shared_bytes=1024)


@pytest.mark.parametrize("grid, block, shared, kw, message", [
    ((1, 1, 1), (2048, 1, 1), 0, {}, r"2048 threads.*limit of 1024 threads per block.*reduce"),
    ((1, 1, 1), (1, 1, 128), 0, {}, r"block dimension z = 128 exceeds .* 64"),
    ((1, 70000, 1), (32, 1, 1), 0, {}, r"grid dimension y = 70000 exceeds .* 65535"),
    ((1, 1, 1), (1024, 1, 1), 0, {"kernel_max_threads": 512}, r"at most 512 threads.*register"),
    ((1, 1, 1), (32, 1, 1), 230 * 1024, {}, r"235520 bytes of shared memory.*reduce the tile"),
    ((1, 1, 1), (32, 1, 1), 200 * 1024, {"static_shared_bytes": 40 * 1024}, "shared memory"),
])
def test_validate_launch_names_the_limit(grid, block, shared, kw, message):
    with pytest.raises(CudaError, match=message) as info:
        validate_launch(H200_LIMITS, grid, block, shared, kernel="tc_kernel", **kw)
    assert "tc_kernel" in str(info.value)


def test_classify_numpy_and_scalars():
    view = classify(np.ones((2, 3), np.float32), "A")
    assert isinstance(view, HostArrayView) and view.kind is ArrayKind.NUMPY
    assert view.shape == (2, 3) and view.dtype is DType.FLOAT32
    assert classify(np.float64(2.0)).dtype is DType.FLOAT64
    assert classify(3).shape == ()
    with pytest.raises(CallError, match="complex64 is not supported"):
        classify(np.ones(2, np.complex64), "Z")
    with pytest.raises(CallError, match=r"expected a numpy array.*builtins\.list"):
        classify([1.0, 2.0], "L")


def test_classify_cuda_array_interface():
    view = classify(FakeCudaArray((4, 5)), "X")
    assert isinstance(view, DeviceArrayView)
    assert (view.ptr, view.shape, view.dtype) == (0x7F0000, (4, 5), DType.FLOAT32)
    assert view.strides_bytes == (20, 4) and view.is_contiguous and view.nbytes == 80
    assert view.kind is ArrayKind.CUDA_ARRAY and view.device_ordinal == 0
    assert classify(FakeCudaArray((3,), "<V2")).dtype is DType.BFLOAT16
    assert classify(FakeCudaArray((3,), "|b1")).dtype is DType.BOOL
    assert classify(FakeCudaArray((3,), "<i8")).dtype is DType.INT64
    # explicit row-major strides, and strides of extent-1 dimensions, are still contiguous
    assert classify(FakeCudaArray((4, 1, 5), strides=(20, 999, 4))).is_contiguous


def test_non_contiguous_cuda_array_is_a_call_error():
    transposed = FakeCudaArray((5, 4), strides=(4, 20))
    with pytest.raises(CallError, match=r"X: the CUDA array is not contiguous.*\(4, 20\)"):
        classify(transposed, "X")
    assert not classify(transposed, "X", require_contiguous=False).is_contiguous


@pytest.mark.parametrize("cai, message", [
    ({"typestr": ">f4"}, "big-endian"),
    ({"typestr": "<c8"}, "not supported"),
    ({"mask": object()}, "masked"),
])
def test_unsupported_cuda_arrays(cai, message):
    with pytest.raises(CallError, match=message):
        classify(FakeCudaArray((3,), **cai), "X")


def test_classify_dlpack_cuda_reads_the_capsule():
    host = np.arange(6, dtype=np.int16).reshape(2, 3)
    view = classify(FakeDLPackCuda(host, dev=1), "D")
    assert view.kind is ArrayKind.DLPACK_CUDA and view.device_ordinal == 1
    assert view.ptr == host.ctypes.data
    assert (view.shape, view.dtype, view.strides_bytes) == ((2, 3), DType.INT16, (6, 2))
    strided = np.arange(12, dtype=np.float32).reshape(3, 4)[:, ::2]
    with pytest.raises(CallError, match="not contiguous"):
        classify(FakeDLPackCuda(strided), "D")


def test_bind_device_inputs_checks_without_copying():
    import tcmlir as tc

    fn = tc.define("def scale(float(N, K) A, float alpha) -> (B) { B(n, k) = alpha * A(n, k) }").ir
    bound = arrays.bind_device_inputs(fn, [FakeCudaArray((3, 4)), 2.0])
    assert bound.sizes == {"N": 3, "K": 4} and bound.kind is ArrayKind.CUDA_ARRAY
    assert bound.signature.args[0].strides == (4, 1) and bound.views["A"].ptr == 0x7F0000
    host = arrays.bind_device_inputs(fn, [np.ones((3, 4), np.float32), np.float32(2)])
    assert host.kind is ArrayKind.NUMPY and host.signature == bound.signature
    for bad, message in (([FakeCudaArray((3, 4), "<f8"), 2.0], "A must have dtype float32"),
                         ([FakeCudaArray((3, 4), strides=(4, 12)), 2.0], "not contiguous"),
                         ([FakeCudaArray((3, 4)), np.ones(2, np.float32)], "alpha"),
                         ([FakeCudaArray((3, 4))], "takes 2 input")):
        with pytest.raises(CallError, match=message):
            arrays.bind_device_inputs(fn, bad)


def test_ptxas_accepts_the_hand_written_kernels():
    if find_ptxas() is None:
        pytest.skip("ptxas not found")
    ptxas_check(build_ptx(AFFINE, AXPB, REVERSE), "sm_90")


def test_ptxas_rejects_garbage_with_its_message():
    if find_ptxas() is None:
        pytest.skip("ptxas not found")
    bad = ".version 8.0\n.target sm_90\n.address_size 64\n.visible .entry k() { bogus %r1; }\n"
    with pytest.raises(CodegenError, match=r"(?s)ptxas -arch=sm_90 rejected the PTX.*line 4"):
        ptxas_check(bad)


# ------------------------------------------------------------------ on the GPU

gpu = pytest.mark.gpu


@pytest.fixture(scope="module")
def rt():
    runtime = rcuda.get_runtime()
    if not runtime.is_available():
        pytest.skip(f"no CUDA GPU: {runtime.unavailable_reason}")
    return runtime


@pytest.fixture(scope="module")
def module(rt):
    return rt.load_ptx(build_ptx(AFFINE, AXPB, REVERSE, arch=rt.device(0).arch), name="test.ptx")


def _grid(n, block):
    return (max(1, math.ceil(n / block)), 1, 1)


@gpu
def test_device_properties(rt):
    dev = rt.device(0)
    assert rt.device_count() >= 1 and dev.name
    major, minor = dev.compute_capability
    assert dev.arch == f"sm_{major}{minor}"
    assert dev.warp_size == 32 and dev.max_threads_per_block == 1024
    assert dev.total_memory > 2**30 and dev.multiprocessor_count > 0
    assert dev.max_shared_memory_per_block_optin >= dev.max_shared_memory_per_block >= 48 * 1024
    assert rcuda.Device(0, rt).arch == dev.arch


@gpu
@pytest.mark.parametrize("n", [1, 31, 1000, 65537])
def test_affine_kernel_on_awkward_sizes(rt, module, n):
    x = np.random.default_rng(n).standard_normal(n).astype(np.float32)
    with rt.to_device(x) as dx, rt.alloc(x.nbytes) as dy:
        dy.memset(0xFF)  # poison: NaNs where the kernel writes nothing
        fn = module.function("affine")
        rt.launch(fn, _grid(n, 128), (128, 1, 1), [dx, dy, n], sync=True)
        y = dy.copy_to_host(np.empty_like(x))
    np.testing.assert_allclose(y, 2 * x + 1, rtol=1e-6)


@gpu
def test_cubin_is_kept_and_reloads(rt, module):
    assert module.cubin[:4] == b"\x7fELF" and len(module.cubin) > 100
    assert module.function("affine") is module.function("affine")
    again = rt.load_cubin(module.cubin)
    x = np.arange(77, dtype=np.float32)
    with rt.to_device(x) as dx, rt.alloc(x.nbytes) as dy:
        rt.launch(again.function("affine"), (1, 1, 1), (96, 1, 1), [dx, dy, np.int64(77)],
                  sync=True)
        np.testing.assert_array_equal(dy.copy_to_host(np.empty_like(x)), 2 * x + 1)
    with pytest.raises(CudaError, match=r"no kernel named 'nope'.*affine"):
        module.function("nope")


@gpu
def test_mixed_scalar_parameters(rt, module):
    fn = module.function("axpb")
    if fn.param_sizes is not None:
        assert fn.param_sizes == (8, 8, 4, 4, 8)
    n = 300
    x = np.linspace(-1, 1, n, dtype=np.float32)
    with rt.to_device(x) as dx, rt.alloc(x.nbytes) as dy:
        for args in ([dx, dy, np.int32(n), np.float32(3.0), np.float64(0.25)],
                     [dx, dy, n, 3.0, 0.25]):  # Python numbers sized from the kernel's params
            dy.memset(0)
            if fn.param_sizes is None and isinstance(args[3], float):
                # a driver without cuFuncGetParamInfo: Python floats are refused, not guessed
                with pytest.raises(CudaError, match="numpy scalars"):
                    rt.launch(fn, _grid(n, 64), (64, 1, 1), args, sync=True)
                continue
            rt.launch(fn, _grid(n, 64), (64, 1, 1), args, sync=True)
            np.testing.assert_allclose(dy.copy_to_host(np.empty_like(x)), 3 * x + 0.25,
                                       rtol=1e-6)


@gpu
def test_dynamic_shared_memory_beyond_48k(rt, module):
    block, blocks = 256, 7
    x = np.arange(block * blocks, dtype=np.float32)
    expected = x.reshape(blocks, block)[:, ::-1].ravel()
    fn = module.function("reverse")
    for shared in (block * 4, 100 * 1024):  # the second needs the opt-in attribute
        with rt.to_device(x) as dx, rt.alloc(x.nbytes) as dy:
            rt.launch(fn, (blocks, 1, 1), (block, 1, 1), [dx, dy], shared_bytes=shared, sync=True)
            np.testing.assert_array_equal(dy.copy_to_host(np.empty_like(x)), expected)


@gpu
def test_events_time_a_launch_on_a_stream(rt, module):
    n = 1 << 22
    stream = rt.stream()
    with rt.alloc(n * 4) as dx, rt.alloc(n * 4) as dy:
        dx.memset(0)
        start, end = rt.event().record(stream), rt.event()
        rt.launch(module.function("affine"), _grid(n, 256), (256, 1, 1), [dx, dy, n],
                  stream=stream)
        end.record(stream)
        ms = rcuda.elapsed_ms(start, end)
        stream.synchronize()
        assert 0.0 < ms < 1000.0
        assert np.all(dy.copy_to_host(np.empty(n, np.float32)) == 1.0)


@gpu
def test_launch_from_another_thread(rt, module):
    x = np.arange(50, dtype=np.float32)
    result, errors = {}, []

    def work():
        try:
            with rt.to_device(x) as dx, rt.alloc(x.nbytes) as dy:
                rt.launch(module.function("affine"), (1, 1, 1), (64, 1, 1), [dx, dy, 50],
                          sync=True)
                result["y"] = dy.copy_to_host(np.empty_like(x))
        except Exception as exc:  # noqa: BLE001 - reported by the assertion below
            errors.append(exc)

    thread = threading.Thread(target=work)
    thread.start()
    thread.join()
    assert not errors, errors
    np.testing.assert_array_equal(result["y"], 2 * x + 1)


@gpu
def test_invalid_launch_is_refused_before_the_driver(rt, module):
    with rt.alloc(4) as d:
        with pytest.raises(CudaError, match=r"affine.*block \(2048, 1, 1\).*limit of 1024"):
            rt.launch(module.function("affine"), (1, 1, 1), (2048, 1, 1), [d, d, 1])
        too_much = rt.device(0).max_shared_memory_per_block_optin + 1
        with pytest.raises(CudaError, match="shared memory"):
            rt.launch(module.function("reverse"), (1, 1, 1), (32, 1, 1), [d, d],
                      shared_bytes=too_much)
        if module.function("affine").param_sizes is not None:  # else the driver cannot tell
            with pytest.raises(CudaError, match="takes 3 arguments, 2 given"):
                rt.launch(module.function("affine"), (1, 1, 1), (32, 1, 1), [d, d])
    rt.synchronize()  # nothing was launched: the context is healthy


@gpu
def test_bad_ptx_reports_the_jit_log(rt):
    bad = ".version 8.0\n.target sm_90\n.address_size 64\n.visible .entry k() { bogus %r1; }\n"
    with pytest.raises(CudaError, match=r"(?s)cuLink.*failed.*PTX JIT log") as info:
        rt.load_ptx(bad, name="bad.ptx")
    assert "bogus" in str(info.value) or "bad.ptx" in str(info.value)


@gpu
def test_numpy_inputs_are_staged_and_outputs_copied_back(rt, module):
    x = np.arange(10, dtype=np.float32)
    view = arrays.stage_input(x, "x", runtime=rt)
    assert view.ptr != x.ctypes.data and isinstance(view.owner, rcuda.DeviceBuffer)
    out = arrays.allocate_like_kind(ArrayKind.NUMPY, (10,), DType.FLOAT32, runtime=rt)
    rt.launch(module.function("affine"), (1, 1, 1), (32, 1, 1), [view, out.view, 10], sync=True)
    y = out.finish()
    assert isinstance(y, np.ndarray)
    np.testing.assert_array_equal(y, 2 * x + 1)
    given = np.full(10, np.nan, np.float32)
    staged = arrays.stage_output(given, "y", runtime=rt)
    rt.launch(module.function("affine"), (1, 1, 1), (32, 1, 1), [view, staged.view, 10],
              sync=True)
    assert staged.finish() is given
    np.testing.assert_array_equal(given, 2 * x + 1)
    generic = arrays.allocate_like_kind(ArrayKind.CUDA_ARRAY, (10,), DType.FLOAT32, runtime=rt)
    rt.launch(module.function("affine"), (1, 1, 1), (32, 1, 1), [view, generic.view, 10],
              sync=True)
    dev = generic.finish()
    assert dev.__cuda_array_interface__["data"][0] == generic.view.ptr
    np.testing.assert_array_equal(dev.get(), 2 * x + 1)


@gpu
def test_torch_cuda_tensors_zero_copy(rt, module):
    torch = pytest.importorskip("torch")
    x = torch.arange(1000, dtype=torch.float32, device="cuda:0")
    view = arrays.stage_input(x, "x", runtime=rt)
    assert view.ptr == x.data_ptr() and view.kind is ArrayKind.TORCH_CUDA and view.owner is x
    out = arrays.allocate_like_kind(view.kind, (1000,), DType.FLOAT32, runtime=rt)
    y = out.finish()
    assert isinstance(y, torch.Tensor) and y.is_cuda and out.view.ptr == y.data_ptr()
    rt.launch(module.function("affine"), _grid(1000, 128), (128, 1, 1), [view, out.view, 1000],
              sync=True)
    assert torch.equal(y, 2 * x + 1)
    with pytest.raises(CallError, match=r"not contiguous.*\.contiguous\(\)"):
        arrays.stage_input(x.reshape(40, 25).t(), "xt", runtime=rt)
    bf = classify(torch.ones(4, 4, dtype=torch.bfloat16, device="cuda"), "b")
    assert bf.dtype is DType.BFLOAT16 and bf.strides_bytes == (8, 2)
    dl = classify(FakeDLPackTorch(x), "dl")
    assert dl.kind is ArrayKind.DLPACK_CUDA and dl.ptr == x.data_ptr()
    cpu = arrays.allocate_like_kind(ArrayKind.TORCH_CPU, (1000,), DType.FLOAT32, runtime=rt)
    rt.launch(module.function("affine"), _grid(1000, 128), (128, 1, 1), [view, cpu.view, 1000],
              sync=True)
    assert torch.equal(cpu.finish(), (2 * x + 1).cpu())


@gpu
def test_bound_inputs_stage_device_arrays_in_place(rt):
    torch = pytest.importorskip("torch")
    import tcmlir as tc

    fn = tc.define("def scale(float(N, K) A, float alpha) -> (B) { B(n, k) = alpha * A(n, k) }").ir
    a = torch.ones(3, 4, device="cuda")
    staged = arrays.bind_device_inputs(fn, [a, 2.0]).staged(rt)
    assert staged["A"].ptr == a.data_ptr()
    assert staged["alpha"].shape == () and staged["alpha"].nbytes == 4
    host = np.ones((3, 4), np.float32)
    copied = arrays.bind_device_inputs(fn, [host, 2.0]).staged(rt)["A"]
    assert isinstance(copied.owner, rcuda.DeviceBuffer) and copied.ptr != host.ctypes.data


class FakeDLPackTorch:
    """Hides a torch tensor behind DLPack only (no torch or CUDA-array-interface path)."""

    def __init__(self, tensor):
        self.tensor = tensor

    def __dlpack__(self, stream=None):
        return self.tensor.__dlpack__(stream=stream)

    def __dlpack_device__(self):
        return self.tensor.__dlpack_device__()


@gpu
def test_cupy_arrays_zero_copy(rt, module):
    cupy = pytest.importorskip("cupy")
    x = cupy.arange(500, dtype=cupy.float32)
    view = arrays.stage_input(x, "x", runtime=rt)
    assert view.ptr == x.data.ptr and view.kind is ArrayKind.CUPY
    out = arrays.allocate_like_kind(view.kind, (500,), DType.FLOAT32, runtime=rt)
    rt.launch(module.function("affine"), _grid(500, 128), (128, 1, 1), [view, out.view, 500],
              sync=True)
    y = out.finish()
    assert isinstance(y, cupy.ndarray)
    assert bool(cupy.all(y == 2 * x + 1))
    with pytest.raises(CallError, match="not contiguous"):
        classify(x.reshape(20, 25).T, "xt")


_FAULT_SCRIPT = textwrap.dedent("""
    import sys
    import numpy as np
    from tcmlir.errors import CudaError
    from tcmlir.runtime.cuda import get_runtime
    rt = get_runtime()
    module = rt.load_ptx(open(sys.argv[1]).read())
    x = rt.to_device(np.ones(4096, np.float32))
    try:
        rt.launch(module.function("affine"), (16, 1, 1), (256, 1, 1), [x, 0, 4096], sync=True)
    except CudaError as exc:
        print("CudaError:", exc)
    else:
        print("no error")
""")


@gpu
def test_zz_faulting_kernel_is_named_in_a_subprocess(rt, tmp_path):
    # last in the file: an illegal address poisons the context, so it runs in its own process
    ptx = tmp_path / "affine.ptx"
    ptx.write_text(build_ptx(AFFINE, arch=rt.device(0).arch))
    done = subprocess.run([sys.executable, "-c", _FAULT_SCRIPT, str(ptx)], capture_output=True,
                          text=True, timeout=120, check=False)
    output = done.stdout + done.stderr
    assert "CudaError:" in output, output
    assert "kernel affine" in output and "grid (16, 1, 1)" in output, output
    assert "ILLEGAL_ADDRESS" in output or "illegal" in output.lower(), output
