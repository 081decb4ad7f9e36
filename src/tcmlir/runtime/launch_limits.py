"""Launch limits of a device and the check of a launch configuration against them.

Place: used by `cuda.CudaRuntime.launch` on every launch and by `launch_plan.CudaPlan` once
when a plan is made; pure Python, so the messages are tested without a GPU. A refused
configuration is a `CudaError` that names the limit, the kernel and what to reduce.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from ..errors import LaunchConfigError

__all__ = ["Dim3", "LaunchLimits", "validate_launch"]

Dim3 = tuple[int, int, int]


@dataclass(frozen=True)
class LaunchLimits:
    """The launch limits of one device (what `validate_launch` checks against)."""

    max_threads_per_block: int
    max_block_dims: Dim3
    max_grid_dims: Dim3
    max_shared_per_block: int
    max_shared_per_block_optin: int


def _dim3(value: Sequence[int] | int, what: str) -> Dim3:
    dims = (value,) if isinstance(value, (int, np.integer)) else tuple(value)
    if not 1 <= len(dims) <= 3 or not all(isinstance(d, (int, np.integer)) for d in dims):
        raise LaunchConfigError(f"{what} must be up to three integers, got {value!r}")
    dims = tuple(int(d) for d in dims) + (1,) * (3 - len(dims))
    if any(d < 1 for d in dims):
        raise LaunchConfigError(f"{what} {dims} has a dimension below 1: every dimension must be >= 1")
    return dims  # type: ignore[return-value]


def validate_launch(limits: LaunchLimits, grid: Dim3, block: Dim3, shared_bytes: int = 0, *,
                    kernel: str = "kernel", kernel_max_threads: int | None = None,
                    static_shared_bytes: int = 0) -> None:
    """Raise `LaunchConfigError` saying which limit a launch configuration breaks and what to reduce."""
    where = f"launch of {kernel} with grid {grid}, block {block}"
    threads = block[0] * block[1] * block[2]
    if threads > limits.max_threads_per_block:
        raise LaunchConfigError(
            f"{where}: the block has {threads} threads, more than the device's limit of "
            f"{limits.max_threads_per_block} threads per block; reduce the block size "
            "(MappingOptions.map_to_threads)")
    for axis, size, limit in zip("xyz", block, limits.max_block_dims, strict=True):
        if size > limit:
            raise LaunchConfigError(f"{where}: block dimension {axis} = {size} exceeds the device's limit "
                            f"of {limit}; reduce the block size along {axis}")
    for axis, size, limit in zip("xyz", grid, limits.max_grid_dims, strict=True):
        if size > limit:
            raise LaunchConfigError(f"{where}: grid dimension {axis} = {size} exceeds the device's limit "
                            f"of {limit}; reduce the grid size along {axis} (map_to_blocks)")
    if kernel_max_threads is not None and threads > kernel_max_threads:
        raise LaunchConfigError(
            f"{where}: this kernel can run at most {kernel_max_threads} threads per block (its "
            f"register use), the block has {threads}; reduce the block size or the unroll factor")
    if shared_bytes < 0:
        raise LaunchConfigError(f"{where}: negative dynamic shared memory size {shared_bytes}")
    total = shared_bytes + static_shared_bytes
    if total > limits.max_shared_per_block_optin:
        raise LaunchConfigError(
            f"{where}: needs {total} bytes of shared memory per block ({static_shared_bytes} "
            f"static + {shared_bytes} dynamic), the device allows at most "
            f"{limits.max_shared_per_block_optin}; reduce the tile sizes or turn off shared "
            "memory promotion")
