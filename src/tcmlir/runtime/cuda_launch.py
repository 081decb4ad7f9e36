"""Launching a compiled `CudaKernelImage`: the runner, its launch plans, and one-off calls.

`CudaRunner` is what a cuda `tcmlir.api.Kernel` keeps in ``kernel.runner``: the image built by
`tcmlir.codegen.nvptx.compile_cuda` and, loaded lazily on the first launch (so compiling needs
no GPU), one CUDA module per device (``runner.cubin`` is the cubin the driver's linker made),
and the `launch_plan.CudaPlan` of each (signature, input types, device) it was called with.

`launch_cuda(kernel, inputs, outputs, stream=...)` is the full-binding path of a call:

* inputs are bound with `runtime.arrays.bind_device_inputs` (the same checks as the host path);
  numpy inputs are copied to the device, device arrays (torch/CuPy/DLPack) are used in place;
* the call's plan is found or made (the first call of a signature inside a CUDA graph capture
  is refused: plans allocate when they are made, so call once before capturing);
* outputs given with ``outputs=`` are written in place (host ones are copied in and back, since
  ``+=`` reads them); otherwise fresh outputs are made in the kind of the inputs (numpy in ->
  numpy out, torch CUDA in -> torch CUDA out on the same device), zero-filled unless their first
  statement sets every element;
* the kernels run in order on the call's stream (see `streams`); a failed gather bounds check
  is a `CallError` naming the tensor, the statement and the source line (when it is reported
  depends on ``TCMLIR_GATHER_CHECK``, see `launch_plan`);
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
from .arrays import DeviceArray, bind_device_inputs, check_output_overlap
from .cuda import CudaRuntime, Module, get_runtime
from .cuda_memory import DeviceBuffer, check, driver, elapsed_ms

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
        self._plans: dict[tuple, Any] = {}

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

    def plan(self, fn: tc.Function, bound: Any, inputs: Sequence[Any], stream: Any = None) -> Any:
        """The launch plan for these (already checked) inputs, made on first use."""
        from ..config import get_config
        from .launch_plan import CudaPlan

        key = (bound.signature, tuple(type(x) for x in inputs), bound.kind, bound.device)
        plan = self._plans.get(key)
        if plan is None:
            rt = self.runtime
            rt.context(bound.device)
            from .streams import memory_for

            handle = (memory_for(bound.kind, rt, bound.device).current_stream() if stream is None
                      else _stream_handle(stream))
            if _capturing(handle):
                raise CallError(
                    f"{self.image.entry}: the first call for this signature is inside a CUDA "
                    "graph capture; making its launch plan allocates device memory, which a "
                    "capture forbids. Call it once before capturing (a warm-up, as "
                    "torch.cuda.graph asks for anyway).")
            plan = CudaPlan(self, fn, bound, [type(x) for x in inputs], rt, self.gather_error)
            with self._lock:
                plan = self._plans.setdefault(key, plan)
        mode = get_config().gather_check
        plan.gather_sync = mode == "sync" or (mode == "auto" and not bound.kind.on_device)
        return plan

    @property
    def plans(self) -> list[Any]:
        return list(self._plans.values())

    def check_errors(self) -> None:
        """Wait for the device and raise any gather failure of this kernel not reported yet."""
        for plan in self.plans:
            plan.check_errors()

    def gather_error(self, code: int) -> CallError:
        fn_name, gathers = self.image.entry, self.image.gathers
        if not 1 <= code <= len(gathers):
            return CallError(f"{fn_name}: the GPU kernel reported unknown error code {code}")
        g = gathers[code - 1]
        dim = f" in dimension {g.dim}" if getattr(g, "dim", -1) >= 0 else ""
        return CallError(f"{fn_name}: gather index out of bounds{dim} reading tensor {g.tensor} "
                         f"in statement {g.statement}{_where(self._source, g)}")


def _where(source: Any, g: Any) -> str:
    if source is None or g.span is None:
        return ""
    return "\n" + format_located(source, g.span, f"the gather of {g.tensor} is here")


# ---------------------------------------------------------------- a call


def _stream_handle(stream: Any) -> int:
    from .streams import stream_handle

    return stream_handle(stream)


def _capturing(handle: int) -> bool:
    result = driver.cuStreamIsCapturing(handle)
    implicit = getattr(driver.CUresult, "CUDA_ERROR_STREAM_CAPTURE_IMPLICIT", None)
    if implicit is not None and result[0] == implicit:
        return True  # the legacy stream while another stream captures in global mode
    status = check(result, "cuStreamIsCapturing", context=f"stream {handle:#x}")
    return status != driver.CUstreamCaptureStatus.CU_STREAM_CAPTURE_STATUS_NONE


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


def _given_outputs(fn: tc.Function, outputs: Any) -> Sequence[Any]:
    if isinstance(outputs, (np.ndarray, str)) or not isinstance(outputs, Sequence):
        outputs = (outputs,)
    if len(outputs) != len(fn.outputs):
        names = ", ".join(t.name for t in fn.outputs)
        raise CallError(f"{fn.name} has {len(fn.outputs)} output(s) ({names}), "
                        f"{len(outputs)} given with outputs=")
    return outputs


def launch_cuda(kernel: Any, inputs: Sequence[Any], outputs: Sequence[Any] | None = None, *,
                stream: Any = None, bound: Any = None) -> tuple[Any, Any]:
    """Run a cuda `Kernel` on ``inputs`` (see the module docstring); returns the result and
    the plan that ran it."""
    runner: CudaRunner = kernel.runner
    fn: tc.Function = kernel.function.ir
    runner._source = getattr(fn, "source", None)
    if bound is None:
        bound = bind_device_inputs(fn, inputs)
    _check_compiled(kernel, bound)
    given = None if outputs is None else _given_outputs(fn, outputs)
    if given is not None:
        check_output_overlap(fn, bound, given, runner.runtime)
    plan = runner.plan(getattr(kernel, "compiled_ir", None) or fn, bound, inputs, stream)
    return plan.call(inputs, stream, given), plan


BENCH_CALLS_PER_SAMPLE = 10


def benchmark_cuda(kernel: Any, inputs: Sequence[Any], runs: int = 5) -> list[float]:
    """Seconds per run of the whole kernel sequence (CUDA events), after one warm-up run: each
    of the ``runs`` samples is the mean of up to `BENCH_CALLS_PER_SAMPLE` calls queued back to
    back (fewer for calls of over 0.1 ms; one for calls of a millisecond or more), after an
    untimed lead call that keeps the GPU busy while they are queued. With torch
    CUDA tensors a run is what ``fn(*inputs)`` does (fresh outputs from torch's allocator, on
    torch's current stream); other inputs are staged once and write preallocated outputs."""
    runner: CudaRunner = kernel.runner
    fn: tc.Function = kernel.function.ir
    runner._source = getattr(fn, "source", None)
    bound = bind_device_inputs(fn, inputs)
    _check_compiled(kernel, bound)
    staged = bound.staged(runner.runtime)  # host inputs copied once, outside the timing
    device_inputs = [DeviceArray(staged[t.name].owner, staged[t.name].shape, staged[t.name].dtype)
                     if isinstance(staged[t.name].owner, DeviceBuffer) else inputs[i]
                     for i, t in enumerate(fn.inputs)]
    rebound = bind_device_inputs(fn, device_inputs)
    rt = runner.runtime
    plan = runner.plan(getattr(kernel, "compiled_ir", None) or fn, rebound, device_inputs)
    if getattr(plan, "_torch_call", None) is not None and all(
            x is y for x, y in zip(device_inputs, inputs, strict=True)):
        # torch tensors: time what a call of the function does (outputs and temporaries from
        # torch's allocator, torch's current stream), not a path no caller takes
        def call() -> None:
            plan.call(device_inputs)
    else:
        outs = [DeviceArray(rt.alloc(max(1, math.prod(s.evaluate(bound.sizes) for s in t.shape))
                                     * t.dtype.itemsize, rebound.device),
                            tuple(s.evaluate(bound.sizes) for s in t.shape), t.dtype)
                for t in fn.outputs]

        def call() -> None:
            plan.call(device_inputs, 0, outs)
    start, end = rt.event(plan.device), rt.event(plan.device)
    start.record()
    call()  # warm-up, timed to choose the calls per sample
    end.record()
    once = elapsed_ms(start, end) / 1e3
    plan.check_errors()
    # A sample times `inner` calls queued back to back after an untimed lead call, so the
    # host's enqueue time of a call overlaps the kernels before it instead of being counted as
    # idle GPU time (one call per event pair counted ~20 us of host time into every sample: a
    # 124 us row sum measured 146 us; a 0.55 ms elementwise chain lost 3%). The start event
    # fires when the lead call ends. Calls of a millisecond or more are timed one per sample.
    inner = max(1, min(BENCH_CALLS_PER_SAMPLE, int(1e-3 / max(once, 1e-9))))
    times = []
    for _ in range(max(1, int(runs))):
        call()  # the lead call
        start.record()
        for _ in range(inner):
            call()
        end.record()
        times.append(elapsed_ms(start, end) / 1e3 / inner)
    plan.check_errors()
    return times
