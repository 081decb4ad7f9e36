"""A call with a 0-size input: outputs of the shapes the sizes give, computed by the reference.

A call whose inputs have a dimension of extent 0 returns outputs of the shapes the sizes give
(empty where a size is 0, the reduction's identity where only a reduced extent is 0), as numpy
and torch do, on every target (`array_kinds.has_zero_extent` tells such a call). Nothing is
compiled and no kernel is launched (a CUDA grid of 0 blocks is an error): the reference
interpreter computes the result, which costs one pass over the (non-empty) outputs at most.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np

from .array_kinds import array_library, first_array, given_outputs, torch_from_numpy, torch_numpy
from .binding import allocate_outputs, bind_host_inputs, check_outputs, output_shapes
from .errors import CallError

__all__ = ["empty_call"]


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
    from .reference import run  # the interpreter, loaded by the first such call

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
        first = first_array(fn.ir, inputs)
        results = tuple(outs[t.name] if first is None else _like(first, outs[t.name])
                        for t in fn.ir.outputs)
    return results[0] if len(results) == 1 else results
