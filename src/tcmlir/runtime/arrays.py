"""The bridge from user arrays to device pointers, and outputs "in the input's kind".

`classify` looks at one user array (`array_views`, whose names are re-exported here): numpy
(and torch CPU tensors) are host arrays (`HostArrayView`); torch CUDA tensors, any object with
``__cuda_array_interface__`` (CuPy, Numba, ...) and DLPack producers on a CUDA device are device
arrays (`DeviceArrayView`).
`bind_device_inputs` checks a call's inputs against a TC definition without copying anything.
`stage_input` gives the kernel a device pointer: zero-copy for device arrays, a copy into a
`DeviceBuffer` for host arrays. `allocate_like_kind` allocates an output in the first input's
kind (torch in -> torch out, CuPy -> CuPy, numpy -> a device buffer copied back to numpy).
torch and cupy are imported only when the user's objects are theirs.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import numpy as np

from ..array_kinds import convert_hint
from ..dtypes import DType
from ..errors import CallError
from .array_views import (
    ArrayKind,
    DeviceArrayView,
    HostArrayView,
    c_strides,
    classify,
    typestr,
)
from .cuda import CudaRuntime, DeviceBuffer, get_runtime

__all__ = [
    "ArrayKind",
    "DeviceArray",
    "DeviceArrayView",
    "DeviceBoundCall",
    "DeviceOutput",
    "HostArrayView",
    "allocate_like_kind",
    "bind_device_inputs",
    "check_output_overlap",
    "classify",
    "stage_input",
    "stage_output",
    "typestr",
]


def stage_input(x: Any, name: str = "input", *, device: int = 0,
                runtime: CudaRuntime | None = None) -> DeviceArrayView:
    """A device view of ``x``: its own memory for device arrays (no copy), else a copy."""
    rt = runtime or get_runtime()
    view = classify(x, name, runtime=rt)
    if isinstance(view, DeviceArrayView):
        if view.device_ordinal != device:
            raise CallError(f"{name} is on CUDA device {view.device_ordinal}, the kernel runs on "
                            f"device {device}: move it there first (e.g. .to('cuda:{device}'))")
        return view
    host = view.array if view.array.flags.c_contiguous else np.ascontiguousarray(view.array)
    buf = rt.to_device(host, device)  # (ascontiguousarray would make a 0-d array 1-d)
    return DeviceArrayView(buf.ptr, tuple(host.shape), view.dtype,
                           c_strides(tuple(host.shape), view.dtype.itemsize), device, buf,
                           view.kind)


class DeviceArray:
    """Device memory tcmlir allocated for an output; exposes ``__cuda_array_interface__``."""

    def __init__(self, buffer: DeviceBuffer, shape: tuple[int, ...], dtype: DType,
                 stream: int = 0):
        self.buffer, self.shape, self.dtype = buffer, tuple(shape), dtype
        self.stream = int(stream)  # the stream the work writing it was queued on

    @property
    def ptr(self) -> int:
        return self.buffer.ptr

    @property
    def __cuda_array_interface__(self) -> dict[str, Any]:
        # the protocol spells the legacy default stream 1 (0 would mean "no stream")
        return {"shape": self.shape, "typestr": typestr(self.dtype), "data": (self.ptr, False),
                "strides": None, "version": 3, "stream": self.stream or 1}

    def get(self) -> np.ndarray:
        """A numpy copy (bfloat16 needs ml_dtypes)."""
        return self.buffer.copy_to_host(np.empty(self.shape, self.dtype.numpy))

    def __repr__(self) -> str:
        return f"DeviceArray(shape={self.shape}, dtype={self.dtype}, device={self.buffer.device_ordinal})"


@dataclass
class DeviceOutput:
    """An output: ``view`` is what the kernel writes, `finish` returns the user's object."""

    view: DeviceArrayView
    result: Any
    copy_back: Any = None  # callable run by finish (host outputs), else None

    def finish(self) -> Any:
        if self.copy_back is not None:
            self.copy_back()
        return self.result


def _torch_dtype(torch: Any, dtype: DType) -> Any:
    found = getattr(torch, dtype.value, None)
    if found is None:
        raise CallError(f"this torch version has no {dtype} tensors")
    return found


def allocate_like_kind(kind: ArrayKind, shape: tuple[int, ...], dtype: DType, device: int = 0,
                       runtime: CudaRuntime | None = None) -> DeviceOutput:
    """A new output of ``shape``/``dtype`` in the given kind, with the view the kernel writes."""
    rt = runtime or get_runtime()
    shape = tuple(int(n) for n in shape)
    nbytes = math.prod(shape) * dtype.itemsize
    strides = c_strides(shape, dtype.itemsize)
    if kind is ArrayKind.TORCH_CUDA:
        import torch

        t = torch.empty(shape, dtype=_torch_dtype(torch, dtype), device=f"cuda:{device}")
        return DeviceOutput(DeviceArrayView(int(t.data_ptr()), shape, dtype, strides, device, t,
                                            kind), t)
    if kind is ArrayKind.CUPY:
        import cupy

        if dtype is DType.BFLOAT16:
            raise CallError("CuPy has no bfloat16 arrays: give bfloat16 inputs as torch tensors")
        with cupy.cuda.Device(device):
            a = cupy.empty(shape, dtype=dtype.numpy)
        return DeviceOutput(DeviceArrayView(int(a.data.ptr), shape, dtype, strides, device, a,
                                            kind), a)
    buf = rt.alloc(nbytes, device)
    view = DeviceArrayView(buf.ptr, shape, dtype, strides, device, buf, kind)
    if kind is ArrayKind.NUMPY:
        host = np.empty(shape, dtype.numpy)
        return DeviceOutput(view, host, lambda: buf.copy_to_host(host))
    if kind is ArrayKind.TORCH_CPU:
        import torch

        t = torch.empty(shape, dtype=_torch_dtype(torch, dtype))
        return DeviceOutput(view, t, lambda: buf.copy_to_address(int(t.data_ptr()), nbytes))
    return DeviceOutput(view, DeviceArray(buf, shape, dtype))


def stage_output(x: Any, name: str = "output", *, device: int = 0,
                 runtime: CudaRuntime | None = None) -> DeviceOutput:
    """A user-given output array: written in place on the device, or copied in and back."""
    rt = runtime or get_runtime()
    view = classify(x, name, runtime=rt)
    if isinstance(view, DeviceArrayView):
        return DeviceOutput(stage_input(x, name, device=device, runtime=rt), x)
    host = view.array
    if not host.flags.c_contiguous or not host.flags.writeable:
        raise CallError(f"{name}: an output array must be C-contiguous and writeable "
                        "(use np.empty or np.ascontiguousarray)")
    staged = stage_input(host, name, device=device, runtime=rt)  # copied in: `+=` reads it
    buf: DeviceBuffer = staged.owner
    return DeviceOutput(staged, x, lambda: buf.copy_to_host(host))


def _byte_range(view: DeviceArrayView) -> tuple[int, int]:
    lo = view.ptr + sum(min(0, (n - 1) * s) for n, s in zip(view.shape, view.strides_bytes,
                                                            strict=True))
    hi = view.ptr + sum(max(0, (n - 1) * s) for n, s in zip(view.shape, view.strides_bytes,
                                                            strict=True))
    return lo, hi + view.dtype.itemsize


def views_overlap(a: HostArrayView | DeviceArrayView, b: HostArrayView | DeviceArrayView) -> bool:
    """Whether two arrays share memory: `np.shares_memory` for host arrays, intersecting
    byte ranges on one device for device arrays (device arrays here are contiguous, so the
    range is exact)."""
    from ..binding import arrays_overlap

    if isinstance(a, HostArrayView) and isinstance(b, HostArrayView):
        return arrays_overlap(a.array, b.array)
    if isinstance(a, DeviceArrayView) and isinstance(b, DeviceArrayView):
        if a.size == 0 or b.size == 0 or a.device_ordinal != b.device_ordinal:
            return False
        (alo, ahi), (blo, bhi) = _byte_range(a), _byte_range(b)
        return alo < bhi and blo < ahi
    return False


def check_output_overlap(fn: Any, bound: DeviceBoundCall, outputs: Any,
                         runtime: CudaRuntime | None = None) -> None:
    """A `CallError` naming both when an array given with ``outputs=`` shares memory with an
    input or another output (numpy or device arrays alike; see `binding.check_no_overlap`)."""
    from ..binding import check_no_overlap

    outs = [(f"output {t.name}", classify(x, f"{fn.name}: output {t.name}", runtime=runtime))
            for t, x in zip(fn.outputs, outputs, strict=False)]
    ins = [(f"input {name}", v) for name, v in bound.views.items()
           if fn.tensor(name).rank > 0 or isinstance(v, DeviceArrayView)]
    check_no_overlap(fn.name, outs, ins, views_overlap)


@dataclass(frozen=True)
class DeviceBoundCall:
    """A call's inputs for the CUDA target: views by tensor name (nothing copied yet), the size
    values, the signature, the kind outputs are made in, and the device the inputs live on."""

    views: dict[str, HostArrayView | DeviceArrayView]
    sizes: dict[str, int]
    signature: Any  # tcmlir.signature.Signature
    kind: ArrayKind
    device: int

    def staged(self, runtime: CudaRuntime | None = None) -> dict[str, DeviceArrayView]:
        """Device views of every input: device arrays as they are, host arrays copied over."""
        return {name: view if isinstance(view, DeviceArrayView)
                else stage_input(view.array, name, device=self.device, runtime=runtime)
                for name, view in self.views.items()}


def bind_device_inputs(fn: Any, inputs: Any) -> DeviceBoundCall:
    """Check inputs (numpy, torch, CuPy, CUDA-array-interface or DLPack arrays) against ``fn``
    (an ``ir.Function``): count, rank, dtype, one device, contiguity; bind the sizes."""
    from ..binding import bind_sizes, check_copy_fits, scalar_array
    from ..signature import ArgSpec, Signature, pointer_alignment

    if len(inputs) != len(fn.inputs):
        names = ", ".join(t.name for t in fn.inputs)
        raise CallError(f"{fn.name} takes {len(fn.inputs)} input(s) ({names}), got {len(inputs)}")
    views: dict[str, HostArrayView | DeviceArrayView] = {}
    devices: dict[int, str] = {}
    kind = None
    for tensor, value in zip(fn.inputs, inputs, strict=True):
        what = f"{fn.name}: input {tensor.name}"
        if isinstance(value, (bool, int, float, np.generic)):
            if tensor.rank > 0:
                raise CallError(f"{what} must be an array of rank {tensor.rank}, got a scalar")
            value = scalar_array(fn.name, tensor, value)
        elif tensor.rank == 0 and not hasattr(value, "shape"):  # no array, no number
            raise CallError(f"{fn.name}: scalar {tensor.name} ({tensor.dtype}) must be a number, "
                            f"got {type(value).__module__}.{type(value).__qualname__}")
        view = classify(value, what)
        if view.dtype is not tensor.dtype:
            raise CallError(f"{what} must have dtype {tensor.dtype}, got {view.dtype} "
                            f"(convert it, e.g. {convert_hint(value, tensor.dtype, tensor.name)})")
        if isinstance(view, DeviceArrayView):
            devices.setdefault(view.device_ordinal, tensor.name)
        if kind is None and tensor.rank > 0:
            kind = view.kind
        views[tensor.name] = view
    if len(devices) > 1:
        where = ", ".join(f"{name} on device {d}" for d, name in devices.items())
        raise CallError(f"{fn.name}: inputs live on different GPUs ({where}); move them to one")
    sizes = bind_sizes(fn, [views[t.name].shape for t in fn.inputs])
    for name, view in views.items():  # host inputs are copied to the device, contiguous
        if isinstance(view, HostArrayView):
            check_copy_fits(f"{fn.name}: input {name}", view.array)

    def strides(view: HostArrayView | DeviceArrayView) -> tuple[int, ...]:
        if isinstance(view, HostArrayView):
            return c_strides(view.shape, 1)
        return tuple(s // view.dtype.itemsize for s in view.strides_bytes)

    def align(view: HostArrayView | DeviceArrayView) -> int:  # host arrays: copied, aligned
        return 16 if isinstance(view, HostArrayView) else pointer_alignment(view.ptr)

    signature = Signature(tuple(ArgSpec(tuple(v.shape), str(v.dtype), strides(v), align(v))
                                for v in views.values()))
    return DeviceBoundCall(views, sizes, signature, kind or ArrayKind.NUMPY,
                           next(iter(devices), 0))
