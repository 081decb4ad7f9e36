"""A split call's inputs: views (no copy), where each lives, sizes, and row slabs on the host.

Place: shared by `multi.execute` (planning, host parts), `multi.cuda_split` and `multi.tune`.
An input is a host array, a device array (`runtime.array_views.classify`), or a `shards.Sharded`.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

import numpy as np

from .. import ir
from ..errors import CallError
from .shards import Sharded

__all__ = ["host_slab", "locate_inputs", "placeholder", "row_bytes", "size_values"]


def locate_inputs(fn: ir.Function, inputs: Sequence[Any]) -> tuple[dict[str, Any], dict[str, Any]]:
    """Views of the inputs (`runtime.array_views.classify`, no copy) and where each lives (device
    ordinal, or None for the host), checked against ``fn`` like a call's inputs."""
    from ..binding import scalar_array
    from ..runtime.array_views import DeviceArrayView, classify

    if len(inputs) != len(fn.inputs):
        names = ", ".join(t.name for t in fn.inputs)
        raise CallError(f"{fn.name} takes {len(fn.inputs)} input(s) ({names}), got {len(inputs)}")
    views, where = {}, {}
    for t, x in zip(fn.inputs, inputs, strict=True):
        what = f"{fn.name}: input {t.name}"
        if isinstance(x, Sharded):
            if len(x.shape) != t.rank or x.dtype is not t.dtype:
                raise CallError(f"{what} must be {t.dtype} of rank {t.rank}, got shards of "
                                f"{x.dtype} with shape {x.shape}")
            views[t.name], where[t.name] = x, x.locations
            continue
        if isinstance(x, (bool, int, float, np.generic)):
            if t.rank > 0:
                raise CallError(f"{what} must be an array of rank {t.rank}, got a scalar")
            x = scalar_array(fn.name, t, x)
        view = classify(x, what)
        if view.dtype is not t.dtype:
            raise CallError(f"{what} must have dtype {t.dtype}, got {view.dtype}")
        views[t.name] = view
        where[t.name] = view.device_ordinal if isinstance(view, DeviceArrayView) else None
    return views, where


def size_values(fn: ir.Function, views: dict[str, Any]) -> dict[str, int]:
    from ..binding import bind_sizes

    return bind_sizes(fn, [tuple(views[t.name].shape) for t in fn.inputs])


def host_slab(view: Any, lo: int, hi: int, rank: int) -> np.ndarray:
    """Rows [lo, hi) of an input as a host array (a slice of host arrays; a copy of device
    ones, made only when compiling: an options factory reads the data)."""
    from ..runtime.array_views import HostArrayView

    if isinstance(view, HostArrayView):
        return view.array if rank == 0 else view.array[lo:hi]
    from ..runtime.cuda_memory import check, driver

    if isinstance(view, Sharded):
        out = np.empty((hi - lo, *view.shape[1:]), view.dtype.numpy)
        for shard, a, b in view.pieces(lo, hi):
            n = (b - a) * view.row_bytes
            check(driver.cuMemcpyDtoH(out.ctypes.data + (a - lo) * view.row_bytes,
                                      shard.ptr + (a - shard.rows[0]) * view.row_bytes, n),
                  f"cuMemcpyDtoH({n} bytes)", context="an input slab for an options factory")
        return out

    shape = tuple(view.shape) if rank == 0 else (hi - lo, *view.shape[1:])
    out = np.empty(shape, view.dtype.numpy)
    row = row_bytes(view.shape, view.dtype.itemsize, rank)
    if out.nbytes:
        check(driver.cuMemcpyDtoH(out.ctypes.data, view.ptr + lo * row, out.nbytes),
              f"cuMemcpyDtoH({out.nbytes} bytes)", context="an input slab for an options factory")
    return out


def placeholder(view: Any, shape: tuple[int, ...], rank: int) -> Any:
    from ..runtime.array_views import HostArrayView

    if rank == 0 and isinstance(view, HostArrayView):
        return view.array
    return np.empty(shape, view.dtype.numpy)


def row_bytes(shape: Sequence[int], itemsize: int, rank: int) -> int:
    return itemsize * (math.prod(shape[1:]) if rank > 0 else 1)


