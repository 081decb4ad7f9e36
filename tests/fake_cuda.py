"""A fake CUDA driver for testing the launch path without a GPU (used by test_launch_plan.py).

"Device" memory is host memory, so copies and memsets really move bytes; ``cuLaunchKernel``
records what the driver would read (function, grid, block, stream and the parameter slots,
read through the ``void**`` array) and, when a simulator is installed, runs the program's
*host* build on the same pointers — so a CUDA plan's staging, zero fills, copies back and
gather flag handling are checked end to end against real results. Every call is logged in
order in ``FakeDriver.calls``.
"""

from __future__ import annotations

import ctypes
import enum
import re
import types
import zlib
from typing import Any, ClassVar

import numpy as np

from tcmlir.runtime import cuda as rcuda
from tcmlir.runtime import cuda_launch, cuda_memory, launch_call, launch_plan, streams
from tcmlir.runtime.cuda import LaunchLimits
from tcmlir.runtime.host import ErrorSlot

H200_LIMITS = LaunchLimits(1024, (1024, 1024, 64), (2**31 - 1, 65535, 65535), 48 * 1024,
                           227 * 1024)


class CUresult(enum.IntEnum):
    CUDA_SUCCESS = 0
    CUDA_ERROR_INVALID_VALUE = 1
    CUDA_ERROR_NOT_READY = 600
    CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED = 900


class CUstreamCaptureStatus(enum.IntEnum):
    CU_STREAM_CAPTURE_STATUS_NONE = 0
    CU_STREAM_CAPTURE_STATUS_ACTIVE = 1


class CUstream:
    def __init__(self, value: int = 0):
        self.value = int(value)

    def __int__(self) -> int:
        return self.value


_OK = (CUresult.CUDA_SUCCESS,)


class FakeDriver:
    CUresult = CUresult
    CUstreamCaptureStatus = CUstreamCaptureStatus
    CUstream = CUstream
    CUevent_flags = types.SimpleNamespace(CU_EVENT_DISABLE_TIMING=types.SimpleNamespace(value=2),
                                          CU_EVENT_DEFAULT=types.SimpleNamespace(value=0))

    def __init__(self) -> None:
        self.calls: list[tuple] = []
        self.memory: dict[int, Any] = {}
        self.capturing: set[int] = set()
        self.events_ready = True
        self.params: dict[Any, int] = {}  # function handle -> parameter count
        self.simulate = None  # callable(name, slots) run by cuLaunchKernel

    def names(self) -> list[str]:
        return [c[0] for c in self.calls]

    def _new(self, nbytes: int) -> int:
        buf = (ctypes.c_char * max(1, nbytes))()
        address = ctypes.addressof(buf)
        self.memory[address] = buf
        return address

    # memory
    def cuMemAlloc(self, nbytes):
        self.calls.append(("cuMemAlloc", nbytes))
        return CUresult.CUDA_SUCCESS, self._new(nbytes)

    def cuMemFree(self, ptr):
        self.calls.append(("cuMemFree", int(ptr)))
        self.memory.pop(int(ptr), None)
        return _OK

    def cuMemHostAlloc(self, nbytes, flags):
        self.calls.append(("cuMemHostAlloc", nbytes))
        return CUresult.CUDA_SUCCESS, self._new(nbytes)

    def cuMemFreeHost(self, ptr):
        self.calls.append(("cuMemFreeHost", int(ptr)))
        return _OK

    def _memset(self, name, ptr, value, count, width, stream=None):
        self.calls.append((name, int(ptr), count * width, stream))
        assert value == 0
        ctypes.memset(int(ptr), 0, count * width)
        return _OK

    def cuMemsetD32Async(self, ptr, value, count, stream):
        return self._memset("cuMemsetD32Async", ptr, value, count, 4, int(stream))

    def cuMemsetD8Async(self, ptr, value, count, stream):
        return self._memset("cuMemsetD8Async", ptr, value, count, 1, int(stream))

    def cuMemsetD32(self, ptr, value, count):
        return self._memset("cuMemsetD32", ptr, value, count, 4)

    def cuMemsetD8(self, ptr, value, count):
        return self._memset("cuMemsetD8", ptr, value & 0xFF, count, 1) if value == 0 else _OK

    def _copy(self, name, dst, src, nbytes, stream=None):
        self.calls.append((name, nbytes, stream))
        ctypes.memmove(int(dst), int(src), nbytes)
        return _OK

    def cuMemcpyHtoDAsync(self, dst, src, nbytes, stream):
        return self._copy("cuMemcpyHtoDAsync", dst, src, nbytes, int(stream))

    def cuMemcpyDtoHAsync(self, dst, src, nbytes, stream):
        return self._copy("cuMemcpyDtoHAsync", dst, src, nbytes, int(stream))

    def cuMemcpyHtoD(self, dst, src, nbytes):
        return self._copy("cuMemcpyHtoD", dst, src, nbytes)

    def cuMemcpyDtoH(self, dst, src, nbytes):
        return self._copy("cuMemcpyDtoH", dst, src, nbytes)

    def CUdeviceptr(self, value):
        return int(value)

    # streams, events, synchronisation
    def cuStreamIsCapturing(self, stream):
        self.calls.append(("cuStreamIsCapturing", int(stream)))
        status = (CUstreamCaptureStatus.CU_STREAM_CAPTURE_STATUS_ACTIVE if int(stream) in
                  self.capturing else CUstreamCaptureStatus.CU_STREAM_CAPTURE_STATUS_NONE)
        return CUresult.CUDA_SUCCESS, status

    def cuStreamSynchronize(self, stream):
        self.calls.append(("cuStreamSynchronize", int(stream)))
        return _OK

    def cuCtxSynchronize(self):
        self.calls.append(("cuCtxSynchronize",))
        return _OK

    def cuEventCreate(self, flags):
        self.calls.append(("cuEventCreate", flags))
        return CUresult.CUDA_SUCCESS, object()

    def cuEventRecord(self, event, stream):
        self.calls.append(("cuEventRecord", int(stream)))
        return _OK

    def cuEventQuery(self, event):
        self.calls.append(("cuEventQuery",))
        return (CUresult.CUDA_SUCCESS,) if self.events_ready else (CUresult.CUDA_ERROR_NOT_READY,)

    def cuEventDestroy(self, event):
        return _OK

    def cuEventSynchronize(self, event):
        self.calls.append(("cuEventSynchronize",))
        return _OK

    def cuEventElapsedTime(self, start, end):
        return CUresult.CUDA_SUCCESS, 0.25

    def cuGetErrorName(self, err):
        return CUresult.CUDA_SUCCESS, CUresult(err).name.encode()

    def cuGetErrorString(self, err):
        return CUresult.CUDA_SUCCESS, b"fake driver error"

    # launching
    def cuLaunchKernel(self, f, gx, gy, gz, bx, by, bz, shared, stream, params, extra):
        count = self.params[f]
        pointers = (ctypes.c_void_p * count).from_address(params)
        slots = [ctypes.c_uint64.from_address(p).value for p in pointers]
        self.last_flag_slot = pointers[-1] if count else None  # (`block_slots`)
        self.calls.append(("cuLaunchKernel", f, (gx, gy, gz), (bx, by, bz), int(stream), slots))
        if self.simulate is not None:
            self.simulate(f, slots)
        return _OK


class FakeContext:
    ordinal = 0
    handle = 0xC7  # what the native fake's cuCtxGetCurrent compares (see `install_fake`)
    current = 0xC7  # the "current context" of every thread
    _released = False

    def activate(self) -> None:
        FakeContext.current = self.handle


class _FunctionHandle(str):
    """A fake CUfunction: the kernel's name, and an integer for the native launch thunk."""

    ids: ClassVar[dict[int, str]] = {}

    def __int__(self) -> int:
        key = 0x1000 + zlib.crc32(self.encode())
        self.ids[key] = str(self)
        return key


class FakeFunction:
    def __init__(self, name: str, count: int):
        self.name = name
        self.handle = _FunctionHandle(name)
        self.param_count = count
        self.max_threads_per_block = 1024
        self.static_shared_bytes = 0


class FakeModule:
    """The kernels of a PTX text, with their parameter counts read from the PTX itself."""

    def __init__(self, driver: FakeDriver, ptx: str):
        self.context = FakeContext()
        self.cubin = b""
        self._driver = driver
        self.counts = {m.group(1): m.group(2).count(".param")
                       for m in re.finditer(r"\.entry\s+([\w$.]+)\s*\(([^)]*)\)", ptx)}

    def function(self, name: str) -> FakeFunction:
        count = self.counts[name]
        self._driver.params[name] = count
        return FakeFunction(name, count)


class FakeRuntime:
    """What `CudaPlan` and `CudaRunner` use of a `CudaRuntime`, over the fake driver."""

    def __init__(self, driver: FakeDriver):
        self.driver = driver
        self._last_launch: dict[int, Any] = {}
        self._pools: dict[int, Any] = {}
        self.context_ = FakeContext()

    def device(self, ordinal: int = 0) -> Any:
        return types.SimpleNamespace(limits=H200_LIMITS, arch="sm_90")

    def context(self, device: int = 0) -> FakeContext:
        return self.context_

    def pool(self, device: int = 0) -> Any:
        return rcuda.CudaRuntime.pool(self, device)  # type: ignore[arg-type]

    @property
    def _lock(self) -> Any:
        import threading

        return threading.RLock()

    def alloc(self, nbytes: int, device: int = 0) -> cuda_memory.DeviceBuffer:
        return cuda_memory.DeviceBuffer(self.context_, nbytes)

    def pinned(self, nbytes: int, device: int = 0) -> cuda_memory.PinnedHostBuffer:
        return cuda_memory.PinnedHostBuffer(self.context_, nbytes)

    def load_ptx(self, ptx: str, device: int = 0, name: str = "") -> FakeModule:
        return FakeModule(self.driver, ptx)

    def to_device(self, array: np.ndarray, device: int = 0) -> cuda_memory.DeviceBuffer:
        buf = self.alloc(array.nbytes, device)
        buf.copy_from_host(np.ascontiguousarray(array))
        return buf

    def event(self, device: int = 0) -> cuda_memory.Event:
        return cuda_memory.Event(self.context_)

    def pointer_device(self, ptr: int) -> int:
        return 0


def install_fake(monkeypatch: Any, native: bool = False) -> tuple[FakeDriver, FakeRuntime]:
    """Route every driver call of the launch path to a fresh fake; returns (driver, runtime).

    ``native``: plans take the native launch path (`launch_thunk`) as with the real driver;
    its four driver entry points are ctypes callbacks into the fake."""
    driver = FakeDriver()
    for module in (cuda_memory, rcuda, cuda_launch, launch_call, launch_plan, streams):
        monkeypatch.setattr(module, "driver", driver)
    runtime = FakeRuntime(driver)
    monkeypatch.setattr(cuda_launch, "get_runtime", lambda: runtime)
    FakeContext.current = FakeContext.handle
    if native:
        calls = native_calls(driver)
        monkeypatch.setattr(launch_plan, "direct_calls", lambda _driver: calls)
    return driver, runtime


# the driver entry points' C types (what `launch_thunk` calls)
GET_CURRENT_T = ctypes.CFUNCTYPE(ctypes.c_int, ctypes.POINTER(ctypes.c_void_p))
LAUNCH_T = ctypes.CFUNCTYPE(ctypes.c_int, ctypes.c_void_p, *[ctypes.c_uint] * 7, ctypes.c_void_p,
                            ctypes.c_void_p, ctypes.c_void_p)
MEMSET32_T = ctypes.CFUNCTYPE(ctypes.c_int, ctypes.c_uint64, ctypes.c_uint, ctypes.c_size_t,
                              ctypes.c_void_p)
MEMSET8_T = ctypes.CFUNCTYPE(ctypes.c_int, ctypes.c_uint64, ctypes.c_ubyte, ctypes.c_size_t,
                             ctypes.c_void_p)


def native_calls(driver: FakeDriver) -> Any:
    """A `fast_driver.DirectCalls` whose entry points (C function pointers) call ``driver``;
    ``driver.fail`` (a call name → CUresult code) makes that call fail."""
    from tcmlir.runtime.fast_driver import DirectCalls

    driver.fail = {}

    def get_current(out):
        out[0] = int(FakeContext.current) or None
        return driver.fail.get("cuCtxGetCurrent", 0)

    def launch(f, gx, gy, gz, bx, by, bz, shared, stream, params, extra):
        if "cuLaunchKernel" in driver.fail:
            return driver.fail["cuLaunchKernel"]
        driver.cuLaunchKernel(_FunctionHandle.ids[f], gx, gy, gz, bx, by, bz, shared,
                              CUstream(stream or 0), params, extra)
        return 0

    def memset(name):
        def fill(ptr, value, count, stream):
            if name in driver.fail:
                return driver.fail[name]
            getattr(driver, name)(ptr, value, count, CUstream(stream or 0))
            return 0
        return fill

    keep = (GET_CURRENT_T(get_current), LAUNCH_T(launch), MEMSET32_T(memset("cuMemsetD32Async")),
            MEMSET8_T(memset("cuMemsetD8Async")))
    calls = DirectCalls(None, None, None, tuple(ctypes.cast(f, ctypes.c_void_p).value
                                                for f in keep))
    object.__setattr__(calls, "_keep", keep)  # the callbacks live as long as the calls
    return calls


def device_array(host: np.ndarray) -> Any:
    """A CUDA-array-interface object whose "device" memory is ``host``'s (the fake's model)."""
    from tcmlir.dtypes import DType
    from tcmlir.runtime.arrays import typestr

    class FakeDeviceArray:
        def __init__(self, array: np.ndarray):
            self.array = array
            self.__cuda_array_interface__ = {
                "shape": array.shape, "typestr": typestr(DType.from_numpy(array.dtype)),
                "data": (array.ctypes.data, False), "version": 3, "strides": None}

    return FakeDeviceArray(host)


class FakeDLPackCuda:
    """A numpy array that claims, through DLPack, to live on CUDA device ``dev`` (its capsule
    points at the array's memory: the fake driver's device memory is host memory)."""

    def __init__(self, array: np.ndarray, dev: int = 0):
        self.array, self.dev = array, dev

    def __dlpack__(self, stream: Any = None) -> Any:
        return self.array.__dlpack__()

    def __dlpack_device__(self) -> tuple[int, int]:
        return (2, self.dev)


# ---------------------------------------------------------------- a fake torch (CUDA tensors)


class _TorchDType:
    def __init__(self, name: str):
        self.name, self.numpy = name, np.dtype(name)

    def __repr__(self) -> str:
        return f"torch.{self.name}"

    __str__ = __repr__


class _TorchDevice(tuple):
    @property
    def type(self) -> str:
        return self[0]

    @property
    def index(self) -> int:
        return self[1]


class FakeTensor:
    """A "CUDA" tensor whose memory is a numpy array (the fake driver's device memory)."""

    def __init__(self, array: np.ndarray, index: int = 0):
        self.array = array
        self.shape = tuple(array.shape)
        self.dtype = FakeTorch.dtypes[array.dtype.name]
        self.device = _TorchDevice(("cuda", index))

    def stride(self) -> tuple[int, ...]:
        return tuple(s // self.array.itemsize for s in self.array.strides)

    def data_ptr(self) -> int:
        return self.array.ctypes.data

    def get_device(self) -> int:
        return self.device.index


FakeTensor.__module__ = "torch"  # what tcmlir recognises torch tensors by


class FakeStream:
    def __init__(self, handle: int):
        self.cuda_stream = handle


class FakeTorch(types.ModuleType):
    """``torch`` as far as the launch path uses it: current raw stream, empty, full, streams."""

    dtypes: ClassVar[dict[str, _TorchDType]] = {n: _TorchDType(n) for n in ("float32", "float64", "int32", "int64", "uint8")}
    Tensor = FakeTensor

    def __init__(self) -> None:
        super().__init__("torch")
        self.current = 0x51
        self.allocations: list[tuple] = []
        for name, dt in self.dtypes.items():
            setattr(self, name, dt)
        fake = self

        class Ctx:
            def __init__(self, stream: FakeStream):
                self.stream, self.saved = stream, None

            def __enter__(self):
                self.saved, fake.current = fake.current, self.stream.cuda_stream

            def __exit__(self, *exc):
                fake.current = self.saved

        self._C = types.SimpleNamespace(_cuda_getCurrentRawStream=lambda index: self.current)
        self.cuda = types.SimpleNamespace(Stream=FakeStream, stream=Ctx,
                                          ExternalStream=lambda h, device=None: FakeStream(h))

    def device(self, kind: str, index: int) -> _TorchDevice:
        return _TorchDevice((kind, index))

    def empty(self, shape, dtype, device):
        self.allocations.append(("empty", tuple(shape), dtype.name, self.current))
        return FakeTensor(np.full(shape, np.nan if dtype.numpy.kind == "f" else 7, dtype.numpy),
                          device.index)

    def full(self, shape, value, dtype, device):
        self.allocations.append(("full", tuple(shape), dtype.name, self.current))
        return FakeTensor(np.full(shape, value, dtype.numpy), device.index)


def install_fake_torch(monkeypatch: Any) -> FakeTorch:
    import sys

    torch = FakeTorch()
    monkeypatch.setitem(sys.modules, "torch", torch)
    return torch


_LO, _HI = -(2**62), 2**62  # host ABI: "no bound" for a group's chunk


def block_slots(driver: FakeDriver, image: Any) -> list[int]:
    """Every slot of the `ParamBlock` the latest launch read (the function's tensors in
    ``image.arg_order``, its sizes in ``image.sizes_order``, the error flag), whichever of them
    the kernel takes: a block keeps its slots in one array, and every kernel's last parameter
    is the flag, the block's last slot."""
    count = len(image.arg_order) + len(image.sizes_order) + 1
    base = driver.last_flag_slot - 8 * (count - 1)
    return [ctypes.c_uint64.from_address(base + 8 * k).value for k in range(count)]


def kernel_slots(image: Any, name: str, slots: list[int]) -> dict[str, int]:
    """The parameters a launch of kernel ``name`` of ``image`` passed, by tensor or size name
    (``"err"``: the flag)."""
    (k,) = [k for k in image.kernels if k.name == name]
    return dict(zip((*k.tensors, *k.sizes, "err"), slots, strict=True))


def simulate_with_host(driver: FakeDriver, image: Any, host_kernel: Any) -> None:
    """Make the fake's launches run ``host_kernel`` (the same program compiled for the host)
    on the pointers and sizes the plan packed, when the program's last kernel is launched; a
    failed gather check lands in the error flag the way the device code reports it."""
    n_tensors, n_sizes = len(image.arg_order), len(image.sizes_order)
    last = image.kernels[-1].name

    fn = host_kernel.function.ir
    on_chip = set(getattr(image, "on_chip", ()))

    def run(name: str, launched: list[int]) -> None:
        if name != last:
            return
        slots = block_slots(driver, image)
        tensors = list(slots[:n_tensors])
        scratch = []  # temporaries the device keeps on chip get no buffer; the host needs one
        values = dict(zip(image.sizes_order, slots[n_tensors:n_tensors + n_sizes], strict=True))
        for k, tname in enumerate(image.arg_order):
            if tname in on_chip and not tensors[k]:
                t = fn.tensor(tname)
                count = 1
                for e in t.shape:
                    count *= e.evaluate({**values, **dict(image.sizes)})
                scratch.append(np.zeros(max(1, count * t.dtype.itemsize), np.uint8))
                tensors[k] = scratch[-1].ctypes.data
        ptrs = (ctypes.c_void_p * max(1, n_tensors))(*tensors)
        sizes = (ctypes.c_int64 * max(1, n_sizes))(*slots[n_tensors:n_tensors + n_sizes])
        for entry in host_kernel.runner.entries:
            err = ErrorSlot()  # the host ABI's err (the device's is only the i32 code)
            entry.call(ptrs, sizes, _LO, _HI, ctypes.byref(err))
            if err.code:
                ctypes.c_int32.from_address(slots[-1]).value = err.code
                return

    driver.simulate = run
