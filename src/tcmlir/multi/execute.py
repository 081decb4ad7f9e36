"""Running a `SplitPlan`: each part an ordinary call of the TC function at the chunk's size.

Place: ``fn(*inputs, devices=[...])`` → `split_call` → an executor made once per (input
types, shapes, devices, options): `cuda_split.SplitExecutor` (per part the single-device
kernel's `launch_plan.CudaPlan`) or `HostSplitExecutor`. Why sub-calls rather than one kernel
with an offset argument: the part's kernel is then exactly the kernel of a one-device call at
that size — same code, same compile cache, same tuned options (`multi.tune`) — and the code
generators need no change. It needs every tensor the split touches to be cut along its
leading dimension, which `plan` proves (or refuses the split).

On the host targets (``cpu``, ``numpy``) the parts run one after another on row slices, which
checks a plan against the reference without a GPU (no speed-up is meant).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from ..config import hot_path_token
from ..errors import CallError
from ..signature import call_key
from .inputs import host_slab, locate_inputs, placeholder, size_values
from .plan import SplitPlan, make_plan
from .shards import Sharded

__all__ = ["HostSplitExecutor", "SplitKernel", "call_sharded", "locate_inputs", "split_call",
           "split_kernel"]


@dataclass
class SplitKernel:
    """What ``fn.compile(*inputs, devices=[...])`` returns: the plan and each part's kernel."""

    plan: SplitPlan
    kernels: tuple[Any, ...]   # `tcmlir.api.Kernel` per part (shared when sizes are equal)

    def __str__(self) -> str:
        return str(self.plan)


def _part_options(fn: Any, options: Any, host_inputs: Sequence[Any]) -> Any:
    """The options of a part's kernel: those given (without ``devices``), else the function's
    factory on the part's own inputs (so tuned options of the chunk's signature are found),
    else None: what a one-device call at the part's sizes uses (`TCFunction._compile`)."""
    if options is not None:
        return options.on_devices()
    if fn.options_factory is not None:
        return fn.options_factory(fn, host_inputs).on_devices()
    return None


def split_kernel(fn: Any, inputs: Sequence[Any], devices: Sequence[int], options: Any,
                 target: str, arch: str | None, output_device: int | None = None
                 ) -> tuple[SplitKernel, dict[str, Any]]:
    """The plan and each part's compiled kernel (no launch; a named arch needs no GPU)."""
    views, where = locate_inputs(fn.ir, inputs)
    plan = make_plan(fn.ir, size_values(fn.ir, views), devices, where, output_device)
    kernels = []
    reads_data = options is None and fn.options_factory is not None
    for part in plan.parts:
        # binding needs shapes and dtypes only (untouched placeholders); an options factory
        # gets the part's real inputs (it may tune or verify on them)
        sample = [host_slab(views[t.name], *part.slabs.get(t.name, (0, 0)), t.rank)
                  if reads_data else placeholder(views[t.name], part.shape(t), t.rank)
                  for t in fn.ir.inputs]
        opts = _part_options(fn, options, sample)
        kernels.append(fn._compile(sample, opts, target, arch)[0])
    return SplitKernel(plan, tuple(kernels)), views


def split_call(fn: Any, inputs: Sequence[Any], devices: Sequence[int], options: Any,
               target: str, *, outputs: Any = None, stream: Any = None,
               output_device: int | None = None, shards: bool = False) -> Any:
    """``fn(*inputs, devices=devices)``: the executor of this call's shapes, made once
    (``shards``: outputs left on the parts' devices, see `multi.shards`).

    A warm call of numpy, torch or CuPy arrays and scalars finds its executor under the
    inputs' `signature.call_key` (type, shape, dtype, strides, device: what decides the plan)
    and runs it on the inputs directly; other inputs (CUDA-array-interface and DLPack objects,
    shards) are located first (`inputs.locate_inputs`), their devices being part of the key."""
    if outputs is not None:
        raise CallError(f"{fn.entry}: outputs= is not supported with devices= (the outputs "
                        "are gathered on the output device); call without outputs=")
    head = ("split", tuple(devices), output_device, options.to_json() if options else None,
            target, shards, hot_path_token())
    executors = fn.__dict__.get("_split_executors")
    if executors is None:
        executors = fn.__dict__.setdefault("_split_executors", {})
    fast = call_key(inputs)
    if fast is not None:
        executor = executors.get((*head, fast))
        if executor is not None:
            return executor(inputs, stream)
    views, where = locate_inputs(fn.ir, inputs)
    key = (*head, tuple(_describe(x) for x in inputs), tuple(where.values()), _alignment(views))
    executor = executors.get(key)
    if executor is None:
        kernel, _ = split_kernel(fn, inputs, devices, options, target, None, output_device)
        if target == "cuda":
            from .cuda_split import SplitExecutor

            executor = SplitExecutor(fn, kernel, shards=shards)
        else:
            executor = HostSplitExecutor(fn, kernel)
        executors[key] = executor
    result = executor(inputs, stream, views)
    if fast is not None:  # the call passed every check: later ones take the direct path
        executors[(*head, fast)] = executor
    return result


def _alignment(views: dict[str, Any]) -> tuple:
    """The low bits of the device inputs' pointers (in-place slabs' kernels specialise on
    16-byte alignment, `signature.Signature`); host inputs are copied, aligned."""
    out = []
    for view in views.values():
        if isinstance(view, Sharded):
            out.append(tuple(s.ptr & 15 for s in view.shards))
        else:
            out.append(getattr(view, "ptr", 0) & 15)
    return tuple(out)


def _describe(x: Any) -> tuple:
    """What about an input decides the plan: its type, shape, dtype and device."""
    if isinstance(x, Sharded):
        return (Sharded, x.shape, str(x.dtype), x.locations)
    shape = getattr(x, "shape", ())
    dtype = str(getattr(x, "dtype", type(x).__name__))
    device = getattr(x, "device", None)
    if device is None and hasattr(x, "__cuda_array_interface__"):
        device = ("cai", x.__cuda_array_interface__["data"][0] is not None)
    return (type(x), tuple(shape), dtype, str(device))


# ---------------------------------------------------------------- host targets


class HostSplitExecutor:
    """The parts one after another on row slices (target cpu / numpy)."""

    def __init__(self, fn: Any, kernel: SplitKernel):
        self.fn, self.plan, self.kernels = fn, kernel.plan, kernel.kernels

    def __call__(self, inputs: Sequence[Any], stream: Any = None,
                 views: dict[str, Any] | None = None) -> Any:
        if stream is not None:
            raise CallError(f"{self.fn.entry}: stream= is for target='cuda'")
        fn = self.fn.ir
        if any(isinstance(x, Sharded) for x in inputs):
            raise CallError(f"{fn.name}: sharded inputs live on GPUs: call with target='cuda'")
        if views is None:
            views, _ = locate_inputs(fn, inputs)
        if size_values(fn, views) != dict(self.plan.sizes):
            raise CallError(f"{fn.name}: the split was planned for sizes {dict(self.plan.sizes)}")
        results = {}
        for t in fn.outputs:
            shape = tuple(e.evaluate(dict(self.plan.sizes)) for e in t.shape)
            results[t.name] = (np.empty(shape, t.dtype.numpy) if self.plan.covered[t.name]
                               else np.zeros(shape, t.dtype.numpy))
        for part, kernel in zip(self.plan.parts, self.kernels, strict=True):
            sub = [host_slab(views[t.name], *part.slabs.get(t.name, (0, 0)), t.rank)
                   for t in fn.inputs]
            out = kernel.launch(*sub)
            out = out if isinstance(out, tuple) else (out,)
            for t, value in zip(fn.outputs, out, strict=True):
                lo, hi = part.slabs[t.name]
                results[t.name][lo:hi] = value
        outs = tuple(results[t.name] for t in fn.outputs)
        return outs[0] if len(outs) == 1 else outs


# ---------------------------------------------------------------- CUDA


def call_sharded(fn: Any, *inputs: Any, devices: Sequence[int], options: Any = None) -> Any:
    """``fn(*inputs, devices=devices)`` with the outputs left on the parts' devices: one
    `Sharded` per output (a tuple for several). CUDA target only."""
    from ..targets import resolve_target

    target = resolve_target(fn.target)
    if target != "cuda":
        raise CallError(f"{fn.entry}: sharded outputs live on GPUs: target='cuda' only, "
                        f"this function runs on {target}")
    return split_call(fn, inputs, devices, options, target, shards=True)
