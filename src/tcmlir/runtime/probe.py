"""Whether a CUDA GPU is usable here, and if not, whether that is a fact or a fault.

`probe_gpu` asks the driver directly (``cuInit``, ``cuDeviceGetCount``) and sorts the answer
into three states, so callers can tell "this machine has no GPU" from "the GPU stack is
broken":

* ``"ok"``: the driver initialised and sees at least one device;
* ``"absent"``: no device is visible, for one of exactly these reasons: cuda-python is not
  installed (no module ``cuda``), the driver library ``libcuda`` cannot be found, ``cuInit``
  returns ``CUDA_ERROR_NO_DEVICE``, or ``cuDeviceGetCount`` returns 0;
* ``"broken"``: anything else (cuda-python fails to import, ``cuInit`` fails with another
  error, an unexpected exception): never to be read as "no GPU".

``target="auto"`` (`api.resolve_target`) picks the CPU only for ``"absent"``; for ``"broken"``
it raises. The test suite skips GPU tests only for ``"absent"`` (and not even then under
``TCMLIR_REQUIRE_GPU=1``). Used by ``api`` and ``tests/conftest.py``; independent of the
`cuda` runtime object so that it can be asked before (and without) creating one.
"""

from __future__ import annotations

import functools
import importlib
from dataclasses import dataclass
from typing import Literal

__all__ = ["GpuProbe", "probe_gpu"]

_CUDA_ERROR_NO_DEVICE = 100


@dataclass(frozen=True)
class GpuProbe:
    """``state`` (``ok``/``absent``/``broken``), ``reason`` (why not ok) and ``devices``."""

    state: Literal["ok", "absent", "broken"]
    reason: str = ""
    devices: int = 0

    @property
    def ok(self) -> bool:
        return self.state == "ok"


def _import_driver():
    try:
        return importlib.import_module("cuda.bindings.driver")
    except ModuleNotFoundError as exc:
        if exc.name not in ("cuda.bindings", "cuda.bindings.driver"):
            raise
    return importlib.import_module("cuda.cuda")  # cuda-python 11.x / early 12


def _library_missing(exc: BaseException) -> bool:
    """The driver binding could not load ``libcuda`` (no NVIDIA driver installed)."""
    if type(exc).__name__ == "DynamicLibNotFoundError":  # cuda-pathfinder (cuda-python >= 12.8)
        return True
    text = str(exc)
    return isinstance(exc, RuntimeError) and "libcuda" in text and (
        "dlopen" in text or "not found" in text.lower() or "cannot open" in text)


@functools.cache
def probe_gpu() -> GpuProbe:
    """The GPU state of this process (cached: ``probe_gpu.cache_clear()`` asks again)."""
    try:
        driver = _import_driver()
    except ModuleNotFoundError as exc:
        if exc.name == "cuda":
            return GpuProbe("absent", "cuda-python is not installed")
        return GpuProbe("broken", f"importing cuda-python failed: {type(exc).__name__}: {exc}")
    except Exception as exc:  # noqa: BLE001 - reported as "broken", never as "no GPU"
        return GpuProbe("broken", f"importing cuda-python failed: {type(exc).__name__}: {exc}")
    try:
        (err,) = driver.cuInit(0)
        if int(err) == _CUDA_ERROR_NO_DEVICE:
            return GpuProbe("absent", "cuInit: CUDA_ERROR_NO_DEVICE (the driver sees no device)")
        if int(err) != 0:
            return GpuProbe("broken", f"cuInit failed with CUresult {int(err)} ({err!r})")
        err, count = driver.cuDeviceGetCount()
        if int(err) != 0:
            return GpuProbe("broken", f"cuDeviceGetCount failed with CUresult {int(err)}")
    except Exception as exc:  # noqa: BLE001 - sorted below: a missing libcuda, else broken
        if _library_missing(exc):
            return GpuProbe("absent", f"no NVIDIA driver library: {str(exc)[:200]}")
        return GpuProbe("broken", f"CUDA initialisation raised {type(exc).__name__}: {exc}")
    if int(count) == 0:
        return GpuProbe("absent", "cuDeviceGetCount: 0 devices")
    return GpuProbe("ok", devices=int(count))
