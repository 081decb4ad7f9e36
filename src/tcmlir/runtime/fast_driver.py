"""The driver calls of a cached launch, made through ctypes straight into ``libcuda``.

Place: `launch_plan.CudaPlan` takes `direct_calls(driver)` once per plan and hands its
`DirectCalls.addresses` to `launch_thunk`, whose one native call per warm launch makes the
driver calls (``cuCtxGetCurrent``: is the plan's context current on this thread?; the zero
fills; one ``cuLaunchKernel`` per kernel). `PrimaryContext.activate` and the profiler call
the functions here through ctypes. Through cuda-python each call costs microseconds of
argument conversion (handles wrapped in Python objects, result tuples); the issue's budget for
a whole cached call is 10 µs. The same driver functions called through ctypes with fixed argument types cost a
fraction of that. Everything else (module loading, memory, events, graphs) stays with
cuda-python.

`direct_calls` returns None — and the plan keeps cuda-python's functions — when ``driver`` is not
the real ``cuda.bindings.driver`` (the tests' fake driver) or ``libcuda`` cannot be opened
through ctypes; results are then the same, only slower. Errors come back as ``CUresult`` codes,
turned into messages by the caller with cuda-python's ``error_text``.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import functools
from dataclasses import dataclass, field
from typing import Any

__all__ = ["DirectCalls", "direct_calls"]

_u32 = ctypes.c_uint
_ptr = ctypes.c_void_p


@dataclass(frozen=True)
class DirectCalls:
    """``launch(f, gx, gy, gz, bx, by, bz, shared, stream, params, extra)`` returns the
    ``CUresult`` code (0 on success); `current_context` the code and the current context;
    ``event_record(event, stream)`` (the profiler's per-kernel events) the code.

    ``launch`` has no ``argtypes``: ctypes then converts nothing through ``from_param``, which
    took two thirds of the call's cost (measured: 7.6 against 2.4 µs per call of an 11-argument
    C function on a loaded 2-core host). Its caller passes the handles and addresses as
    prebuilt ``c_void_p`` objects (`pointer`, `stream`) and the dimensions as Python ints (C
    ``int``: block and grid dimensions fit; `fits` says whether they do)."""

    launch: Any
    get_current: Any
    event_record: Any = None
    # cuCtxGetCurrent, cuLaunchKernel, cuMemsetD32Async, cuMemsetD8Async: what
    # `launch_thunk.LaunchRecord` calls
    addresses: tuple[int, ...] = ()
    _streams: dict = field(default_factory=dict)

    @staticmethod
    def pointer(value: int | None) -> Any:
        return _ptr(value or None)

    def stream(self, handle: int) -> Any:
        """The ``c_void_p`` of a stream handle, made once per handle."""
        found = self._streams.get(handle)
        if found is None:
            if len(self._streams) > 4096:  # streams come and go: keep the table small
                self._streams.clear()
            found = self._streams[handle] = _ptr(handle or None)
        return found

    @staticmethod
    def fits(*dims: int) -> bool:
        return all(0 <= d < 2**31 for d in dims)

    def current_context(self) -> tuple[int, int]:
        """(CUresult, the current context's handle or 0)."""
        out = _ptr()
        err = self.get_current(ctypes.byref(out))
        return err, out.value or 0


@functools.cache
def _libcuda() -> Any:
    for name in ("libcuda.so.1", ctypes.util.find_library("cuda")):
        if not name:
            continue
        try:
            return ctypes.CDLL(name)
        except OSError:
            continue
    return None


def direct_calls(driver: Any) -> DirectCalls | None:
    """The ctypes entry points, when ``driver`` is the real cuda-python driver module."""
    if getattr(driver, "__name__", "") != "cuda.bindings.driver":
        return None
    lib = _libcuda()
    if lib is None:
        return None
    try:
        launch = lib.cuLaunchKernel
        get_current = lib.cuCtxGetCurrent
    except AttributeError:
        return None
    try:
        memset32, memset8 = lib.cuMemsetD32Async, lib.cuMemsetD8Async
    except AttributeError:
        return None
    launch.restype = ctypes.c_int  # no argtypes: see DirectCalls
    get_current.argtypes = [ctypes.POINTER(_ptr)]
    get_current.restype = ctypes.c_int
    record = getattr(lib, "cuEventRecord", None)
    if record is not None:
        record.argtypes = [_ptr, _ptr]
        record.restype = ctypes.c_int
    addresses = tuple(ctypes.cast(f, ctypes.c_void_p).value or 0
                      for f in (get_current, launch, memset32, memset8))
    return DirectCalls(launch, get_current, record, addresses)
