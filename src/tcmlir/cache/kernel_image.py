"""A whole compiled cuda kernel as bytes: what a second process needs to skip the compiler.

A cuda `tcmlir.api.Kernel` is plain data once compiled: the `CudaKernelImage` (PTX, LLVM IR,
launch configurations, argument order, sizes, aligned tensors), the texts of its stages
(schedule tree, loops) and the function the passes compiled when an IR pass changed it
(split-K adds temporaries). `pack_cuda_kernel` turns those into one payload and
`unpack_cuda_kernel` makes a `Kernel` of it again, with a fresh runner (modules load lazily on
the first launch, so neither needs a GPU).

Two users:

* the artifact cache stores the payload as kind ``cuda-kernel`` (`cache.artifacts`), so a new
  process's first call of a cached kernel runs none of the passes, the isl AST, nor the LLVM
  IR generation (for matmul 4096^3 those are most of its ~8 s compile);
* the tuner's compile workers (`tune.evaluate`) compile candidates on the CPUs ahead of the GPU
  workers and hand them the payloads.

The payload is a zlib-compressed pickle of builtin values, the IR's dataclasses and the image's dataclasses;
its first field is `FORMAT`, and a payload of another format is refused (None), so the
caller compiles. Like the host object code in the same cache, a payload is trusted because
only this user can write the cache (`cache.trust`); it is never read from elsewhere.
"""

from __future__ import annotations

import dataclasses
import logging
import pickle
import zlib
from types import MappingProxyType
from typing import Any

__all__ = ["FORMAT", "pack_cuda_kernel", "unpack_cuda_kernel"]

FORMAT = "tcmlir-cuda-kernel-1"
log = logging.getLogger("tcmlir.cache")


def pack_cuda_kernel(kernel: Any) -> bytes:
    """The payload of a compiled cuda `Kernel` (its runner's image and its stage texts)."""
    image = kernel.runner.image
    fields = {
        "format": FORMAT,
        "image": dataclasses.replace(image, sizes=dict(image.sizes)),
        "schedule": kernel.schedule,
        "loops": kernel.loops,
        "compiled_ir": kernel.compiled_ir,
    }
    return zlib.compress(pickle.dumps(fields, protocol=pickle.HIGHEST_PROTOCOL), 1)


def unpack_cuda_kernel(payload: bytes) -> dict[str, Any] | None:
    """The fields `pack_cuda_kernel` stored (``image`` with its sizes read-only again), or None
    for a payload of another format or one that does not load (the caller compiles)."""
    try:
        fields = pickle.loads(zlib.decompress(payload))
    except Exception as exc:  # noqa: BLE001 - an unreadable payload is a miss, never a crash
        log.warning("tcmlir cache: a cuda-kernel payload did not load (%s: %s); compiling",
                    type(exc).__name__, exc)
        return None
    if not isinstance(fields, dict) or fields.get("format") != FORMAT:
        return None
    image = fields["image"]
    fields["image"] = dataclasses.replace(image, sizes=MappingProxyType(dict(image.sizes)))
    return fields
