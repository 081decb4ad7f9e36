"""The CUDA runtime: devices, primary contexts, modules from PTX, checked kernel launches.

Last stage of the GPU path (``codegen.nvptx`` --PTX--> here --> a launch). Everything goes
through ``cuda.bindings.driver``; one `CudaRuntime` object owns the state (``cuInit``, one
retained primary context per device, device properties); `get_runtime` returns a lazily created
default one. PTX goes through the driver's linker (``cuLinkCreate``/``cuLinkAddData``/
``cuLinkComplete``) so the cubin it produces is kept (`Module.cubin`) for the persistent cache,
and the JIT's error log ends up in the CudaError. Launch configurations are checked against the
device's (and the kernel's) limits (`launch_limits`) before ``cuLaunchKernel``; a failed launch
names the kernel, grid, block and the CUDA error. Memory, streams and events live in
`cuda_memory`; the prepared launches of compiled programs in `launch_plan`.
"""

from __future__ import annotations

import re
import threading
from collections.abc import Sequence
from typing import Any

import numpy as np

from ..errors import CudaError
from .cuda_memory import (
    DeviceBuffer,
    Event,
    KernelArgs,
    PinnedHostBuffer,
    PrimaryContext,
    Stream,
    check,
    driver,
    elapsed_ms,
    host_bytes,
    pack_kernel_args,
)
from .launch_limits import LaunchLimits, _dim3, validate_launch

__all__ = [
    "CudaRuntime",
    "Device",
    "DeviceBuffer",
    "Event",
    "Function",
    "KernelArgs",
    "LaunchLimits",
    "Module",
    "Stream",
    "elapsed_ms",
    "get_runtime",
    "is_available",
    "pack_kernel_args",
    "validate_launch",
]

_JIT_LOG_BYTES = 1 << 16
_DEFAULT_DYNAMIC_SHARED = 48 * 1024  # above this a kernel must opt in (cuFuncSetAttribute)


class Device:
    """Properties of one CUDA device, queried once: ``Device(0).arch == "sm_90"`` on an H200."""

    def __init__(self, ordinal: int = 0, runtime: CudaRuntime | None = None):
        rt = runtime or get_runtime()
        rt.require()
        count = rt.device_count()
        if not 0 <= ordinal < count:
            raise CudaError(f"no CUDA device {ordinal}: {count} device(s) visible")
        self.ordinal = ordinal
        dev = check(driver.cuDeviceGet(ordinal), f"cuDeviceGet({ordinal})")
        raw = check(driver.cuDeviceGetName(256, dev), "cuDeviceGetName")
        self.name = raw.split(b"\0", 1)[0].decode(errors="replace").strip()
        self.total_memory = int(check(driver.cuDeviceTotalMem(dev), "cuDeviceTotalMem"))

        def attr(name: str) -> int:
            enum = getattr(driver.CUdevice_attribute, f"CU_DEVICE_ATTRIBUTE_{name}")
            return int(check(driver.cuDeviceGetAttribute(enum, dev), f"cuDeviceGetAttribute({name})"))

        self.compute_capability = (attr("COMPUTE_CAPABILITY_MAJOR"), attr("COMPUTE_CAPABILITY_MINOR"))
        self.multiprocessor_count = attr("MULTIPROCESSOR_COUNT")
        self.max_threads_per_block = attr("MAX_THREADS_PER_BLOCK")
        self.max_shared_memory_per_block = attr("MAX_SHARED_MEMORY_PER_BLOCK")
        self.max_shared_memory_per_block_optin = max(
            self.max_shared_memory_per_block, attr("MAX_SHARED_MEMORY_PER_BLOCK_OPTIN"))
        self.warp_size = attr("WARP_SIZE")
        self.max_block_dims = (attr("MAX_BLOCK_DIM_X"), attr("MAX_BLOCK_DIM_Y"), attr("MAX_BLOCK_DIM_Z"))
        self.max_grid_dims = (attr("MAX_GRID_DIM_X"), attr("MAX_GRID_DIM_Y"), attr("MAX_GRID_DIM_Z"))

    @property
    def arch(self) -> str:
        major, minor = self.compute_capability
        return f"sm_{major}{minor}"

    @property
    def limits(self) -> LaunchLimits:
        return LaunchLimits(self.max_threads_per_block, self.max_block_dims, self.max_grid_dims,
                            self.max_shared_memory_per_block, self.max_shared_memory_per_block_optin)

    def __repr__(self) -> str:
        return (f"Device({self.ordinal}, {self.name!r}, {self.arch}, "
                f"{self.total_memory / 2**30:.1f} GiB, {self.multiprocessor_count} SMs)")


class Function:
    """A kernel of a loaded `Module` (``cuModuleGetFunction``) and its attributes."""

    def __init__(self, module: Module, name: str, handle: Any):
        self.module = module
        self.name = name
        self.handle = handle
        self._param_sizes: tuple[int, ...] | bool | None = False  # False: not queried yet
        self._param_count: int | bool | None = False
        self._dynamic_shared_set = _DEFAULT_DYNAMIC_SHARED
        self._attributes: dict[str, int] = {}

    def attribute(self, name: str) -> int:
        """A ``CU_FUNC_ATTRIBUTE_<name>`` of the kernel (cached: they do not change)."""
        if name not in self._attributes:
            enum = getattr(driver.CUfunction_attribute, f"CU_FUNC_ATTRIBUTE_{name}")
            self.module.context.activate()
            self._attributes[name] = int(check(driver.cuFuncGetAttribute(enum, self.handle),
                                               f"cuFuncGetAttribute({name}) of kernel {self.name}"))
        return self._attributes[name]

    @property
    def max_threads_per_block(self) -> int:
        return self.attribute("MAX_THREADS_PER_BLOCK")

    @property
    def static_shared_bytes(self) -> int:
        return self.attribute("SHARED_SIZE_BYTES")

    @property
    def num_registers(self) -> int:
        return self.attribute("NUM_REGS")

    @property
    def local_bytes(self) -> int:
        return self.attribute("LOCAL_SIZE_BYTES")

    @property
    def param_sizes(self) -> tuple[int, ...] | None:
        """Byte size of each kernel parameter (None where the driver cannot tell)."""
        if self._param_sizes is False:
            self._param_sizes = self._query_param_sizes()
        return self._param_sizes  # type: ignore[return-value]

    @property
    def param_count(self) -> int | None:
        """How many parameters the kernel takes (None where the driver cannot tell)."""
        if self._param_count is False:
            count = self._query_param_count()
            if count is None:
                sizes = self.param_sizes
                count = None if sizes is None else len(sizes)
            self._param_count = count
        return self._param_count  # type: ignore[return-value]

    def _query_param_count(self) -> int | None:
        query = getattr(driver, "cuFuncGetParamCount", None)
        if query is None:
            return None
        self.module.context.activate()
        try:
            err, n = query(self.handle)
        except RuntimeError:  # binding present but the driver lacks the entry point
            return None
        return int(n) if err == driver.CUresult.CUDA_SUCCESS else None

    def _query_param_sizes(self) -> tuple[int, ...] | None:
        query = getattr(driver, "cuFuncGetParamInfo", None)
        if query is None:
            return None
        self.module.context.activate()
        # The count comes from cuFuncGetParamCount; without it nothing is probed: probing
        # past the last parameter is an API error per kernel, which compute-sanitizer reports
        # (seen on the H200, 2026-12-01: 369 such errors in a memcheck run of the corpus, no
        # memory error). The sizes are then unknown (None) and the callers skip their check.
        count_query = getattr(driver, "cuFuncGetParamCount", None)
        if count_query is None:
            return None
        try:
            err, n = count_query(self.handle)
        except RuntimeError:
            return None
        if err != driver.CUresult.CUDA_SUCCESS:
            return None
        count = int(n)
        sizes = []
        for index in range(count):
            try:
                result = query(self.handle, index)
            except RuntimeError:  # binding present but the driver lacks the entry point
                return None
            if result[0] == driver.CUresult.CUDA_ERROR_INVALID_VALUE:
                break  # past the last parameter
            if result[0] != driver.CUresult.CUDA_SUCCESS:
                return None
            sizes.append(int(result[2]))
        return tuple(sizes)

    def allow_dynamic_shared(self, nbytes: int) -> None:
        """Opt in to more than 48 KiB of dynamic shared memory (done by `launch` as needed)."""
        if nbytes > self._dynamic_shared_set:
            self.module.context.activate()
            enum = driver.CUfunction_attribute.CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES
            check(driver.cuFuncSetAttribute(self.handle, enum, int(nbytes)),
                  f"cuFuncSetAttribute(MAX_DYNAMIC_SHARED_SIZE_BYTES={nbytes}) of kernel {self.name}")
            self._dynamic_shared_set = nbytes

    def __repr__(self) -> str:
        return f"Function({self.name!r}, device={self.module.context.ordinal})"


class Module:
    """A loaded CUDA module; ``cubin`` is the image that was loaded (kept for the cache)."""

    def __init__(self, context: PrimaryContext, cubin: bytes, ptx: str | None = None,
                 jit_log: str = ""):
        self.context = context
        self.cubin = cubin
        self.ptx = ptx
        self.jit_log = jit_log
        self._functions: dict[str, Function] = {}
        context.activate()
        self.handle = check(driver.cuModuleLoadData(cubin), "cuModuleLoadData",
                            context=f"device {context.ordinal}")

    def kernel_names(self) -> list[str]:
        """Kernel entry names read from the PTX (empty when loaded from a cubin)."""
        return re.findall(r"\.entry\s+([\w$.]+)", self.ptx or "")

    def function(self, name: str) -> Function:
        """The kernel called ``name`` (cached)."""
        fn = self._functions.get(name)
        if fn is None:
            self.context.activate()
            result = driver.cuModuleGetFunction(self.handle, name.encode())
            if result[0] == driver.CUresult.CUDA_ERROR_NOT_FOUND:
                names = self.kernel_names()
                known = f"; it defines {', '.join(names)}" if names else ""
                raise CudaError(f"the module has no kernel named {name!r}{known}")
            fn = self._functions[name] = Function(self, name, check(result, "cuModuleGetFunction"))
        return fn

    def close(self) -> None:
        handle, self.handle = self.handle, None
        self._functions.clear()
        if handle is not None:
            self.context.activate()
            check(driver.cuModuleUnload(handle), "cuModuleUnload")

    def __del__(self) -> None:
        try:
            self.close()
        except Exception:  # noqa: BLE001 - never raise from a finaliser
            pass


class CudaRuntime:
    """Owner of all CUDA state: initialisation, devices, primary contexts, last launches."""

    def __init__(self) -> None:
        self._lock = threading.RLock()
        self._available: bool | None = None
        self.unavailable_reason = ""
        self._count = 0
        self._contexts: dict[int, PrimaryContext] = {}
        self._devices: dict[int, Device] = {}
        self._last_launch: dict[int, Any] = {}  # a description, or an object that describes it
        self._pools: dict[int, Any] = {}

    # -- initialisation and devices -------------------------------------------------------
    def is_available(self) -> bool:
        """True when the driver loads, ``cuInit`` succeeds and a device is visible; never raises."""
        with self._lock:
            if self._available is None:
                self._available = self._initialise()
            return self._available

    def _initialise(self) -> bool:
        if driver is None:
            self.unavailable_reason = "cuda-python is not installed"
            return False
        try:
            check(driver.cuInit(0), "cuInit")
            self._count = int(check(driver.cuDeviceGetCount(), "cuDeviceGetCount"))
        except Exception as exc:  # noqa: BLE001 - no libcuda, no device node, old driver: "no GPU"
            self.unavailable_reason = f"{type(exc).__name__}: {exc}"
            return False
        if self._count == 0:
            self.unavailable_reason = "the CUDA driver sees no device"
            return False
        return True

    def require(self) -> None:
        """Raise CudaError (saying why) unless a GPU is usable."""
        if not self.is_available():
            raise CudaError(f"no usable CUDA GPU ({self.unavailable_reason}); "
                            "use target='cpu' or target='numpy' on this machine")

    def device_count(self) -> int:
        return self._count if self.is_available() else 0

    def device(self, ordinal: int = 0) -> Device:
        with self._lock:
            if ordinal not in self._devices:
                self._devices[ordinal] = Device(ordinal, self)
            return self._devices[ordinal]

    def context(self, device: int = 0) -> PrimaryContext:
        """The retained primary context of ``device``, made current on the calling thread."""
        with self._lock:
            ctx = self._contexts.get(device)
            if ctx is None:
                self.device(device)  # validates the ordinal
                ctx = self._contexts[device] = PrimaryContext(device)
        ctx.activate()
        return ctx

    # -- modules ----------------------------------------------------------------------------
    def load_ptx(self, ptx: str, device: int = 0, name: str = "tcmlir.ptx") -> Module:
        """JIT-link PTX into a cubin with the driver's linker and load it."""
        ctx = self.context(device)
        info, errors = bytearray(_JIT_LOG_BYTES), bytearray(_JIT_LOG_BYTES)
        opt = driver.CUjit_option
        options = [opt.CU_JIT_INFO_LOG_BUFFER, opt.CU_JIT_INFO_LOG_BUFFER_SIZE_BYTES,
                   opt.CU_JIT_ERROR_LOG_BUFFER, opt.CU_JIT_ERROR_LOG_BUFFER_SIZE_BYTES,
                   opt.CU_JIT_LOG_VERBOSE]
        values = [info, _JIT_LOG_BYTES, errors, _JIT_LOG_BYTES, 1]
        state = check(driver.cuLinkCreate(len(options), options, values), "cuLinkCreate")
        data = ptx.encode() + b"\0"

        def log(buf: bytearray) -> str:
            return buf.split(b"\0", 1)[0].decode(errors="replace").strip()

        try:
            for call, result in (
                ("cuLinkAddData(PTX)", lambda: driver.cuLinkAddData(
                    state, driver.CUjitInputType.CU_JIT_INPUT_PTX, data, len(data),
                    name.encode(), 0, [], [])),
                ("cuLinkComplete", lambda: driver.cuLinkComplete(state)),
            ):
                try:
                    out = check(result(), call, context=f"device {device}")
                except CudaError as exc:
                    raise CudaError(f"{exc}\nPTX JIT log:\n{log(errors) or log(info)}") from None
            cubin_address, size = out
            cubin = host_bytes(int(cubin_address), int(size))
        finally:
            check(driver.cuLinkDestroy(state), "cuLinkDestroy")
        return Module(ctx, cubin, ptx=ptx, jit_log=log(info))

    def load_cubin(self, cubin: bytes, device: int = 0) -> Module:
        """Load a cubin (from the cache, say)."""
        return Module(self.context(device), bytes(cubin))

    # -- memory, streams, events ------------------------------------------------------------
    def alloc(self, nbytes: int, device: int = 0) -> DeviceBuffer:
        return DeviceBuffer(self.context(device), nbytes)

    def to_device(self, array: np.ndarray, device: int = 0) -> DeviceBuffer:
        """A new device buffer holding a copy of a numpy array."""
        if not array.flags.c_contiguous:
            array = np.ascontiguousarray(array)
        buf = self.alloc(array.nbytes, device)
        buf.copy_from_host(array)
        return buf

    def pool(self, device: int = 0) -> Any:
        """The device's stream-ordered `pool.BufferPool` (temporaries and staging buffers)."""
        with self._lock:
            pool = self._pools.get(device)
            if pool is None:
                from .pool import BufferPool

                pool = self._pools[device] = BufferPool(self, device)
            return pool

    def pinned(self, nbytes: int, device: int = 0) -> PinnedHostBuffer:
        return PinnedHostBuffer(self.context(device), nbytes)

    def stream(self, device: int = 0) -> Stream:
        return Stream(self.context(device))

    def default_stream(self, device: int = 0) -> Stream:
        return Stream.default(self.context(device))

    def event(self, device: int = 0) -> Event:
        return Event(self.context(device))

    def pointer_device(self, ptr: int) -> int | None:
        """Device ordinal a device pointer belongs to, or None if the driver does not know it."""
        if not ptr or not self.is_available():
            return None
        try:
            attr = driver.CUpointer_attribute.CU_POINTER_ATTRIBUTE_DEVICE_ORDINAL
            return int(check(driver.cuPointerGetAttribute(attr, driver.CUdeviceptr(ptr)),
                             "cuPointerGetAttribute"))
        except CudaError:  # not a pointer the driver knows (host memory, another API's)
            return None

    # -- launching --------------------------------------------------------------------------
    def launch(self, function: Function, grid: Sequence[int] | int, block: Sequence[int] | int,
               args: Sequence[Any], shared_bytes: int = 0, stream: Stream | None = None,
               sync: bool = False) -> None:
        """Launch ``function`` after checking the configuration; ``sync`` waits and reports."""
        ctx = function.module.context
        grid3, block3 = _dim3(grid, "grid"), _dim3(block, "block")
        what = (f"kernel {function.name} with grid {grid3}, block {block3}, "
                f"{shared_bytes} bytes of dynamic shared memory")
        validate_launch(self.device(ctx.ordinal).limits, grid3, block3, shared_bytes,
                        kernel=function.name, kernel_max_threads=function.max_threads_per_block,
                        static_shared_bytes=function.static_shared_bytes)
        count = function.param_count  # cached after the first launch of the kernel
        if count is not None and count != len(args):
            raise CudaError(f"{what}: the kernel takes {count} arguments, {len(args)} given")
        try:
            # Only plain Python numbers need the kernel's parameter sizes to be packed; asking
            # the driver for them costs API calls (which compute-sanitizer reports as errors
            # where the driver lacks cuFuncGetParamCount), so typed arguments skip the query.
            untyped = any(isinstance(a, int | float) and not isinstance(a, bool) for a in args)
            sizes = function.param_sizes if untyped else None
            if sizes is None and any(isinstance(a, float) for a in args):
                # without the sizes a Python float is packed as a double, and a float
                # parameter would read the low half of it (3.0 arrives as 0.0); a Python int
                # packed as i64 reads right as any integer parameter (little-endian)
                raise CudaError("this driver cannot report the kernel's parameter sizes "
                                "(cuFuncGetParamInfo): pass floating-point scalars as numpy "
                                "scalars of the parameter's type (np.float32(x)), not Python "
                                "floats")
            packed = pack_kernel_args(args, sizes)
        except CudaError as exc:
            raise CudaError(f"{what}: {exc}") from None
        if shared_bytes > _DEFAULT_DYNAMIC_SHARED:
            function.allow_dynamic_shared(shared_bytes)
        ctx.activate()
        handle = driver.CUstream(0) if stream is None else stream.handle
        check(driver.cuLaunchKernel(function.handle, *grid3, *block3, int(shared_bytes), handle,
                                    packed.address, 0), "cuLaunchKernel", context=what)
        self._last_launch[ctx.ordinal] = what
        if sync:
            call = driver.cuCtxSynchronize() if stream is None else driver.cuStreamSynchronize(handle)
            check(call, "synchronize after launch", context=what)

    def synchronize(self, device: int | None = None) -> None:
        """Wait for all work on one device (or all used devices); errors name the last launch."""
        ordinals = list(self._contexts) if device is None else [device]
        for ordinal in ordinals:
            self.context(ordinal)
            last = self._last_launch.get(ordinal)
            last = last if last is None or isinstance(last, str) else str(last)
            check(driver.cuCtxSynchronize(), f"cuCtxSynchronize(device {ordinal})",
                  context=f"last launch: {last}" if last else None)

    def close(self) -> None:
        """Release the primary contexts this runtime retained."""
        with self._lock:
            contexts, self._contexts = self._contexts, {}
        for ctx in contexts.values():
            ctx.release()


_default_runtime: CudaRuntime | None = None
_default_lock = threading.Lock()


def get_runtime() -> CudaRuntime:
    """The process's default runtime, created on first use."""
    global _default_runtime
    with _default_lock:
        if _default_runtime is None:
            _default_runtime = CudaRuntime()
        return _default_runtime


def is_available() -> bool:
    """Whether a CUDA GPU can be used (never raises)."""
    return get_runtime().is_available()
