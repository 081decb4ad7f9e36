"""What a call's inputs bind to, read from any array kind without touching device data.

One binding of signatures and sizes for every entry that keys on them: ``fn.signature``,
``fn.size_values``, the options cache (`OptionsCache.lookup/lookup_record/record/save_tuned`),
the options factories, the tuner. It takes what a call on the target takes:

* ``cuda``: numpy arrays, torch tensors (CPU and CUDA), CuPy arrays, any object with
  ``__cuda_array_interface__`` and DLPack producers, bound by `runtime.arrays.bind_device_inputs`
  (shape, dtype, strides and pointer alignment read from the objects; nothing is copied);
* ``cpu`` / ``numpy``: host arrays (numpy, torch CPU tensors, CPU DLPack), bound by
  `binding.host_views` (views; the strides are those of the contiguous copy a call would make,
  computed without making it); a device array is the call's own `CallError`.

`host_copies` is the one place the tuning paths copy device inputs to the host (the reference
interpreter and the check of candidates read host memory); it logs what it copied.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from . import ir
from .signature import Signature

__all__ = ["InputSpec", "bind_input_spec", "host_copies", "host_copy"]

log = logging.getLogger("tcmlir.tune")


@dataclass(frozen=True)
class InputSpec:
    """The signature and size values of a call's inputs, and which inputs live on a GPU."""

    signature: Signature
    sizes: dict[str, int]
    on_device: tuple[str, ...] = ()


def bind_input_spec(fn: ir.Function, inputs: Sequence[Any], target: str) -> InputSpec:
    """The `InputSpec` a call of ``fn`` on ``target`` (resolved: cuda, cpu or numpy) binds
    ``inputs`` to, with the call's checks and errors; no data is copied."""
    if target == "cuda":
        from .runtime.array_views import DeviceArrayView
        from .runtime.arrays import bind_device_inputs

        bound = bind_device_inputs(fn, inputs)
        device = tuple(name for name, view in bound.views.items()
                       if isinstance(view, DeviceArrayView))
        return InputSpec(bound.signature, dict(bound.sizes), device)
    from .binding import host_signature, host_views

    arrays, sizes = host_views(fn, inputs)
    return InputSpec(host_signature(fn, arrays), dict(sizes))


def host_copy(x: Any, what: str = "input") -> Any:
    """``x`` as host data: numpy arrays and scalars as they are, torch CPU tensors as numpy
    views, device arrays (torch CUDA, CuPy, ``__cuda_array_interface__``, DLPack on a GPU)
    copied to a new numpy array."""
    from .array_kinds import array_library, torch_numpy
    from .binding import is_cuda_dlpack

    if isinstance(x, np.ndarray | np.generic | bool | int | float):
        return x
    library = array_library(x)
    if library == "torch" and hasattr(x, "detach"):
        t = x.detach()
        return torch_numpy(t if t.device.type == "cpu" else t.cpu())
    if library == "cupy" and hasattr(x, "get"):
        return x.get()
    if hasattr(x, "__cuda_array_interface__") or is_cuda_dlpack(x) or (
            library == "torch" and hasattr(x, "data_ptr")):
        from .runtime.array_views import DeviceArrayView, classify

        view = classify(x, what)
        if isinstance(view, DeviceArrayView):
            return _device_to_host(view)
        return view.array
    if hasattr(x, "__dlpack__"):
        return np.from_dlpack(x)
    return x


def _device_to_host(view: Any) -> np.ndarray:
    from .runtime import cuda_launch
    from .runtime.cuda_memory import check, driver

    out = np.empty(view.shape, view.dtype.numpy)
    if out.nbytes:
        # the device's context current on this thread (the runtime the launch path uses)
        cuda_launch.get_runtime().context(view.device_ordinal)
        check(driver.cuMemcpyDtoH(out.ctypes.data, view.ptr, out.nbytes),
              f"cuMemcpyDtoH({out.nbytes} bytes)", context="a host copy of a tuning input")
    return out


def host_copies(fn: ir.Function, inputs: Sequence[Any], why: str) -> list[Any]:
    """Every input as host data (`host_copy`), copying each device input once; the log says
    which were copied, how many bytes, and ``why``."""
    out, copied = [], []
    for t, x in zip(fn.inputs, inputs, strict=False):
        h = host_copy(x, f"{fn.name}: input {t.name}")
        if h is not x and not _shares_host_memory(x):
            copied.append((t.name, int(getattr(h, "nbytes", 0))))
        out.append(h)
    if copied:
        total = sum(n for _, n in copied)
        log.info("%s: copied %d device input(s) to the host once (%s; %d bytes) for %s; the "
                 "device arrays themselves are not moved", fn.name, len(copied),
                 ", ".join(n for n, _ in copied), total, why)
    return out


def _shares_host_memory(x: Any) -> bool:
    from .array_kinds import array_library

    return array_library(x) == "torch" and getattr(getattr(x, "device", None), "type",
                                                   None) == "cpu"
