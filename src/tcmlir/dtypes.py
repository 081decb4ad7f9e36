"""Scalar types of TC: names, numpy equivalents, and TC's promotion rules.

float16 and bfloat16 are storage types: arithmetic on them happens in float32 (`compute`).
"""

from __future__ import annotations

import enum

import numpy as np

__all__ = ["DType", "parse_dtype", "promote"]


class DType(enum.Enum):
    BOOL = "bool"
    INT8 = "int8"
    INT16 = "int16"
    INT32 = "int32"
    INT64 = "int64"
    UINT8 = "uint8"
    UINT16 = "uint16"
    UINT32 = "uint32"
    UINT64 = "uint64"
    FLOAT16 = "float16"
    BFLOAT16 = "bfloat16"
    FLOAT32 = "float32"
    FLOAT64 = "float64"

    @property
    def is_float(self) -> bool:
        return self in _FLOATS

    @property
    def is_int(self) -> bool:
        return not self.is_float and self is not DType.BOOL

    @property
    def is_signed(self) -> bool:
        return self.is_float or self.value.startswith("int")

    @property
    def bits(self) -> int:
        return _BITS[self]

    @property
    def itemsize(self) -> int:
        return max(1, self.bits // 8)

    @property
    def compute(self) -> DType:
        """The type arithmetic is done in (half types compute in float32)."""
        return DType.FLOAT32 if self in (DType.FLOAT16, DType.BFLOAT16) else self

    @property
    def numpy(self) -> np.dtype:
        """numpy dtype; bfloat16 needs the optional ``ml_dtypes`` package."""
        if self is DType.BFLOAT16:
            try:
                import ml_dtypes
            except ImportError as exc:  # pragma: no cover - depends on environment
                from .errors import TCError

                raise TCError(
                    "bfloat16 tensors on the host need the 'ml_dtypes' package (pip install ml_dtypes)"
                ) from exc
            return np.dtype(ml_dtypes.bfloat16)
        return np.dtype(self.value)

    @classmethod
    def from_numpy(cls, dt: np.dtype) -> DType | None:
        dt = np.dtype(dt)
        if dt.name == "bfloat16":
            return cls.BFLOAT16
        try:
            return cls(dt.name)
        except ValueError:
            return None

    def __str__(self) -> str:
        return self.value


_FLOATS = {DType.FLOAT16, DType.BFLOAT16, DType.FLOAT32, DType.FLOAT64}
_BITS = {
    DType.BOOL: 1, DType.INT8: 8, DType.INT16: 16, DType.INT32: 32, DType.INT64: 64,
    DType.UINT8: 8, DType.UINT16: 16, DType.UINT32: 32, DType.UINT64: 64,
    DType.FLOAT16: 16, DType.BFLOAT16: 16, DType.FLOAT32: 32, DType.FLOAT64: 64,
}

_ALIASES = {"float": DType.FLOAT32, "double": DType.FLOAT64}


def parse_dtype(name: str) -> DType | None:
    """The DType a TC type name denotes (``float`` is float32, ``double`` float64), else None."""
    if name in _ALIASES:
        return _ALIASES[name]
    try:
        return DType(name)
    except ValueError:
        return None


def _rank(t: DType) -> tuple[int, int, int]:
    # floats above ints above bool; wider above narrower; among equal widths unsigned above signed
    kind = 2 if t.is_float else (1 if t.is_int else 0)
    return (kind, t.bits, 0 if t.is_signed else 1)


def promote(a: DType, b: DType) -> DType:
    """TC's (C-like) promotion of two operand types: float beats int, wider beats narrower.

    float16/bfloat16 mixed with each other promote to float32. Integer mixes of equal width and
    different signedness go to the unsigned type, as in C.
    """
    if a is b:
        return a
    if {a, b} == {DType.FLOAT16, DType.BFLOAT16}:
        return DType.FLOAT32
    return a if _rank(a) >= _rank(b) else b
