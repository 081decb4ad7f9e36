"""Outputs left where the parts computed them: per-device shards, consumed in place by the
next split call.

Place: `execute.call_sharded(fn, *inputs, devices=[0, 1])` runs a split call whose
outputs are not gathered: each output is a `Sharded`, the rows ``[lo, hi)`` of every part on
that part's device. A `Sharded` is a valid input of a later split call: a part whose slab lies
in a shard on its own device reads it in place; other rows are copied from the shards that
hold them (peer, device-local or staged, like any input). `Sharded.gather(device)` makes one
array of it.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

from ..dtypes import DType

__all__ = ["Shard", "Sharded"]


@dataclass(frozen=True)
class Shard:
    """Rows ``[rows[0], rows[1])`` of a tensor, in ``array`` (device memory at ``ptr``)."""

    device: int
    rows: tuple[int, int]
    array: Any
    ptr: int


@dataclass(frozen=True)
class Sharded:
    """A tensor kept in row shards on several devices (the output of `call_sharded`)."""

    shape: tuple[int, ...]
    dtype: DType
    shards: tuple[Shard, ...]
    kind: Any  # the `runtime.array_views.ArrayKind` of the shards' arrays

    @property
    def locations(self) -> tuple[tuple[int, int, int], ...]:
        """(device, first row, end row) of each shard: what a plan counts bytes with."""
        return tuple((s.device, *s.rows) for s in self.shards)

    @property
    def row_bytes(self) -> int:
        return self.dtype.itemsize * math.prod(self.shape[1:])

    def pieces(self, lo: int, hi: int) -> list[tuple[Shard, int, int]]:
        """The shards holding rows of ``[lo, hi)``, with the rows each holds."""
        return [(s, max(lo, s.rows[0]), min(hi, s.rows[1])) for s in self.shards
                if max(lo, s.rows[0]) < min(hi, s.rows[1])]

    def gather(self, device: int | None = None, runtime: Any = None) -> Any:
        """One array of the whole tensor on ``device`` (default: the first shard's): a
        `runtime.arrays.DeviceArray`, copied synchronously from every shard."""
        from ..runtime.arrays import DeviceArray
        from ..runtime.cuda_launch import get_runtime
        from ..runtime.cuda_memory import check, driver
        from ..runtime.peer import PeerAccess

        rt = runtime or get_runtime()
        device = self.shards[0].device if device is None else int(device)
        buf = rt.alloc(math.prod(self.shape) * self.dtype.itemsize, device)
        peers = PeerAccess(rt)
        for s in self.shards:
            nbytes = (s.rows[1] - s.rows[0]) * self.row_bytes
            dst = buf.ptr + s.rows[0] * self.row_bytes
            rt.context(s.device)
            check(driver.cuCtxSynchronize(), "cuCtxSynchronize", context="gathering shards")
            if s.device == device:
                rt.context(device)
                check(driver.cuMemcpyDtoD(dst, s.ptr, nbytes), f"cuMemcpyDtoD({nbytes} bytes)")
            elif peers.direct(s.device, device):
                check(driver.cuMemcpyPeer(dst, rt.context(device).handle, s.ptr,
                                          rt.context(s.device).handle, nbytes),
                      f"cuMemcpyPeer({nbytes} bytes)")
            else:
                import numpy as np

                host = np.empty(nbytes, np.uint8)
                rt.context(s.device)
                check(driver.cuMemcpyDtoH(host.ctypes.data, s.ptr, nbytes), "cuMemcpyDtoH")
                rt.context(device)
                check(driver.cuMemcpyHtoD(dst, host.ctypes.data, nbytes), "cuMemcpyHtoD")
        return DeviceArray(buf, self.shape, self.dtype)
