"""Outputs in the inputs' kind on the host targets, hints in the inputs' library, empty calls.

`api.TCFunction` calls in here around the compiled paths:

* `in_input_kind`: on the ``cpu`` and ``numpy`` targets a kernel writes numpy arrays; when the
  first array input is a torch CPU tensor the outputs go back as torch tensors (sharing the
  memory, no copy), as DESIGN.md §3 promises ("outputs come back in the input's kind").
* `convert_hint`: the conversion a dtype error suggests, in the input's own library
  (``x.float()`` for torch, ``x.astype(cupy.float32)`` for CuPy, ``x.astype(np.float32)``).
* `empty_call`: a call whose inputs have a dimension of extent 0 returns outputs of the shapes
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
from .errors import CallError

__all__ = ["array_library", "convert_hint", "empty_call", "given_outputs", "has_zero_extent",
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


def _first_array(fn_ir: Any, inputs: Sequence[Any]) -> Any:
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
    first = _first_array(fn_ir, inputs)
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


def _host_copy(x: Any) -> Any:
    library = array_library(x)
    if library == "torch":
        return torch_numpy(x.cpu())
    if library == "cupy":
        return x.get()
    return x


def _like(first: Any, a: np.ndarray) -> Any:
    """A host result in the kind of ``first`` (numpy, torch CPU/CUDA, CuPy)."""
    library = array_library(first)
    if library == "torch":
        return torch_from_numpy(a).to(first.device)
    if library == "cupy":
        import cupy

        with cupy.cuda.Device(first.device.id):
            return cupy.asarray(a)
    if hasattr(first, "__cuda_array_interface__"):
        raise CallError("a call with a 0-size input returns its outputs as numpy, torch or CuPy "
                        f"arrays; inputs of type {type(first).__name__} are not supported for it")
    return a


def empty_call(fn: Any, inputs: Sequence[Any], outputs: Sequence[Any] | None) -> Any:
    """The result of a call with a 0-size input (see the module docstring)."""
    from .binding import allocate_outputs, bind_host_inputs, check_outputs, output_shapes
    from .reference import run

    bound = bind_host_inputs(fn.ir, [_host_copy(x) for x in inputs], allow_empty=True)
    shapes = output_shapes(fn.ir, bound.sizes)
    for name, shape in shapes.items():
        if any(n < 0 for n in shape):
            given = ", ".join(f"{k}={v}" for k, v in bound.sizes.items())
            raise CallError(f"{fn.entry}: sizes {given} give output {name} the shape {shape}: "
                            "a negative extent (the program needs larger sizes)")
    given_outs = check_outputs(fn.ir, bound.sizes, outputs)
    outs = allocate_outputs(fn.ir, bound.sizes)
    if any(a.size for a in outs.values()):  # a reduction over an empty range: its identity
        run(fn.ir, bound.arrays, bound.sizes, outs)
    if given_outs is not None:
        for name, arr in given_outs.items():
            arr[...] = outs[name]
        return given_outputs(outputs)
    else:
        first = _first_array(fn.ir, inputs)
        results = tuple(outs[t.name] if first is None else _like(first, outs[t.name])
                        for t in fn.ir.outputs)
    return results[0] if len(results) == 1 else results
