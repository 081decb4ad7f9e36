"""A stream-ordered pool of device buffers: temporaries and staging without a driver allocation
per call.

Place: owned by `cuda.CudaRuntime` (one pool per device, `CudaRuntime.pool`), used by
`launch_plan.CudaPlan` for calls whose arrays are not torch's or CuPy's (those use their own
caching allocators). A buffer released with stream ``S`` is handed out again only for work on
``S``, which runs after everything already queued there, so reuse needs no synchronisation.
Sizes are rounded up to a power of two (at least 256 bytes) so nearby sizes share buffers.
`retire` takes a buffer out for good (a CUDA graph captured it). Allocation and free counts
are visible through `cuda_memory.ALLOC_COUNTS`.
"""

from __future__ import annotations

import threading
from typing import Any

__all__ = ["BufferPool", "size_class"]


def size_class(nbytes: int) -> int:
    return max(256, 1 << max(0, int(nbytes) - 1).bit_length())


class BufferPool:
    """Free device buffers of one device, by (stream handle, size class)."""

    def __init__(self, runtime: Any, device: int):
        self._runtime = runtime
        self.device = device
        self._free: dict[tuple[int, int], list[Any]] = {}
        self._retired: list[Any] = []
        self._lock = threading.Lock()

    def acquire(self, nbytes: int, stream: int) -> Any:
        """A buffer of at least ``nbytes`` for work queued on ``stream``."""
        size = size_class(nbytes)
        with self._lock:
            free = self._free.get((stream, size))
            if free:
                return free.pop()
        return self._runtime.alloc(size, self.device)

    def release(self, buffer: Any, stream: int) -> None:
        """Give ``buffer`` back after queueing its last use on ``stream``."""
        with self._lock:
            self._free.setdefault((stream, buffer.nbytes), []).append(buffer)

    def retire(self, buffer: Any) -> None:
        with self._lock:
            self._retired.append(buffer)

    @property
    def cached_bytes(self) -> int:
        with self._lock:
            return sum(b.nbytes for free in self._free.values() for b in free)

    def clear(self) -> None:
        """Free the cached buffers (after synchronising: queued work may still use them)."""
        with self._lock:
            free, self._free = self._free, {}
        for buffers in free.values():
            for b in buffers:
                b.close()
