"""Lowest layer of the CUDA runtime: the driver binding, checked calls, and driver resources.

Everything here goes through ``cuda.bindings.driver`` (``cuda.cuda`` on older cuda-python).
`check` turns a driver result tuple into its values or a `CudaError` that names the call and
the error (``cuGetErrorName`` / ``cuGetErrorString``). The classes own one driver resource each
and are bound to a `PrimaryContext`, which they make current before every call, so they work
from any thread: `DeviceBuffer` (device memory), `Stream`, `Event`. They are created through
`tcmlir.runtime.cuda.CudaRuntime`, which owns the contexts. `PinnedHostBuffer` is page-locked
host memory (what an asynchronous device-to-host read lands in). `KernelArgs` lays out kernel
parameters in host memory the way ``cuLaunchKernel`` reads them.

``ALLOC_COUNTS`` counts the driver allocations and frees made here (``cuMemAlloc``,
``cuMemFree``, ``cuMemHostAlloc``, ``cuMemFreeHost``): a test hook, read by the tests that a
warm call allocates nothing.
"""

from __future__ import annotations

import ctypes
import struct
import threading
from collections.abc import Sequence
from typing import Any

import numpy as np

from ..errors import CudaError

try:  # cuda-python >= 12.x
    from cuda.bindings import driver
except ImportError:  # pragma: no cover - depends on the installed cuda-python
    try:
        from cuda import cuda as driver  # type: ignore[no-redef]  # cuda-python 11.x / early 12
    except ImportError:
        driver = None  # type: ignore[assignment]

__all__ = [
    "ALLOC_COUNTS",
    "DeviceBuffer",
    "Event",
    "KernelArgs",
    "PinnedHostBuffer",
    "PrimaryContext",
    "Stream",
    "check",
    "driver",
    "elapsed_ms",
    "error_text",
    "host_bytes",
    "pack_kernel_args",
]


ALLOC_COUNTS: dict[str, int] = {"cuMemAlloc": 0, "cuMemFree": 0, "cuMemHostAlloc": 0,
                                 "cuMemFreeHost": 0}


def error_text(err: Any) -> str:
    """``NAME: description`` of a CUresult, as the driver spells them."""
    name = desc = None
    try:
        res, raw = driver.cuGetErrorName(err)
        if res == driver.CUresult.CUDA_SUCCESS and raw:
            name = raw.decode(errors="replace")
        res, raw = driver.cuGetErrorString(err)
        if res == driver.CUresult.CUDA_SUCCESS and raw:
            desc = raw.decode(errors="replace")
    except Exception:  # noqa: BLE001 - driver gone (interpreter shutdown) or unknown code
        pass
    if name is None:
        name = getattr(err, "name", None) or f"CUresult {int(err)}"
    return f"{name}: {desc}" if desc else name


def check(result: Any, what: str, context: str | None = None) -> Any:
    """The values of a driver call's result tuple; a CudaError naming ``what`` if it failed.

    ``result`` is what a ``cuda.bindings.driver`` function returns: ``(CUresult, *values)``.
    Returns None when there is no value, the value when there is one, else the tuple of values.
    ``context`` is appended to the message (a kernel name and its launch configuration, say).
    """
    if isinstance(result, tuple):
        err, values = result[0], result[1:]
    else:
        err, values = result, ()
    if err != driver.CUresult.CUDA_SUCCESS:
        message = f"CUDA driver call {what} failed: {error_text(err)}"
        if context:
            message += f" ({context})"
        raise CudaError(message)
    if not values:
        return None
    return values[0] if len(values) == 1 else values


def _require_driver() -> None:
    if driver is None:
        raise CudaError(
            "cuda-python is not installed, so the CUDA runtime is unavailable "
            "(pip install cuda-python, or use target='cpu')"
        )


class PrimaryContext:
    """The retained primary context of one device; `activate` makes it current on this thread."""

    def __init__(self, ordinal: int):
        _require_driver()
        self.ordinal = ordinal
        self.device = check(driver.cuDeviceGet(ordinal), f"cuDeviceGet({ordinal})")
        self.handle = check(driver.cuDevicePrimaryCtxRetain(self.device),
                            f"cuDevicePrimaryCtxRetain(device {ordinal})")
        self._lock = threading.Lock()
        self._released = False
        from .fast_driver import direct_calls

        self._direct = direct_calls(driver)
        self._address = int(self.handle) if self._direct is not None else None

    def activate(self) -> None:
        """Make this context current on the calling thread (cheap when it already is)."""
        if self._released:
            raise CudaError(f"the CUDA context of device {self.ordinal} was already released")
        if self._direct is not None:  # the warm-call check, straight into libcuda
            err, address = self._direct.current_context()
            if err == 0 and address == self._address:
                return
        current = check(driver.cuCtxGetCurrent(), "cuCtxGetCurrent")
        if current is None or int(current) != int(self.handle):
            check(driver.cuCtxSetCurrent(self.handle), f"cuCtxSetCurrent(device {self.ordinal})")

    def synchronize(self) -> None:
        self.activate()
        check(driver.cuCtxSynchronize(), f"cuCtxSynchronize(device {self.ordinal})")

    def release(self) -> None:
        with self._lock:
            if self._released:
                return
            self._released = True
        check(driver.cuDevicePrimaryCtxRelease(self.device),
              f"cuDevicePrimaryCtxRelease(device {self.ordinal})")


def _host_address(array: np.ndarray, what: str) -> int:
    if not isinstance(array, np.ndarray):
        raise CudaError(f"{what}: expected a numpy array, got {type(array).__name__}")
    if not array.flags.c_contiguous:
        raise CudaError(f"{what}: the host array is not C-contiguous (use np.ascontiguousarray)")
    return int(array.ctypes.data)


class DeviceBuffer:
    """``nbytes`` of device memory (``cuMemAlloc``), freed by `close`, ``with``, or collection.

    ``ptr`` is the device address as an int (0 for an empty buffer, which allocates nothing).
    Copies without a stream are synchronous; with one they are queued on it, and the host array
    must then stay alive until the stream is synchronized.
    """

    def __init__(self, context: PrimaryContext, nbytes: int):
        if nbytes < 0:
            raise CudaError(f"cannot allocate a negative number of bytes ({nbytes})")
        self.context = context
        self.nbytes = int(nbytes)
        self.ptr = 0
        if self.nbytes:
            context.activate()
            dptr = check(driver.cuMemAlloc(self.nbytes),
                         f"cuMemAlloc({self.nbytes} bytes on device {context.ordinal})")
            ALLOC_COUNTS["cuMemAlloc"] += 1
            self.ptr = int(dptr)

    @property
    def device_ordinal(self) -> int:
        return self.context.ordinal

    def _span(self, nbytes: int, what: str) -> None:
        if self.ptr == 0 and self.nbytes == 0 and nbytes == 0:
            return
        if self.ptr == 0:
            raise CudaError(f"{what}: the device buffer was already freed")
        if nbytes > self.nbytes:
            raise CudaError(f"{what}: {nbytes} bytes do not fit in a buffer of {self.nbytes} bytes")

    def copy_from_host(self, array: np.ndarray, stream: Stream | None = None) -> None:
        """Copy a C-contiguous numpy array to the start of this buffer."""
        src = _host_address(array, "copy_from_host")
        self._span(array.nbytes, "copy_from_host")
        if array.nbytes == 0:
            return
        self.context.activate()
        dst = driver.CUdeviceptr(self.ptr)
        if stream is None:
            check(driver.cuMemcpyHtoD(dst, src, array.nbytes), f"cuMemcpyHtoD({array.nbytes} bytes)")
        else:
            check(driver.cuMemcpyHtoDAsync(dst, src, array.nbytes, stream.handle),
                  f"cuMemcpyHtoDAsync({array.nbytes} bytes)")

    def copy_to_host(self, array: np.ndarray, stream: Stream | None = None) -> np.ndarray:
        """Copy the start of this buffer into a C-contiguous numpy array; returns the array."""
        dst = _host_address(array, "copy_to_host")
        if not array.flags.writeable:
            raise CudaError("copy_to_host: the host array is read-only")
        self._span(array.nbytes, "copy_to_host")
        if array.nbytes:
            self.copy_to_address(dst, array.nbytes, stream)
        return array

    def copy_to_address(self, host_address: int, nbytes: int, stream: Stream | None = None) -> None:
        """Copy ``nbytes`` to raw host memory (for host tensors numpy cannot describe, e.g. bf16)."""
        self._span(nbytes, "copy_to_address")
        if nbytes == 0:
            return
        self.context.activate()
        src = driver.CUdeviceptr(self.ptr)
        if stream is None:
            check(driver.cuMemcpyDtoH(host_address, src, nbytes), f"cuMemcpyDtoH({nbytes} bytes)")
        else:
            check(driver.cuMemcpyDtoHAsync(host_address, src, nbytes, stream.handle),
                  f"cuMemcpyDtoHAsync({nbytes} bytes)")

    def copy_from_address(self, host_address: int, nbytes: int) -> None:
        """Copy ``nbytes`` of raw host memory to the start of this buffer (synchronous)."""
        self._span(nbytes, "copy_from_address")
        if nbytes == 0:
            return
        self.context.activate()
        check(driver.cuMemcpyHtoD(driver.CUdeviceptr(self.ptr), host_address, nbytes),
              f"cuMemcpyHtoD({nbytes} bytes)")

    def memset(self, byte: int = 0, nbytes: int | None = None, stream: Stream | None = None) -> None:
        """Set ``nbytes`` (default: all) bytes to ``byte`` (poisoning outputs before a run, say)."""
        count = self.nbytes if nbytes is None else nbytes
        self._span(count, "memset")
        if count == 0:
            return
        self.context.activate()
        dst = driver.CUdeviceptr(self.ptr)
        if stream is None:
            check(driver.cuMemsetD8(dst, byte & 0xFF, count), f"cuMemsetD8({count} bytes)")
        else:
            check(driver.cuMemsetD8Async(dst, byte & 0xFF, count, stream.handle),
                  f"cuMemsetD8Async({count} bytes)")

    def close(self) -> None:
        """Free the memory now (idempotent)."""
        ptr, self.ptr = self.ptr, 0
        if ptr:
            self.context.activate()
            ALLOC_COUNTS["cuMemFree"] += 1
            check(driver.cuMemFree(driver.CUdeviceptr(ptr)), "cuMemFree")

    def __enter__(self) -> DeviceBuffer:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __del__(self) -> None:
        # Collection may happen during interpreter shutdown or after a fault poisoned the
        # context; a leak is better than an exception from a finaliser.
        try:
            self.close()
        except Exception:  # noqa: BLE001 - never raise from a finaliser
            pass

    def __repr__(self) -> str:
        return f"DeviceBuffer(ptr={self.ptr:#x}, nbytes={self.nbytes}, device={self.device_ordinal})"


class PinnedHostBuffer:
    """``nbytes`` of page-locked host memory (``cuMemHostAlloc``); ``address`` is its address.

    A device-to-host copy into it can be queued on a stream (and captured in a CUDA graph);
    ``int32(k)`` reads the k-th 32-bit word once the copy is known to have landed.
    """

    def __init__(self, context: PrimaryContext, nbytes: int):
        self.context = context
        self.nbytes = max(1, int(nbytes))
        context.activate()
        self.address = int(check(driver.cuMemHostAlloc(self.nbytes, 0),
                                 f"cuMemHostAlloc({self.nbytes} bytes)"))
        ALLOC_COUNTS["cuMemHostAlloc"] += 1
        self._words = (ctypes.c_int32 * (self.nbytes // 4)).from_address(self.address)

    def int32(self, k: int = 0) -> int:
        return int(self._words[k])

    def set_int32(self, k: int, value: int) -> None:
        self._words[k] = value

    def close(self) -> None:
        address, self.address = self.address, 0
        if address:
            ALLOC_COUNTS["cuMemFreeHost"] += 1
            self.context.activate()
            check(driver.cuMemFreeHost(address), "cuMemFreeHost")

    def __del__(self) -> None:
        try:
            self.close()
        except Exception:  # noqa: BLE001 - never raise from a finaliser
            pass


class Stream:
    """A CUDA stream (``cuStreamCreate``); ``Stream.default(ctx)`` is the legacy default stream."""

    def __init__(self, context: PrimaryContext, *, _handle: Any = None):
        self.context = context
        self._owned = _handle is None
        if _handle is None:
            context.activate()
            _handle = check(driver.cuStreamCreate(driver.CUstream_flags.CU_STREAM_DEFAULT.value),
                            "cuStreamCreate")
        self.handle = _handle

    @classmethod
    def default(cls, context: PrimaryContext) -> Stream:
        return cls(context, _handle=driver.CUstream(0))

    @property
    def is_default(self) -> bool:
        return int(self.handle) == 0

    def synchronize(self) -> None:
        self.context.activate()
        check(driver.cuStreamSynchronize(self.handle), "cuStreamSynchronize")

    def close(self) -> None:
        if self._owned and self.handle is not None:
            handle, self.handle = self.handle, None
            self.context.activate()
            check(driver.cuStreamDestroy(handle), "cuStreamDestroy")

    def __del__(self) -> None:
        try:
            self.close()
        except Exception:  # noqa: BLE001 - never raise from a finaliser
            pass


class Event:
    """A CUDA event with timing enabled; `record` it on a stream, then `elapsed_ms`."""

    def __init__(self, context: PrimaryContext):
        self.context = context
        context.activate()
        self.handle = check(driver.cuEventCreate(driver.CUevent_flags.CU_EVENT_DEFAULT.value),
                            "cuEventCreate")

    def record(self, stream: Stream | None = None) -> Event:
        self.context.activate()
        handle = driver.CUstream(0) if stream is None else stream.handle
        check(driver.cuEventRecord(self.handle, handle), "cuEventRecord")
        return self

    def synchronize(self) -> None:
        self.context.activate()
        check(driver.cuEventSynchronize(self.handle), "cuEventSynchronize")

    def close(self) -> None:
        handle, self.handle = self.handle, None
        if handle is not None:
            self.context.activate()
            check(driver.cuEventDestroy(handle), "cuEventDestroy")

    def __del__(self) -> None:
        try:
            self.close()
        except Exception:  # noqa: BLE001 - never raise from a finaliser
            pass


def elapsed_ms(start: Event, end: Event) -> float:
    """Milliseconds between two recorded events (waits for ``end`` to complete)."""
    end.synchronize()
    return float(check(driver.cuEventElapsedTime(start.handle, end.handle), "cuEventElapsedTime"))


def host_bytes(address: int, nbytes: int) -> bytes:
    """A copy of ``nbytes`` of host memory at ``address`` (a cubin the linker owns, say)."""
    return ctypes.string_at(address, nbytes)


class KernelArgs:
    """Kernel arguments packed for ``cuLaunchKernel``: an array of pointers to value slots.

    Each argument gets its own zero-filled 8-byte-aligned slot; `address` is the ``void**``
    array's address, passed as ``kernelParams`` (the form every cuda-python version accepts).
    Packing rules: objects with an int ``ptr`` (DeviceBuffer, DeviceArrayView) and
    ``CUdeviceptr`` -> u64; numpy scalars -> their own bytes (np.float32, np.int32, np.float16,
    ...); ctypes scalars -> their bytes; bool -> u8; Python int -> i64 and Python float -> f64,
    unless the kernel's parameter sizes are known (``param_sizes``, from cuFuncGetParamInfo):
    then an int becomes i32/i16/i8 and a float f32/f16 to fit the parameter.
    """

    def __init__(self, args: Sequence[Any], param_sizes: Sequence[int] | None = None):
        if param_sizes is not None and len(param_sizes) != len(args):
            raise CudaError(f"the kernel takes {len(param_sizes)} arguments, {len(args)} given")
        self.raw: list[bytes] = []
        for k, arg in enumerate(args):
            size = None if param_sizes is None else param_sizes[k]
            raw = _pack_one(arg, size, k)
            if size is not None and len(raw) < size:
                raise CudaError(f"kernel argument {k} ({arg!r}) packs to {len(raw)} bytes, the "
                                f"kernel's parameter has {size}")
            self.raw.append(raw)
        slots = [-(-max(8, len(r)) // 8) * 8 for r in self.raw]
        self._storage = (ctypes.c_uint64 * max(1, sum(slots) // 8))()
        base = ctypes.addressof(self._storage)
        self._pointers = (ctypes.c_void_p * max(1, len(args)))()
        offset = 0
        for k, (raw, slot) in enumerate(zip(self.raw, slots, strict=True)):
            ctypes.memmove(base + offset, raw, len(raw))
            self._pointers[k] = base + offset
            offset += slot

    @property
    def address(self) -> int:
        """Address of the ``void*[n]`` array (0 when there are no arguments)."""
        return ctypes.addressof(self._pointers) if self.raw else 0


def _pack_one(arg: Any, size: int | None, k: int) -> bytes:
    ptr = getattr(arg, "ptr", None)
    if isinstance(ptr, (int, np.integer)) and not isinstance(ptr, bool):
        return struct.pack("<Q", int(ptr))
    if driver is not None and isinstance(arg, driver.CUdeviceptr):
        return struct.pack("<Q", int(arg))
    if isinstance(arg, (bool, np.bool_)):
        return struct.pack("<B", int(arg))
    if isinstance(arg, np.generic):
        raw = arg.tobytes()
        if size is None or len(raw) == size:
            return raw
        if isinstance(arg, np.integer):
            return _pack_one(int(arg), size, k)
        raise CudaError(f"kernel argument {k} is {arg.dtype} ({len(raw)} bytes), the kernel's "
                        f"parameter has {size} bytes; pass a numpy scalar of that width")
    if isinstance(arg, ctypes._SimpleCData):
        return bytes(arg)
    if isinstance(arg, int):
        fmt = {1: "<b", 2: "<h", 4: "<i"}.get(size or 8, "<q")
        if arg >= 1 << 63 and fmt == "<q":
            fmt = "<Q"
        try:
            return struct.pack(fmt, arg)
        except struct.error:
            if fmt != "<q":  # allow unsigned values of the parameter's width
                try:
                    return struct.pack(fmt.upper(), arg)
                except struct.error:
                    pass
            raise CudaError(f"kernel argument {k} = {arg} does not fit the kernel's "
                            f"{size or 8}-byte integer parameter") from None
    if isinstance(arg, float):
        if size == 4:
            return struct.pack("<f", arg)
        if size == 2:
            return np.float16(arg).tobytes()
        return struct.pack("<d", arg)
    raise CudaError(f"kernel argument {k} has unsupported type {type(arg).__name__}; pass a "
                    "device buffer or array view, a numpy scalar, an int or a float")


def pack_kernel_args(args: Sequence[Any], param_sizes: Sequence[int] | None = None) -> KernelArgs:
    """Pack launch arguments (see `KernelArgs` for the rules)."""
    return KernelArgs(args, param_sizes)
