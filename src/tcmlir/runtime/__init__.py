"""Runtimes: the host (ctypes calls into JIT code) and CUDA (cuda-python driver API).

`gpu_available()` never raises. ``target="auto"`` consults `probe.probe_gpu` instead, which
also tells "no device" from a broken CUDA install.
"""

from __future__ import annotations

__all__ = ["default_cuda_arch", "gpu_available"]


def gpu_available() -> bool:
    """True when the CUDA driver loads and reports at least one device."""
    try:
        from .cuda import is_available
    except Exception:  # noqa: BLE001 - a broken CUDA install means "no GPU"
        return False
    return is_available()


def default_cuda_arch() -> str:
    """The current device's ``sm_XY``, else ``sm_90``."""
    if gpu_available():
        from .cuda import get_runtime

        return get_runtime().device(0).arch
    return "sm_90"
