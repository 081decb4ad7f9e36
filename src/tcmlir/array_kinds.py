"""Outputs in the inputs' kind on the host targets, hints in the inputs' library, empty calls.

`api.TCFunction` calls in here around the compiled paths:

* `in_input_kind`: on the ``cpu`` and ``numpy`` targets a kernel writes numpy arrays; when the
  first array input is a torch CPU tensor the outputs go back as torch tensors (sharing the
  memory, no copy), as DESIGN.md §3 promises ("outputs come back in the input's kind").
* `convert_hint`: the conversion a dtype error suggests, in the input's own library
  (``x.float()`` for torch, ``x.astype(cupy.float32)`` for CuPy, ``x.astype(np.float32)``).
* `empty_calls.empty_call` (its own module: it binds through `binding`, which imports this
  one): a call whose inputs have a dimension of extent 0 returns outputs of the shapes
  the sizes give (empty where a size is 0, the reduction's identity where only a reduced
  extent is 0), as numpy and torch do, on every target. Nothing is compiled and no kernel is
  launched (a CUDA grid of 0 blocks is an error): the reference interpreter computes the
  result, which costs one pass over the (non-empty) outputs at most.

torch and cupy are imported only when the user's objects are theirs.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np

from .dtypes import DType

__all__ = ["array_library", "convert_hint", "first_array", "given_outputs", "has_zero_extent",
           "in_input_kind", "torch_from_numpy", "torch_numpy"]

# torch's conversion methods (``x.float()``); other dtypes are spelt ``x.to(torch.<dtype>)``
_TORCH_METHODS = {
    DType.FLOAT32: "float", DType.FLOAT64: "double", DType.FLOAT16: "half",
    DType.BFLOAT16: "bfloat16", DType.INT64: "long", DType.INT32: "int", DType.INT16: "short",
    DType.INT8: "char", DType.UINT8: "byte", DType.BOOL: "bool",
}


def array_library(x: Any) -> str:
    """``torch``, ``cupy`` or ``numpy`` (anything else is treated as numpy-like)."""
    top = type(x).__module__.split(".")[0]
    return top if top in ("torch", "cupy") else "numpy"


def convert_hint(x: Any, dtype: DType, name: str = "x") -> str:
    """How to convert ``x`` to ``dtype`` in its own library, e.g. ``x.float()``."""
    library = array_library(x)
    if library == "torch":
        method = _TORCH_METHODS.get(dtype)
        return f"{name}.{method}()" if method else f"{name}.to(torch.{dtype.value})"
    if library == "cupy":
        return f"{name}.astype(cupy.{dtype.value})"
    if dtype is DType.BFLOAT16:
        return f"{name}.astype(ml_dtypes.bfloat16)"
    return f"{name}.astype(np.{dtype.value})"


def first_array(fn_ir: Any, inputs: Sequence[Any]) -> Any:
    """The first input of rank > 0 (what decides the outputs' kind), or None."""
    return next((x for t, x in zip(fn_ir.inputs, inputs, strict=False) if t.rank > 0), None)


def torch_from_numpy(a: np.ndarray) -> Any:
    import torch

    if a.dtype.name == "bfloat16":  # ml_dtypes' bfloat16: torch reads it through int16
        return torch.from_numpy(a.view(np.int16)).view(torch.bfloat16)
    return torch.from_numpy(a)


def in_input_kind(fn_ir: Any, inputs: Sequence[Any], result: Any) -> Any:
    """``result`` (numpy output(s) of a host target) as torch tensors when the first array
    input is a torch CPU tensor; else unchanged."""
    first = first_array(fn_ir, inputs)
    if first is None or array_library(first) != "torch":
        return result
    if isinstance(result, tuple):
        return tuple(torch_from_numpy(r) for r in result)
    return torch_from_numpy(result)


def given_outputs(outputs: Any) -> Any:
    """What a call with ``outputs=`` returns: the user's own objects (one, or a tuple)."""
    given = tuple(outputs) if isinstance(outputs, list | tuple) else (outputs,)
    return given[0] if len(given) == 1 else given


def has_zero_extent(inputs: Sequence[Any]) -> bool:
    """Whether some input array has a dimension of extent 0."""
    for x in inputs:
        shape = getattr(x, "shape", None)
        if shape and 0 in tuple(shape):
            return True
    return False


def torch_numpy(t: Any) -> np.ndarray:
    """A numpy view of a torch CPU tensor (no copy; bfloat16 through ml_dtypes, a tensor that
    requires grad detached)."""
    t = t.detach()
    if str(t.dtype) == "torch.bfloat16":
        import torch

        return t.view(torch.int16).numpy().view(DType.BFLOAT16.numpy)
    return t.numpy()
