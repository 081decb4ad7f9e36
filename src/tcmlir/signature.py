"""Input signatures: what about the inputs of a call changes the compiled code.

A `Signature` is (shape, dtype, strides) per input. The size values (`sizes`) are derived from
the shapes by binding the definition's size names. Both are hashable and JSON-friendly, for the
in-memory compile cache and the persistent cache keys.
"""

from __future__ import annotations

import json
from dataclasses import dataclass

__all__ = ["ArgSpec", "Signature"]


@dataclass(frozen=True)
class ArgSpec:
    shape: tuple[int, ...]
    dtype: str
    strides: tuple[int, ...]  # in elements, row-major contiguous for now


@dataclass(frozen=True)
class Signature:
    args: tuple[ArgSpec, ...]

    def to_json(self) -> str:
        return json.dumps([[list(a.shape), a.dtype, list(a.strides)] for a in self.args],
                          separators=(",", ":"))

    @classmethod
    def from_json(cls, text: str) -> Signature:
        return cls(tuple(ArgSpec(tuple(s), d, tuple(st)) for s, d, st in json.loads(text)))

    @property
    def ranks_and_dtypes(self) -> tuple[tuple[int, str], ...]:
        """What a parametric kernel depends on (sizes excluded)."""
        return tuple((len(a.shape), a.dtype) for a in self.args)
