"""Launching a compiled `CudaKernelImage`: inputs to the device, outputs back, kernels in order.

`CudaRunner` is what a cuda `tcmlir.api.Kernel` keeps in ``kernel.runner``: the image built by
`tcmlir.codegen.nvptx.compile_cuda` and, loaded lazily on the first launch (so compiling needs
no GPU), one CUDA module per device (``runner.cubin`` is the cubin the driver's linker made).

`launch_cuda(kernel, inputs, outputs)`:

* inputs are bound with `runtime.arrays.bind_device_inputs` (the same checks as the host path);
  numpy inputs are copied to the device, device arrays (torch/CuPy/DLPack) are used in place;
* outputs given with ``outputs=`` are written in place (host ones are copied in and back, since
  ``+=`` reads them); otherwise fresh **zero-filled** outputs are allocated in the kind of the
  inputs (numpy in -> numpy out, torch CUDA in -> torch CUDA out on the same device);
* temporaries live in zeroed device buffers, the gather error flag in a zeroed ``i32``;
* the kernels run in order on the legacy default stream (so torch's and CuPy's default streams
  see the results in order); after a sequence with gathers the flag is read back and a failed
  bounds check is a `CallError` naming the tensor, the statement and the source line;
* one output comes back bare, several as a tuple in ``->`` order.

`benchmark_cuda(kernel, inputs, runs)` times the whole sequence of launches with CUDA events,
inputs already on the device, after one warm-up run.
"""

from __future__ import annotations

import math
import threading
from collections.abc import Sequence
from typing import Any

import numpy as np

from .. import ir as tc
from ..errors import CallError, format_located
from .arrays import (
    ArrayKind,
    DeviceArrayView,
    DeviceOutput,
    allocate_like_kind,
    bind_device_inputs,
    stage_input,
    stage_output,
)
from .cuda import CudaRuntime, Module, get_runtime
from .cuda_memory import check, driver

__all__ = ["CudaRunner", "benchmark_cuda", "launch_cuda"]


class CudaRunner:
    """A `CudaKernelImage` and its modules, loaded on first use per device."""

    def __init__(self, image: Any, device: int = 0, runtime: CudaRuntime | None = None):
        self.image = image
        self.device = int(device)
        self._runtime = runtime
        self._modules: dict[int, Module] = {}
        self._lock = threading.Lock()
        self._source: Any = None  # the function's Source (set by launches): located messages

    def __repr__(self) -> str:
        names = ", ".join(k.name for k in self.image.kernels)
        return f"<CudaRunner {self.image.entry} [{names}] {self.image.arch}>"

    @property
    def runtime(self) -> CudaRuntime:
        return self._runtime or get_runtime()

    def module(self, device: int | None = None) -> Module:
        """The loaded module on ``device`` (default: the runner's), JIT-linked from the PTX."""
        device = self.device if device is None else int(device)
        with self._lock:
            mod = self._modules.get(device)
            if mod is None:
                mod = self.runtime.load_ptx(self.image.ptx, device, name=f"{self.image.entry}.ptx")
                self._modules[device] = mod
            return mod

    @property
    def cubin(self) -> bytes | None:
        """The cubin of the module loaded first (None before any launch)."""
        mod = self._modules.get(self.device) or next(iter(self._modules.values()), None)
        return None if mod is None else mod.cubin

    def run(self, buffers: Sequence[Any], sizes: Sequence[int], device: int) -> None:
        """Launch every kernel in order: ``buffers`` in `arg_order` (objects with ``.ptr``),
        ``sizes`` in `sizes_order`; checks the gather flag afterwards when there are gathers."""
        rt = self.runtime
        mod = self.module(device)
        err = rt.alloc(4, device)
        err.memset(0)
        args = [*buffers, *(np.int64(s) for s in sizes), err]
        for k in self.image.kernels:
            rt.launch(mod.function(k.name), k.grid, k.block, args)
        if any(k.has_gathers for k in self.image.kernels):
            code = int(err.copy_to_host(np.zeros(1, np.int32))[0])  # waits for the stream
            if code:
                raise self.gather_error(code)

    def gather_error(self, code: int) -> CallError:
        fn_name, gathers = self.image.entry, self.image.gathers
        if not 1 <= code <= len(gathers):
            return CallError(f"{fn_name}: the GPU kernel reported unknown error code {code}")
        g = gathers[code - 1]
        return CallError(f"{fn_name}: gather index out of bounds reading tensor {g.tensor} in "
                         f"statement {g.statement}{_where(self._source, g)}")


def _where(source: Any, g: Any) -> str:
    if source is None or g.span is None:
        return ""
    return "\n" + format_located(source, g.span, f"the gather of {g.tensor} is here")


# ---------------------------------------------------------------- binding a call


def _zero(view: DeviceArrayView) -> None:
    if view.nbytes:
        get_runtime().context(view.device_ordinal)
        check(driver.cuMemsetD8(driver.CUdeviceptr(view.ptr), 0, view.nbytes),
              f"cuMemsetD8({view.nbytes} bytes)")


def _device_of(views: Sequence[Any], default: int) -> int:
    for v in views:
        if isinstance(v, DeviceArrayView):
            return v.device_ordinal
    return default


def _check_compiled(kernel: Any, bound: Any) -> None:
    image = kernel.runner.image
    for name, value in image.sizes.items():
        if bound.sizes.get(name, value) != value:
            raise CallError(f"{image.entry} was compiled for {name}={value}, called with "
                            f"{name}={bound.sizes[name]}")
    options = getattr(kernel, "options", None)
    if bound.signature != kernel.signature and not getattr(options, "parametric", False):
        raise CallError(f"{image.entry}: kernel compiled for {kernel.signature.to_json()} "
                        f"called with {bound.signature.to_json()}")


def _stage_outputs(fn: tc.Function, sizes: dict[str, int], outputs: Sequence[Any] | None,
                   kind: ArrayKind, device: int) -> list[DeviceOutput]:
    shapes = [tuple(s.evaluate(sizes) for s in t.shape) for t in fn.outputs]
    if outputs is None:
        outs = []
        for t, shape in zip(fn.outputs, shapes, strict=True):
            out = allocate_like_kind(kind, shape, t.dtype, device)
            _zero(out.view)  # a fresh output starts at zero, like the other targets
            outs.append(out)
        return outs
    if isinstance(outputs, (np.ndarray, str)) or not isinstance(outputs, Sequence):
        outputs = (outputs,)
    if len(outputs) != len(fn.outputs):
        names = ", ".join(t.name for t in fn.outputs)
        raise CallError(f"{fn.name} has {len(fn.outputs)} output(s) ({names}), "
                        f"{len(outputs)} given with outputs=")
    outs = []
    for t, shape, x in zip(fn.outputs, shapes, outputs, strict=True):
        out = stage_output(x, f"output {t.name}", device=device)
        if out.view.dtype is not t.dtype or tuple(out.view.shape) != shape:
            raise CallError(f"{fn.name}: output {t.name} must be {t.dtype} of shape {shape}, got "
                            f"{out.view.dtype} of shape {tuple(out.view.shape)}")
        outs.append(out)
    return outs


class _NullBuffer:
    """The kernel argument of a temporary that lives on chip (``CudaKernelImage.on_chip``)."""

    ptr = 0


_NO_BUFFER = _NullBuffer()


class _Staged:
    """A bound call on the device: every tensor's view (arg order), sizes, outputs, keepalive."""

    def __init__(self, kernel: Any, inputs: Sequence[Any], outputs: Sequence[Any] | None,
                 fresh_kind: ArrayKind | None = None):
        fn: tc.Function = kernel.function.ir
        runner: CudaRunner = kernel.runner
        bound = bind_device_inputs(fn, inputs)
        _check_compiled(kernel, bound)
        views = [bound.views[t.name] for t in fn.inputs]
        self.device = _device_of(views, runner.device)
        self.sizes = [bound.sizes[s] for s in fn.sizes]
        staged: dict[str, Any] = {
            t.name: (v if isinstance(v, DeviceArrayView) else
                     stage_input(v.array, f"input {t.name}", device=self.device))
            for t, v in zip(fn.inputs, views, strict=True)}
        self.outputs = _stage_outputs(fn, bound.sizes, outputs, fresh_kind or bound.kind,
                                      self.device)
        for t, out in zip(fn.outputs, self.outputs, strict=True):
            staged[t.name] = out.view
        rt = runner.runtime
        on_chip = set(getattr(runner.image, "on_chip", ()))
        for t in fn.temporaries:
            if t.name in on_chip:  # kept in shared memory/registers or recomputed: no buffer
                staged[t.name] = _NO_BUFFER
                continue
            nbytes = math.prod(s.evaluate(bound.sizes) for s in t.shape) * t.dtype.itemsize
            buf = rt.alloc(max(nbytes, 1), self.device)
            buf.memset(0)
            staged[t.name] = buf
        self.buffers = [staged[name] for name in runner.image.arg_order]


def launch_cuda(kernel: Any, inputs: Sequence[Any], outputs: Sequence[Any] | None = None) -> Any:
    """Run a cuda `Kernel` on ``inputs`` (see the module docstring)."""
    runner: CudaRunner = kernel.runner
    runner._source = getattr(kernel.function.ir, "source", None)
    staged = _Staged(kernel, inputs, outputs)
    runner.run(staged.buffers, staged.sizes, staged.device)
    results = tuple(out.finish() for out in staged.outputs)
    return results[0] if len(results) == 1 else results


def benchmark_cuda(kernel: Any, inputs: Sequence[Any], runs: int = 5) -> list[float]:
    """Seconds per run of the whole kernel sequence (CUDA events), after one warm-up run."""
    runner: CudaRunner = kernel.runner
    runner._source = getattr(kernel.function.ir, "source", None)
    staged = _Staged(kernel, inputs, None, fresh_kind=ArrayKind.CUDA_ARRAY)
    runner.run(staged.buffers, staged.sizes, staged.device)  # warm-up (and the gather check)
    rt = runner.runtime
    mod = runner.module(staged.device)
    functions = [(mod.function(k.name), k.grid, k.block) for k in runner.image.kernels]
    err = rt.alloc(4, staged.device)
    err.memset(0)
    args = [*staged.buffers, *(np.int64(s) for s in staged.sizes), err]
    start, end = rt.event(staged.device), rt.event(staged.device)
    times = []
    for _ in range(max(1, int(runs))):
        start.record()
        for function, grid, block in functions:
            rt.launch(function, grid, block, args)
        end.record()
        times.append(_elapsed_s(start, end))
    return times


def _elapsed_s(start: Any, end: Any) -> float:
    from .cuda_memory import elapsed_ms

    return elapsed_ms(start, end) / 1e3

