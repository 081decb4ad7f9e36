"""The warm calls of a host plan (``target="cpu"``) for the inputs' kind: numpy, torch CPU, buffers.

Place: `tcmlir.api.TCFunction._launch` files what `host_calls` returns under the inputs'
`signature.call_key` after a call with them passed every check; a later call with an equal
key goes straight to it (`TCFunction.__call__`), and `TCFunction._benchmark` times it (the
call a user makes, `WARM_CALL`).

* numpy arrays (C-contiguous) and scalars: `host_plan.HostPlan.call` as it is.
* torch CPU tensors (contiguous; a tensor that requires grad is read through its data, as
  the full path reads ``x.detach()``): the same plan, each tensor's ``data_ptr()`` taken as
  its address (no numpy view made per call) and the outputs, fresh numpy arrays, returned as
  tensors sharing their memory (``torch.from_numpy``) when the first array input is a torch
  tensor, as `array_kinds.in_input_kind` does. The call key of a torch tensor does not say
  which device it is on (``get_device()`` is -1 on the CPU and on the ``meta`` device), so
  the call checks ``is_cpu`` of each tensor and returns `MISS` when one is not: the full
  path then says what is wrong.

* objects exposing only the buffer protocol (``array.array``, ``memoryview``,
  ``bytearray``, C-contiguous): each read as a numpy view (``np.asarray(memoryview(x))``, as
  the full binder reads it) before the plan's call; outputs are numpy arrays.

Inputs of any other kind (non-contiguous arrays, other array libraries, ...) are not
`host_ready`: they bind in full on every call, as before.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import numpy as np

from ..array_kinds import array_library, torch_from_numpy
from ..binding import buffer_view
from ..config import hot_path_token
from ..errors import CallError
from ..signature import call_key
from .torch_fast import MISS

__all__ = ["WARM_CALL", "host_calls", "host_ready"]

#: What `TCFunction._benchmark` times on the host when every input is `host_ready`.
WARM_CALL = "warm call (the prepared plan a repeated call takes, fresh outputs each run)"

_SCALARS = (bool, int, float)


def _is_torch_tensor(x: Any) -> bool:
    return array_library(x) == "torch" and hasattr(x, "data_ptr") and hasattr(x, "is_cpu")


def host_ready(x: Any) -> bool:
    """Whether a host plan's warm call takes ``x`` as it is (no copy, no conversion)."""
    cls = type(x)
    if cls is np.ndarray:
        return bool(x.flags.c_contiguous)
    if cls in _SCALARS or isinstance(x, np.generic):
        return True
    if _is_torch_tensor(x):
        return bool(x.is_cpu and x.is_contiguous() and x.layout is _torch().strided
                    and not x.is_neg() and not x.is_conj())
    if _is_buffer(x):
        return memoryview(x).c_contiguous
    return False


def _is_buffer(x: Any) -> bool:
    """An object keyed by what its buffer exposes (`signature.call_key`)."""
    return not isinstance(x, np.generic | np.ndarray | bool | int | float) \
        and array_library(x) == "numpy" and call_key((x,)) is not None \
        and buffer_view(x) is not None


def _torch() -> Any:
    import torch

    return torch


def host_calls(plan: Any, fn_ir: Any, inputs: Sequence[Any]) -> tuple[Any, ...]:
    """``(call(inputs, stream), plain(inputs), None, entry)`` for inputs of this kind and
    call key (every one `host_ready`), as `TCFunction._remember` takes them: ``plain`` runs
    the plan and returns the outputs in the inputs' kind, or `MISS` (torch inputs not on the
    CPU); ``call`` also refuses a ``stream``; ``entry(key, token)`` (every input a torch
    tensor, else None): ``plain`` guarded by the key's class, shape, dtype and strides and
    the hot-path knobs, tried before the call key is computed (as a torch CUDA plan's)."""
    tensors = tuple(i for i, x in enumerate(inputs) if _is_torch_tensor(x))
    run = plan.call
    buffers = tuple(i for i, x in enumerate(inputs) if _is_buffer(x))
    if buffers:
        run = _viewing(run, buffers)
    if tensors:
        first = next((x for t, x in zip(fn_ir.inputs, inputs, strict=False) if t.rank > 0),
                     None)
        wrap = _torch_outputs(plan) if first is not None and _is_torch_tensor(first) else None
        plain = _torch_call(run, tensors, wrap)
    else:
        plain = run
    name = plan.kernel.fn.name

    def call(inputs: Sequence[Any], stream: Any) -> Any:
        if stream is not None:
            raise CallError(f"{name}: stream= is for target='cuda'; this kernel runs on the "
                            "host")
        return plain(inputs)

    entry = _torch_entry(plain) if len(tensors) == len(inputs) else None
    return call, plain, None, entry


def _torch_entry(plain: Callable[[Sequence[Any]], Any]
                 ) -> Callable[[tuple, tuple], Callable[[Sequence[Any]], Any]]:
    def make_entry(key: tuple, token: tuple) -> Callable[[Sequence[Any]], Any]:
        checks = tuple((cls, shape, dtype, strides) for cls, shape, dtype, strides, *_ in key)
        n = len(checks)

        def entry(inputs: Sequence[Any]) -> Any:
            if len(inputs) != n:
                return MISS
            for x, (cls, shape, dtype, strides) in zip(inputs, checks, strict=True):
                if x.__class__ is not cls or x.dtype is not dtype or x.shape != shape \
                        or x.stride() != strides:
                    return MISS
            if hot_path_token() != token:
                return MISS
            return plain(inputs)

        return entry

    return make_entry


def _viewing(run: Callable[[Sequence[Any]], Any], buffers: tuple[int, ...]
             ) -> Callable[[Sequence[Any]], Any]:
    """``run`` on the inputs with each buffer-protocol object at ``buffers`` read as a numpy
    array (a view, as the full binder's)."""
    def call(inputs: Sequence[Any]) -> Any:
        inputs = list(inputs)
        for i in buffers:
            inputs[i] = np.asarray(memoryview(inputs[i]))
        return run(inputs)

    return call


def _torch_outputs(plan: Any) -> Callable[[Any], Any]:
    """The plan's numpy output(s) as torch tensors sharing their memory."""
    dtypes = [d for _, _, d, _ in plan.fresh_outputs]
    convert = (_torch().from_numpy if all(np.dtype(d).name != "bfloat16" for d in dtypes)
               else torch_from_numpy)
    if len(dtypes) == 1:
        return convert
    return lambda outs: tuple(convert(o) for o in outs)


def _torch_call(run: Callable[[Sequence[Any]], Any], tensors: tuple[int, ...],
                wrap: Callable[[Any], Any] | None) -> Callable[[Sequence[Any]], Any]:
    if len(tensors) == 1:
        (i,) = tensors

        def plain(inputs: Sequence[Any]) -> Any:
            if not inputs[i].is_cpu:
                return MISS
            out = run(inputs)
            return out if wrap is None else wrap(out)
    else:
        def plain(inputs: Sequence[Any]) -> Any:
            for i in tensors:
                if not inputs[i].is_cpu:
                    return MISS
            out = run(inputs)
            return out if wrap is None else wrap(out)

    return plain
