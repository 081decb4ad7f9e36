"""What a split call's parts receive and where its inputs live: shared by the CUDA executor
(`multi.cuda_split`) and what its first call prepares (`multi.prepared`), which imports nothing
of the executor.
"""

from __future__ import annotations

from typing import Any

__all__ = ["Slab", "input_devices"]


class Slab:
    """Rows of a tensor in device memory, as a CUDA array: what a part's sub-call receives."""

    def __init__(self, ptr: int, shape: tuple[int, ...], dtype: Any, owner: Any = None):
        from ..runtime.array_views import typestr

        self.shape, self.dtype, self.owner = shape, dtype, owner
        self.__cuda_array_interface__ = {"shape": shape, "typestr": typestr(dtype),
                                         "data": (ptr, False), "strides": None, "version": 3}


def input_devices(where: dict[str, Any]) -> set[int]:
    """The devices inputs live on (shards: every shard's)."""
    out: set[int] = set()
    for loc in where.values():
        if isinstance(loc, int):
            out.add(loc)
        elif loc is not None:
            out.update(d for d, _, _ in loc)
    return out
