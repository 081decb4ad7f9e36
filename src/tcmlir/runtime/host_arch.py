"""An identifier of the host CPU for cache keys (architecture and LLVM's CPU name)."""

from __future__ import annotations

import functools
import platform

__all__ = ["host_arch"]


@functools.cache
def host_arch() -> str:
    """e.g. ``cpu-x86_64-znver3``: what changes host code, not the marketing name."""
    import llvmlite.binding as llvm

    return f"cpu-{platform.machine()}-{llvm.get_host_cpu_name()}"
