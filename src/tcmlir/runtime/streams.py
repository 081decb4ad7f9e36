"""Which CUDA stream a call launches on, and where a call's device memory comes from.

Place: used by `launch_plan.CudaPlan` once per call. `stream_handle` turns a ``stream=``
argument (a ``torch.cuda.Stream``, a CuPy stream, anything with ``__cuda_stream__``, a
tcmlir `cuda_memory.Stream`, a ``CUstream`` or a raw handle int) into the raw handle.

Without ``stream=``, a call launches on the current stream of the library its arrays come
from, so it is ordered with the caller's work: torch's ``current_stream(device)``, CuPy's
``get_current_stream()``; for numpy and other arrays the legacy default stream (handle 0).

Memory per array kind (`memory_for`): torch inputs get outputs and temporaries from torch's
caching allocator (stream-ordered, and captured into CUDA graphs through its graph pools), CuPy
inputs from CuPy's pool, everything else from the runtime's `pool.BufferPool`.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from ..dtypes import DType
from ..errors import CallError
from .array_views import ArrayKind
from .cuda_memory import driver

__all__ = ["CupyMemory", "DriverMemory", "TorchMemory", "memory_for", "stream_handle"]


def stream_handle(stream: Any) -> int:
    """The raw ``CUstream`` handle of a ``stream=`` argument (CallError for other objects)."""
    if isinstance(stream, bool):
        raise CallError("stream= must be a CUDA stream or a raw stream handle, got a bool")
    if isinstance(stream, int | np.integer):
        return int(stream)
    for attr in ("cuda_stream", "ptr"):  # torch.cuda.Stream / ExternalStream; cupy.cuda.Stream
        value = getattr(stream, attr, None)
        if isinstance(value, int) and not isinstance(value, bool):
            return value
    protocol = getattr(stream, "__cuda_stream__", None)  # cuda.core and others: (version, handle)
    if callable(protocol):
        return int(protocol()[1])
    if driver is not None and isinstance(stream, driver.CUstream):
        return int(stream)
    handle = getattr(stream, "handle", None)  # tcmlir.runtime.cuda_memory.Stream
    if driver is not None and isinstance(handle, driver.CUstream):
        return int(handle)
    raise CallError(f"stream= must be a torch or CuPy stream, a tcmlir Stream, a CUstream or a "
                    f"raw handle, got {type(stream).__module__}.{type(stream).__qualname__}")


class DriverMemory:
    """Temporaries and scalars from the runtime's stream-ordered `BufferPool` (numpy and other
    CUDA arrays); outputs are made by the plan (device buffers copied back, or `DeviceArray`)."""

    pooled = True

    def __init__(self, runtime: Any, device: int):
        self.pool = runtime.pool(device)
        self.device = device

    def current_stream(self) -> int:
        return 0  # the legacy default stream: what such arrays' producers are ordered on

    def scratch(self, nbytes: int, stream: int) -> tuple[int, Any]:
        buf = self.pool.acquire(nbytes, stream)
        return buf.ptr, buf



class TorchMemory:
    """Outputs, temporaries and scalars as torch tensors on the inputs' device."""

    pooled = False

    def __init__(self, device: int):
        import torch

        self.torch = torch
        self.device = torch.device("cuda", device)
        self.index = device
        raw = getattr(getattr(torch, "_C", None), "_cuda_getCurrentRawStream", None)
        self._current = raw if raw is not None else (
            lambda d: torch.cuda.current_stream(d).cuda_stream)

    def current_stream(self) -> int:
        return self._current(self.index)

    def dtype(self, dtype: DType) -> Any:
        found = getattr(self.torch, dtype.value, None)
        if found is None:
            raise CallError(f"this torch version has no {dtype} tensors")
        return found

    def empty(self, shape: tuple[int, ...], dtype: Any) -> tuple[int, Any]:
        t = self.torch.empty(shape, dtype=dtype, device=self.device)
        return t.data_ptr(), t

    def scratch(self, nbytes: int, stream: int) -> tuple[int, Any]:
        t = self.torch.empty((nbytes,), dtype=self.torch.uint8, device=self.device)
        return t.data_ptr(), t

    def scalar(self, value: Any, dtype: Any) -> tuple[int, Any]:
        t = self.torch.full((), value, dtype=dtype, device=self.device)  # a fill on the stream
        return t.data_ptr(), t

    def on_stream(self, handle: int, given: Any) -> Any:
        """A context making ``handle`` torch's current stream (so allocations and fills are
        ordered on it), or None when it already is."""
        if handle == self.current_stream():
            return None
        if not isinstance(given, self.torch.cuda.Stream):
            given = self.torch.cuda.ExternalStream(handle, device=self.device)
        return self.torch.cuda.stream(given)


class CupyMemory:
    """Outputs, temporaries and scalars as CuPy arrays (CuPy's memory pool) on one device."""

    pooled = False

    def __init__(self, device: int):
        import cupy

        self.cupy = cupy
        self.device = cupy.cuda.Device(device)

    def current_stream(self) -> int:
        return int(self.cupy.cuda.get_current_stream().ptr)

    def dtype(self, dtype: DType) -> Any:
        if dtype is DType.BFLOAT16:
            raise CallError("CuPy has no bfloat16 arrays: give bfloat16 inputs as torch tensors")
        return dtype.numpy

    def empty(self, shape: tuple[int, ...], dtype: Any) -> tuple[int, Any]:
        with self.device:
            a = self.cupy.empty(shape, dtype=dtype)
        return int(a.data.ptr), a

    def scratch(self, nbytes: int, stream: int) -> tuple[int, Any]:
        return self.empty((nbytes,), np.uint8)

    def on_stream(self, handle: int, given: Any) -> Any:
        """A context making ``handle`` CuPy's current stream, or None when it already is."""
        if handle == self.current_stream():
            return None
        if not isinstance(given, self.cupy.cuda.Stream):
            given = self.cupy.cuda.ExternalStream(handle)
        return given

    def scalar(self, value: Any, dtype: Any) -> tuple[int, Any]:
        with self.device:
            a = self.cupy.full((), value, dtype=dtype)
        return int(a.data.ptr), a


def memory_for(kind: ArrayKind, runtime: Any, device: int) -> Any:
    if kind is ArrayKind.TORCH_CUDA:
        return TorchMemory(device)
    if kind is ArrayKind.CUPY:
        return CupyMemory(device)
    return DriverMemory(runtime, device)
