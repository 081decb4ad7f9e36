"""A whole compiled cuda kernel as bytes: what a second process needs to skip the compiler.

A cuda `tcmlir.api.Kernel` is plain data once compiled: the `CudaKernelImage` (PTX, LLVM IR,
launch configurations, argument order, sizes, aligned tensors), the texts of its stages
(schedule tree, loops) and the function the passes compiled when an IR pass changed it
(split-K adds temporaries). `pack_cuda_kernel` turns those into one payload and
`unpack_cuda_kernel` gives them back, for `tcmlir.compiler.cuda_kernel_from` to make a
`Kernel` with a fresh runner (modules load lazily on the first launch, so neither needs a GPU).

Two users:

* the artifact cache stores the payload as kind ``cuda-kernel`` (`cache.artifacts`), so a new
  process's first call of a cached kernel runs none of the passes, the isl AST, nor the LLVM
  IR generation (for matmul 4096^3 those are most of its ~8 s compile);
* the tuner's compile workers (`tune.evaluate`) compile candidates on the CPUs ahead of the GPU
  workers and hand them the payloads.

The payload is zlib-compressed JSON, never a pickle (DESIGN.md §6: loading a cache entry must
not run code): dataclasses are written as ``{"c": name, "f": fields}``, enums as ``{"e": name,
"v": member}``, tuples as ``{"t": [...]}`` and mappings as ``{"m": [[key, value], ...]}``, and
reading builds only the classes of `_CLASSES` and `_ENUMS` (the IR's, the image's, spans and
sources). A payload of another `FORMAT`, or one that does not decode, is a miss (None): the
caller compiles.
"""

from __future__ import annotations

import dataclasses
import enum
import json
import logging
import zlib
from collections.abc import Mapping
from types import MappingProxyType
from typing import Any

from .. import ir
from ..codegen.lower import GatherSite
from ..codegen.nvptx_abi import CudaKernelImage, KernelLaunch
from ..dtypes import DType
from ..errors import Source, Span

__all__ = ["FORMAT", "pack_cuda_kernel", "unpack_cuda_kernel"]

FORMAT = "tcmlir-cuda-kernel-3"  # 3: each kernel takes its own tensors and sizes
log = logging.getLogger("tcmlir.cache")

_CLASSES = {cls.__name__: cls for cls in (
    ir.SizeExpr, ir.Tensor, ir.Const, ir.Index, ir.Size, ir.Read, ir.Unary, ir.Binary, ir.Select,
    ir.Call, ir.Cast, ir.IndexRange, ir.Statement, ir.Function, Source, Span, GatherSite,
    KernelLaunch, CudaKernelImage)}
_ENUMS = {cls.__name__: cls for cls in (ir.Role, ir.Reduction, DType)}


def _encode(x: Any) -> Any:
    if x is None or isinstance(x, bool | int | float | str):
        return x
    if isinstance(x, enum.Enum):
        return {"e": type(x).__name__, "v": x.name}
    if dataclasses.is_dataclass(x) and not isinstance(x, type):
        name = type(x).__name__
        if _CLASSES.get(name) is not type(x):
            raise TypeError(f"cuda-kernel payload: {type(x).__qualname__} is not serialisable")
        return {"c": name, "f": {f.name: _encode(getattr(x, f.name))
                                 for f in dataclasses.fields(x)}}
    if isinstance(x, tuple):
        return {"t": [_encode(v) for v in x]}
    if isinstance(x, list):
        return [_encode(v) for v in x]
    if isinstance(x, Mapping):
        return {"m": [[_encode(k), _encode(v)] for k, v in x.items()]}
    raise TypeError(f"cuda-kernel payload: a {type(x).__qualname__} is not serialisable")


def _decode(x: Any) -> Any:
    if isinstance(x, list):
        return [_decode(v) for v in x]
    if not isinstance(x, dict):
        return x
    if "t" in x:
        return tuple(_decode(v) for v in x["t"])
    if "m" in x:
        return {_decode(k): _decode(v) for k, v in x["m"]}
    if "e" in x:
        return _ENUMS[x["e"]][x["v"]]
    cls = _CLASSES[x["c"]]
    return cls(**{name: _decode(value) for name, value in x["f"].items()})


def pack_cuda_kernel(kernel: Any) -> bytes:
    """The payload of a compiled cuda `Kernel` (its runner's image and its stage texts)."""
    fields = {"format": FORMAT, "image": kernel.runner.image, "schedule": kernel.schedule,
              "loops": kernel.loops, "compiled_ir": kernel.compiled_ir}
    text = json.dumps(_encode(fields), separators=(",", ":"))
    return zlib.compress(text.encode("utf-8"), 1)


def unpack_cuda_kernel(payload: bytes) -> dict[str, Any] | None:
    """The fields `pack_cuda_kernel` stored (``image`` with its sizes read-only again), or None
    for a payload of another format or one that does not decode (the caller compiles)."""
    try:
        fields = _decode(json.loads(zlib.decompress(payload).decode("utf-8")))
        if not isinstance(fields, dict) or fields.get("format") != FORMAT:
            return None
        image = fields["image"]
        if not isinstance(image, CudaKernelImage):
            raise TypeError(f"the image is a {type(image).__name__}")
        fields["image"] = dataclasses.replace(image, sizes=MappingProxyType(dict(image.sizes)))
        return fields
    except Exception as exc:  # noqa: BLE001 - an unreadable payload is a miss, never a crash
        log.warning("tcmlir cache: a cuda-kernel payload did not load (%s: %s); compiling",
                    type(exc).__name__, exc)
        return None
