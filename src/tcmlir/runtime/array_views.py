"""What a user array is: `classify` reads one without copying it.

numpy arrays (and torch CPU tensors) are host arrays (`HostArrayView`); torch CUDA tensors, any
object with ``__cuda_array_interface__`` (CuPy, Numba, ...) and DLPack producers on a CUDA
device are device arrays (`DeviceArrayView`: pointer, shape, tcmlir dtype, byte strides, device
ordinal, and the object that keeps the memory alive); `ArrayKind` says which library made it.
torch and cupy are imported only when the user's objects are theirs. Staging, outputs in the
input's kind and binding a call's inputs are `arrays`.
"""

from __future__ import annotations

import ctypes
import enum
import math
from dataclasses import dataclass
from typing import Any

import numpy as np

from ..dtypes import DType
from ..errors import CallError
from .cuda import CudaRuntime, get_runtime

__all__ = ["ArrayKind", "DeviceArrayView", "HostArrayView", "c_strides", "classify",
           "not_contiguous", "typestr"]


class ArrayKind(enum.Enum):
    """Where an array lives and which library made it (decides the kind of the outputs)."""

    NUMPY = "numpy"
    TORCH_CPU = "torch-cpu"
    TORCH_CUDA = "torch-cuda"
    CUPY = "cupy"
    CUDA_ARRAY = "cuda-array"    # another __cuda_array_interface__ producer
    DLPACK_CUDA = "dlpack-cuda"  # another DLPack producer on a CUDA device

    @property
    def on_device(self) -> bool:
        return self not in (ArrayKind.NUMPY, ArrayKind.TORCH_CPU)


def c_strides(shape: tuple[int, ...], itemsize: int) -> tuple[int, ...]:
    """Row-major (C) strides in bytes of ``shape`` with elements of ``itemsize`` bytes."""
    strides, step = [], itemsize
    for extent in reversed(shape):
        strides.append(step)
        step *= max(extent, 1)
    return tuple(reversed(strides))


@dataclass(frozen=True)
class HostArrayView:
    """A host array: ``array`` is a numpy array (sharing memory with a torch CPU tensor)."""

    array: np.ndarray
    dtype: DType
    kind: ArrayKind = ArrayKind.NUMPY

    @property
    def shape(self) -> tuple[int, ...]:
        return tuple(self.array.shape)


@dataclass(frozen=True)
class DeviceArrayView:
    """An array in device memory: what a kernel argument needs (``ptr`` is packed as u64)."""

    ptr: int
    shape: tuple[int, ...]
    dtype: DType
    strides_bytes: tuple[int, ...]
    device_ordinal: int
    owner: Any
    kind: ArrayKind = ArrayKind.CUDA_ARRAY

    @property
    def size(self) -> int:
        return math.prod(self.shape)

    @property
    def nbytes(self) -> int:
        return self.size * self.dtype.itemsize

    @property
    def is_contiguous(self) -> bool:
        """C-contiguous (strides of extent-1 dimensions do not matter; empty arrays are)."""
        if self.size == 0:
            return True
        expected = c_strides(self.shape, self.dtype.itemsize)
        return all(n == 1 or s == e for n, s, e in
                   zip(self.shape, self.strides_bytes, expected, strict=True))


_DLPACK_CODES = {0: "int", 1: "uint", 2: "float", 4: "bfloat", 6: "bool"}
_TYPESTR_KINDS = {"i": "int", "u": "uint", "f": "float", "b": "bool"}


def _dtype_from(kind: str, bits: int, what: str) -> DType:
    special = {("bool", 8): "bool", ("bfloat", 16): "bfloat16"}
    name = special.get((kind, bits), f"{kind}{bits}")
    try:
        return DType(name)
    except ValueError:
        raise CallError(f"{what}: element type {name} is not supported by TC (supported: "
                        f"{', '.join(t.value for t in DType)})") from None


def _dtype_from_typestr(typestr: str, what: str) -> DType:
    order, kind, size = typestr[:1], typestr[1:2], typestr[2:]
    if order == ">" or not size.isdigit():
        raise CallError(f"{what}: unsupported element type {typestr!r} (big-endian or malformed)")
    if kind == "V" and size == "2":
        return DType.BFLOAT16  # how bfloat16 appears in __cuda_array_interface__ producers
    if kind not in _TYPESTR_KINDS:
        raise CallError(f"{what}: element type {typestr!r} is not supported by TC")
    return _dtype_from(_TYPESTR_KINDS[kind], int(size) * 8, what)


def typestr(dtype: DType) -> str:
    """The ``__cuda_array_interface__`` typestr of ``dtype``."""
    if dtype is DType.BFLOAT16:
        return "<V2"
    kind = {"b": "b", "i": "i", "u": "u", "f": "f"}[np.dtype(dtype.value).kind]
    return f"{'|' if dtype.itemsize == 1 else '<'}{kind}{dtype.itemsize}"


def not_contiguous(name: str, view: DeviceArrayView) -> CallError:
    """The error for a device array that is not row-major, with the fix for its library."""
    # ``name``: "fn: input X" (or a bare name): the hint names the tensor alone
    tensor = name.rsplit(" ", 1)[-1]
    hint = {ArrayKind.TORCH_CUDA: f"{tensor}.contiguous()",
            ArrayKind.CUPY: f"cupy.ascontiguousarray({tensor})"}.get(view.kind,
                                                                     "a contiguous copy")
    return CallError(
        f"{name}: the CUDA array is not contiguous (shape {view.shape}, byte strides "
        f"{view.strides_bytes}); tcmlir reads and writes device arrays in row-major order "
        f"without copying them: pass {hint}")


def _is_torch_tensor(x: Any) -> bool:
    return type(x).__module__.split(".")[0] == "torch" and hasattr(x, "data_ptr")


def _torch_view(x: Any, name: str) -> HostArrayView | DeviceArrayView:
    what = f"{name} (torch tensor)"
    dtype_name = str(x.dtype).removeprefix("torch.")
    try:
        dtype = DType(dtype_name)
    except ValueError:
        raise CallError(f"{what}: element type {dtype_name} is not supported by TC") from None
    if x.device.type == "cpu":
        t = x.detach()
        if dtype is DType.BFLOAT16:
            import torch

            array = t.view(torch.int16).numpy().view(dtype.numpy)
        else:
            array = t.numpy()
        return HostArrayView(array, dtype, ArrayKind.TORCH_CPU)
    if x.device.type != "cuda":
        raise CallError(f"{what}: tensors on device {x.device} are not supported; "
                        "use a CUDA or CPU tensor")
    index = x.device.index if x.device.index is not None else 0
    return DeviceArrayView(int(x.data_ptr()), tuple(int(n) for n in x.shape), dtype,
                           tuple(int(s) * dtype.itemsize for s in x.stride()), index, x,
                           ArrayKind.TORCH_CUDA)


def _cai_view(x: Any, name: str, runtime: CudaRuntime | None) -> DeviceArrayView:
    what = f"{name} (__cuda_array_interface__)"
    try:
        cai = x.__cuda_array_interface__
    except Exception as exc:  # noqa: BLE001 - producers raise anything (torch: grad tensors)
        raise CallError(f"{what}: the array refused to give its CUDA array interface: {exc}") from None
    if cai.get("mask") is not None:
        raise CallError(f"{what}: masked CUDA arrays are not supported")
    shape = tuple(int(n) for n in cai["shape"])
    dtype = _dtype_from_typestr(cai["typestr"], what)
    strides = cai.get("strides")
    strides_bytes = (c_strides(shape, dtype.itemsize) if strides is None
                     else tuple(int(s) for s in strides))
    ptr = int(cai["data"][0] or 0)
    module = type(x).__module__.split(".")[0]
    kind = ArrayKind.CUPY if module == "cupy" else ArrayKind.CUDA_ARRAY
    device = getattr(getattr(x, "device", None), "id", None) if kind is ArrayKind.CUPY else None
    if device is None:
        device = (runtime or get_runtime()).pointer_device(ptr) or 0
    return DeviceArrayView(ptr, shape, dtype, strides_bytes, int(device), x, kind)


# --- DLPack: the legacy "dltensor" capsule, read with ctypes -------------------------------
class _DLDevice(ctypes.Structure):
    _fields_ = [("device_type", ctypes.c_int32), ("device_id", ctypes.c_int32)]


class _DLDataType(ctypes.Structure):
    _fields_ = [("code", ctypes.c_uint8), ("bits", ctypes.c_uint8), ("lanes", ctypes.c_uint16)]


class _DLTensor(ctypes.Structure):
    _fields_ = [("data", ctypes.c_void_p), ("device", _DLDevice), ("ndim", ctypes.c_int32),
                ("dtype", _DLDataType), ("shape", ctypes.POINTER(ctypes.c_int64)),
                ("strides", ctypes.POINTER(ctypes.c_int64)), ("byte_offset", ctypes.c_uint64)]


_DL_CPU, _DL_CUDA, _DL_CUDA_HOST, _DL_CUDA_MANAGED = 1, 2, 3, 13
_capsule_pointer = ctypes.pythonapi.PyCapsule_GetPointer
_capsule_pointer.restype = ctypes.c_void_p
_capsule_pointer.argtypes = [ctypes.py_object, ctypes.c_char_p]


def _dlpack_view(x: Any, name: str, device_id: int) -> DeviceArrayView:
    what = f"{name} (DLPack)"
    try:
        capsule = x.__dlpack__(stream=1)  # 1: the legacy default stream, which we launch on
    except TypeError:
        capsule = x.__dlpack__()
    try:
        address = _capsule_pointer(capsule, b"dltensor")
    except ValueError:
        raise CallError(f"{what}: __dlpack__ did not return an unused 'dltensor' capsule") from None
    # DLManagedTensor starts with its DLTensor. The capsule keeps the producer's memory alive
    # and calls the deleter when collected, so it is the view's owner.
    tensor = _DLTensor.from_address(address)
    dt = tensor.dtype
    if dt.lanes != 1 or dt.code not in _DLPACK_CODES:
        raise CallError(f"{what}: DLPack element type (code {dt.code}, {dt.bits} bits, "
                        f"{dt.lanes} lanes) is not supported by TC")
    dtype = _dtype_from(_DLPACK_CODES[dt.code], dt.bits, what)
    shape = tuple(int(tensor.shape[k]) for k in range(tensor.ndim))
    if tensor.strides:
        strides = tuple(int(tensor.strides[k]) * dtype.itemsize for k in range(tensor.ndim))
    else:
        strides = c_strides(shape, dtype.itemsize)
    ptr = int(tensor.data or 0) + int(tensor.byte_offset)
    return DeviceArrayView(ptr, shape, dtype, strides, device_id, capsule, ArrayKind.DLPACK_CUDA)


def classify(x: Any, name: str = "array", *, require_contiguous: bool = True,
             runtime: CudaRuntime | None = None) -> HostArrayView | DeviceArrayView:
    """Describe a user array; CallError for unsupported objects, dtypes or non-contiguous
    device arrays (``require_contiguous``)."""
    if isinstance(x, np.ndarray) or isinstance(x, (np.generic, bool, int, float)):
        from ..binding import check_byte_order

        array = np.asarray(x)
        dtype = DType.from_numpy(array.dtype)
        if dtype is None:
            raise CallError(f"{name}: numpy element type {array.dtype} is not supported by TC")
        check_byte_order(name, array)
        return HostArrayView(array, dtype)
    if _is_torch_tensor(x):
        view = _torch_view(x, name)
    elif hasattr(x, "__cuda_array_interface__"):
        view = _cai_view(x, name, runtime)
    elif hasattr(x, "__dlpack__") and hasattr(x, "__dlpack_device__"):
        device_type, device_id = (int(v) for v in x.__dlpack_device__())
        if device_type in (_DL_CPU, _DL_CUDA_HOST):
            return classify(np.from_dlpack(x), name)
        if device_type not in (_DL_CUDA, _DL_CUDA_MANAGED):
            raise CallError(f"{name}: DLPack device type {device_type} is neither CPU nor CUDA")
        view = _dlpack_view(x, name, device_id)
    else:
        raise CallError(f"{name}: expected a numpy array, a torch tensor, a CuPy array or another "
                        f"CUDA/DLPack array, got {type(x).__module__}.{type(x).__qualname__}")
    if isinstance(view, DeviceArrayView) and require_contiguous and not view.is_contiguous:
        raise not_contiguous(name, view)
    return view
