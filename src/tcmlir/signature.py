"""Input signatures: what about the inputs of a call changes the compiled code.

A `Signature` is (shape, dtype, strides) per input. The size values (`sizes`) are derived from
the shapes by binding the definition's size names. Both are hashable and JSON-friendly, for the
in-memory compile cache and the persistent cache keys.

`call_key` is the hot path's version: one hashable tuple read straight off the user's objects
(type, shape, dtype, strides and device of each array; the type of each scalar; the shape,
format and strides of an object exposing only the buffer protocol) without converting anything, so a cached call finds its prepared launch plan in one dict lookup.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

__all__ = ["ALIGN_BYTES", "ArgSpec", "Signature", "call_key", "pointer_alignment"]

# the pointer alignment GPU kernels specialise on (128-bit accesses)
ALIGN_BYTES = 16


@dataclass(frozen=True)
class ArgSpec:
    shape: tuple[int, ...]
    dtype: str
    strides: tuple[int, ...]  # in elements, row-major contiguous for now
    # bytes the data pointer is aligned to, up to 16 (GPU kernels specialise on 16-byte
    # alignment: 128-bit accesses); arrays copied or allocated by tcmlir are aligned
    align: int = ALIGN_BYTES


@dataclass(frozen=True)
class Signature:
    args: tuple[ArgSpec, ...]

    def to_json(self) -> str:
        # the alignment only when below ALIGN_BYTES, so aligned signatures keep their former text
        return json.dumps([[list(a.shape), a.dtype, list(a.strides)] + ([a.align] if a.align < ALIGN_BYTES else [])
                           for a in self.args], separators=(",", ":"))

    @classmethod
    def from_json(cls, text: str) -> Signature:
        return cls(tuple(ArgSpec(tuple(s), d, tuple(st), *(rest[:1] or [ALIGN_BYTES]))
                         for s, d, st, *rest in json.loads(text)))

    @property
    def ranks_and_dtypes(self) -> tuple[tuple[int, str], ...]:
        """What a parametric kernel depends on (sizes excluded)."""
        return tuple((len(a.shape), a.dtype) for a in self.args)


def _numpy_key(x: np.ndarray) -> tuple:
    return (np.ndarray, x.shape, x.dtype, x.strides)


def _torch_key(x: Any) -> tuple:
    # get_device(): the CUDA ordinal, -1 on the CPU (cheaper than building x.device); the
    # pointer's low bits: GPU kernels specialise on 16-byte alignment
    return (x.__class__, x.shape, x.dtype, x.stride(), x.get_device(), x.data_ptr() & 15)


def _cupy_key(x: Any) -> tuple:
    return (x.__class__, x.shape, x.dtype, x.strides, x.device.id, x.data.ptr & 15)


def pointer_alignment(ptr: int) -> int:
    """The largest power of two up to 16 dividing ``ptr``."""
    low = ptr & (ALIGN_BYTES - 1)
    return ALIGN_BYTES if low == 0 else low & -low


def _scalar_key(x: Any) -> type:
    return x.__class__


class _NoKey(Exception):
    """An object of a keyed class that cannot be keyed after all (`_buffer_key`)."""


def _buffer_key(x: Any) -> tuple:
    # an object exposing only the buffer protocol (array.array, memoryview, bytearray, ...):
    # what numpy reads through it (`binding.buffer_view`)
    try:
        view = memoryview(x)
    except (TypeError, ValueError, BufferError):
        raise _NoKey from None
    return (x.__class__, view.shape, view.format, view.strides, view.readonly)


def _keyer_for(cls: type) -> Callable[[Any], Any] | None:
    if cls is np.ndarray:
        return _numpy_key
    if cls in (bool, int, float) or issubclass(cls, np.generic):
        return _scalar_key
    module = cls.__module__.split(".")[0]
    if module == "torch" and hasattr(cls, "data_ptr") and hasattr(cls, "stride"):
        return _torch_key
    if module == "cupy" and hasattr(cls, "__cuda_array_interface__"):
        return _cupy_key
    if module in ("torch", "cupy", "numpy") or cls is str or any(
            hasattr(cls, a) for a in ("__array__", "__array_interface__", "__dlpack__",
                                      "__cuda_array_interface__")):
        return None  # other array types take the full binding path on every call
    return _buffer_key  # (its objects may not expose a buffer: then no key)


_KEYERS: dict[type, Callable[[Any], Any] | None] = {}


def call_key(inputs: Sequence[Any]) -> tuple | None:
    """A hashable key of everything about ``inputs`` that a compiled call depends on, or None
    when some input is of a type not keyed here (then the call binds in full).

    Two calls with equal keys bind to the same `Signature`, size values, array kind and device,
    and pass or fail the same checks; only the data pointers (and scalar values) differ.
    """
    parts = []
    try:
        for x in inputs:
            cls = x.__class__
            keyer = _KEYERS.get(cls, False)
            if keyer is False:
                keyer = _KEYERS[cls] = _keyer_for(cls)
            if keyer is None:
                return None
            parts.append(keyer(x))
    except _NoKey:
        return None
    return tuple(parts)
