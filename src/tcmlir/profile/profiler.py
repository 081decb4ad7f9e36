"""Profiling a call: time it, count its ideal work, put both against the ceilings, advise.

    profile_function(fn, inputs, options, runs)   # fn.profile(*inputs)
      (devices=[...]: `split_profile.profile_split`, the split call's parts and transfers)
      -> fn.compile(...) -> profile_kernel(kernel, inputs, runs)        # kernel.profile(*inputs)
           times:      the whole call (median of ``runs``; CUDA events on the GPU, a wall clock
                       on the host around the warm call a user makes; `Profile.timed` says
                       which) and each launched kernel on its own (`_cuda_times`, `_host_times`);
                       on the GPU also the host's wall clock per call in the launch path
                       (`_host_call_s`: the ``[host]`` advice)
           structure:  `structure.kernel_structures` (statements, mapping, strides, promotion)
           -> build_profile(kernel, times, ceilings): counts per kernel and for the call
              (`counts.count_work`), resources and occupancy (`occupancy`), the PTX's hot
              loop (`ptx_shape`), the roofline (`report.roofline`, each piece against the
              bandwidth of its read/write mix) and `advice.advise`

`build_profile` takes the times as arguments, so everything but the clock runs and is tested
without a GPU (a cuda kernel compiled for a named arch, times given by the test).
"""

from __future__ import annotations

import math
import statistics
import time
from collections.abc import Mapping, Sequence
from dataclasses import replace
from typing import Any

from .. import ir
from ..errors import TCError
from .advice import advise, advise_kernel
from .ceilings import Ceilings, ceilings_for
from .counts import WorkCounts, count_work
from .occupancy import KernelResources, theoretical_occupancy
from .ptx_shape import LoopShape, bank_conflicts, entry_bodies, inner_loop_shape
from .report import KernelProfile, Profile, roofline
from .structure import KernelStructure, kernel_structures

__all__ = ["build_profile", "kernel_resources", "profile_function", "profile_kernel"]


def profile_function(fn: Any, inputs: Sequence[Any], options: Any = None, runs: int = 20,
                     ceilings: Ceilings | Mapping[str, Any] | None = None,
                     devices: Sequence[int] | None = None) -> Profile:
    """``fn.profile(*inputs)``: compile, then `profile_kernel`; with ``devices`` (or
    ``options.devices``) the split call's profile (`split_profile.profile_split`)."""
    if devices is not None or (options is not None and options.devices):
        from .split_profile import profile_split

        return profile_split(fn, inputs, options.devices if devices is None else devices,
                             options, runs=runs, ceilings=ceilings)
    kernel = fn.compile(*inputs, options=options)
    return profile_kernel(kernel, inputs, runs=runs, ceilings=ceilings)


def profile_kernel(kernel: Any, inputs: Sequence[Any], *, runs: int = 20,
                   ceilings: Ceilings | Mapping[str, Any] | None = None) -> Profile:
    """Run ``kernel`` ``runs`` times on ``inputs`` (after a warm-up) and profile it."""
    if not isinstance(runs, int) or runs < 1:
        raise TCError(f"profile: runs must be a positive integer, got {runs!r}")
    ceil = ceilings_for("cpu" if kernel.target == "numpy" else kernel.target, ceilings)
    structures, state = _structures(kernel)
    host_s = 0.0
    if kernel.target == "cuda":
        whole, per, host_s = _cuda_times(kernel, inputs, runs)
        timed = "launch sequence (CUDA events)"
    else:
        whole, per, timed = _host_times(kernel, inputs, runs, len(structures))
    prof = build_profile(kernel, time_s=statistics.median(whole),
                         kernel_times=[statistics.median(t) for t in per], ceilings=ceil,
                         runs=runs, structures=structures,
                         kernel_fn=None if state is None else state.fn, host_s=host_s)
    prof.timed = timed
    return prof


def _structures(kernel: Any) -> tuple[tuple[KernelStructure, ...], Any]:
    if kernel.target == "numpy":
        fn = kernel.function.ir
        names = tuple(count_work(fn, kernel.sizes).statements)
        return (KernelStructure("reference", names),), None
    return kernel_structures(kernel)


def kernel_resources(kernel: Any) -> dict[str, KernelResources]:
    """Registers and shared memory per cuda kernel entry: from the driver when the module is
    loaded (a GPU ran it), else from ``ptxas -v``; {} off cuda or without either."""
    if kernel.target != "cuda":
        return {}
    from .occupancy import driver_resources, ptxas_resources

    if getattr(kernel.runner, "_modules", None):
        return driver_resources(kernel)
    from ..codegen.ptx_tools import find_ptxas

    if find_ptxas() is None:
        return {}
    return ptxas_resources(kernel.ptx, kernel.arch or "sm_90")


def build_profile(kernel: Any, *, time_s: float, kernel_times: Sequence[float],
                  ceilings: Ceilings, runs: int = 0,
                  structures: Sequence[KernelStructure] | None = None,
                  resources: Mapping[str, KernelResources] | None = None,
                  kernel_fn: ir.Function | None = None, host_s: float = 0.0) -> Profile:
    """The `Profile` of ``kernel`` for measured times (the whole call's and each kernel's).

    ``kernel_fn``: the function the kernels' statements belong to — the lowered state's,
    which passes such as ``inline-temporaries`` rewrite (default: lowered again here);
    ``host_s``: the host's seconds per call in the launch path (cuda)."""
    fn: ir.Function = kernel.function.ir
    sizes = {k: int(v) for k, v in kernel.sizes.items() if k in fn.sizes}
    if structures is None or kernel_fn is None:
        structures, state = _structures(kernel)
        kernel_fn = fn if state is None else state.fn
    if len(kernel_times) != len(structures):
        raise TCError(f"profile: {len(kernel_times)} kernel times for {len(structures)} kernels")
    if resources is None:
        resources = kernel_resources(kernel)
    target = kernel.target
    on_chip = set(getattr(getattr(kernel.runner, "image", None), "on_chip", ()) or ())
    in_memory = [t.name for t in kernel_fn.tensors if t.name not in on_chip]
    shapes = _loop_shapes(kernel, structures, kernel_fn) if target == "cuda" else {}
    kernels = []
    for i, (ks, t) in enumerate(zip(structures, kernel_times, strict=True)):
        others = {s for j, o in enumerate(structures) if j != i for s in o.statements}
        work = count_work(kernel_fn, sizes, ks.statements, global_tensors=in_memory,
                          outside_reads=_read_by(kernel_fn, others))
        kp = _kernel_profile(ks, t, work, ceilings, resources.get(ks.name), kernel.arch)
        kp.advice = advise_kernel(kernel_fn, ks, kp, work, ceilings, target,
                                  shapes.get(ks.name))
        kernels.append(kp)
    whole = count_work(fn, sizes)
    bw = ceilings.bandwidth_for(whole.bytes_read, whole.bytes_written)
    bound, fraction, raw = roofline(whole.flops, whole.bytes, time_s, ceilings, bw)
    prof = Profile(
        entry=fn.name, target=target, sizes=sizes, time_s=time_s, flops=whole.flops,
        bytes=whole.bytes, ops=whole.op_values(), bound=bound, roofline_fraction=fraction,
        kernels=kernels, advice=[], ceilings=ceilings, bytes_read=whole.bytes_read,
        bytes_written=whole.bytes_written, flops_formula=whole.flops_count.formula,
        bytes_formula=whole.bytes_formula(), exact=whole.exact, runs=runs, raw_fraction=raw,
        host_s=host_s, bandwidth_ceiling=bw)
    prof.advice = advise(fn, structures, kernels, prof, ceilings, target)
    return prof


def _read_by(fn: ir.Function, statements: set[str]) -> set[str]:
    out: set[str] = set()
    for name in statements:
        if name.endswith("_init"):
            continue
        stmt = fn.statements[int(name[1:])]
        out |= {e.tensor for e in ir.walk(stmt.rhs) if isinstance(e, ir.Read)}
    return out


def _kernel_profile(ks: KernelStructure, time_s: float, work: WorkCounts, ceil: Ceilings,
                    res: KernelResources | None, arch: str | None) -> KernelProfile:
    bw = ceil.bandwidth_for(work.bytes_read, work.bytes_written)
    bound, fraction, raw = roofline(work.flops, work.bytes, time_s, ceil, bw)
    kp = KernelProfile(ks.name, time_s, work.flops, work.bytes, work.op_values(),
                       ks.statements, bound, fraction, ks.grid, ks.block, raw_fraction=raw,
                       bandwidth_ceiling=bw)
    if res is not None and ks.block is not None:
        occ = theoretical_occupancy(math.prod(ks.block), res, arch or "sm_90")
        kp.registers, kp.shared_bytes = res.registers, res.shared_bytes
        kp.occupancy, kp.occupancy_limiter = occ.fraction, occ.limiter
        kp.blocks_per_sm = occ.blocks_per_sm
        kp.resources_from = res.source
    return kp


def _loop_shapes(kernel: Any, structures: Sequence[KernelStructure],
                 fn: ir.Function) -> dict[str, LoopShape]:
    """Per cuda kernel entry, its PTX's hot innermost loop (`ptx_shape`), with the bank
    conflicts of its widest shared loads at the strides the access relations give."""
    bodies = entry_bodies(kernel.ptx or "")
    out = {}
    for ks in structures:
        shape = inner_loop_shape(bodies.get(ks.name, []))
        if shape is None:
            continue
        worst, why, degree = 1, "", {}
        for a in ks.strides:
            if a.kind != "shared" or a.stride is None or shape.widest_load == 0:
                continue
            stride = abs(a.stride) * fn.tensor(a.tensor).dtype.itemsize
            n = bank_conflicts(stride, shape.widest_load)
            degree[a.tensor] = max(n, degree.get(a.tensor, 1))
            if n > worst:
                worst = n
                why = (f"{a.tensor}: neighbouring threads read {stride} bytes apart, "
                       f"{shape.widest_load}-byte loads")
        factor = sum(degree.values()) / len(degree) if degree else 1.0
        out[ks.name] = replace(shape, bank_conflicts=worst, why=why, conflict_factor=factor)
    return out


# ---------------------------------------------------------------- clocks


def _host_times(kernel: Any, inputs: Sequence[Any], runs: int,
                n_groups: int) -> tuple[list[float], list[list[float]], str]:
    """Wall-clock seconds of the whole call (`Kernel.benchmark`: on the cpu target the warm
    call a user's repeated call makes) and of each top-level loop group (cpu), or of the
    reference interpreter (numpy, one 'kernel'); and what the whole call's runs timed."""
    result = kernel.benchmark(*inputs, runs=runs + 1)
    whole = list(result[1:])  # the first run warms up
    if kernel.target == "numpy":
        return whole, [whole], result.path
    import ctypes

    from ..binding import allocate_outputs, bind_host_inputs

    runner = kernel.runner
    fn = kernel.function.ir
    bound = bind_host_inputs(fn, inputs)
    sizes = runner.check_sizes(bound.sizes)
    arrays = {**bound.arrays, **allocate_outputs(fn, bound.sizes)}
    # the runner's own argument packing and per-group call (HostKernel.run does the same)
    buffers = runner._buffers(arrays, sizes)
    ptrs = (ctypes.c_void_p * max(1, len(buffers)))(*(a.ctypes.data for a in buffers))
    size_arr = (ctypes.c_int64 * max(1, len(fn.sizes)))(*(sizes[s] for s in fn.sizes))
    assert len(runner.entries) == n_groups, (runner.entries, n_groups)
    per: list[list[float]] = []
    for entry in runner.entries:
        runner._run_group(entry, ptrs, size_arr)  # warm-up
        times = []
        for _ in range(runs):
            start = time.perf_counter()
            runner._run_group(entry, ptrs, size_arr)
            times.append(time.perf_counter() - start)
        per.append(times)
    return whole, per, result.path


def _cuda_times(kernel: Any, inputs: Sequence[Any], runs: int
                ) -> tuple[list[float], list[list[float]], float]:
    """CUDA-event seconds of the whole launch sequence (`benchmark_cuda`) and of each kernel
    within it (events between the kernels of the plan's launch sequence; inputs staged on the
    device once, outside the timing; the plan's packed parameters), and the host's seconds
    per call (`_host_call_s`)."""
    from ..runtime.arrays import DeviceArray, bind_device_inputs
    from ..runtime.cuda_launch import benchmark_cuda
    from ..runtime.cuda_memory import DeviceBuffer, driver, elapsed_ms
    from ..runtime.fast_driver import direct_calls

    whole = benchmark_cuda(kernel, inputs, runs)
    runner = kernel.runner
    fn = kernel.function.ir
    bound = bind_device_inputs(fn, inputs)
    rt = runner.runtime
    staged = bound.staged(rt)
    device_inputs = [DeviceArray(staged[t.name].owner, staged[t.name].shape, staged[t.name].dtype)
                     if isinstance(staged[t.name].owner, DeviceBuffer) else inputs[i]
                     for i, t in enumerate(fn.inputs)]
    rebound = bind_device_inputs(fn, device_inputs)
    outs = [DeviceArray(rt.alloc(max(1, math.prod(s.evaluate(bound.sizes) for s in t.shape))
                                 * t.dtype.itemsize, rebound.device),
                        tuple(s.evaluate(bound.sizes) for s in t.shape), t.dtype)
            for t in fn.outputs]
    plan = runner.plan(kernel.compiled_ir or fn, rebound, device_inputs)
    plan.call(device_inputs, 0, outs)  # warm-up: temporaries hold what later kernels read
    plan.check_errors()
    # Each kernel is timed inside the whole sequence (an event before each launch and one
    # after the last, all queued back to back), so it sees the caches as the call leaves them;
    # a kernel relaunched alone found its inputs in L2 and measured half its real time.
    events = [rt.event(plan.device) for _ in range(len(plan._kernels) + 1)]
    per: list[list[float]] = [[] for _ in plan._kernels]
    # A kernel shorter than the host's time to queue an event and a launch is timed as that
    # host time (the GPU waits for the next launch): queued through ctypes, as the plan's own
    # calls are, that floor is about the launch cost, so a tiny kernel reads as launch-bound
    # (the `[launch]` rule) rather than as several microseconds of cuda-python overhead.
    fast = direct_calls(driver)
    queue = _queue_direct if fast is not None and fast.event_record is not None else _queue
    rt.context(plan.device)
    for _ in range(max(1, int(runs))):
        queue(fast, plan, events)
        for i in range(len(plan._kernels)):
            per[i].append(elapsed_ms(events[i], events[i + 1]) / 1e3)
    plan.check_errors()
    host = _host_call_s(plan, device_inputs, outs, runs, events[-1])
    plan.check_errors()
    return whole, per, host


def _host_call_s(plan: Any, inputs: Sequence[Any], outs: Sequence[Any], runs: int,
                 idle: Any) -> float:
    """The median host wall-clock seconds of one ``plan.call`` as `benchmark_cuda` makes it
    (the launch path: argument checks, outputs and temporaries, zero fills, the launches),
    each call after the device is idle (``idle``, an event, recorded and waited for), so the
    host never waits for a full launch queue."""
    times = []
    for _ in range(max(1, min(int(runs), 10))):
        idle.record()
        idle.synchronize()
        start = time.perf_counter()
        plan.call(inputs, 0, outs)
        times.append(time.perf_counter() - start)
    idle.record()
    idle.synchronize()
    return statistics.median(times)


def _queue(_fast: Any, plan: Any, events: Sequence[Any]) -> None:
    """An event before each kernel of ``plan`` and one after the last (cuda-python)."""
    from ..runtime.cuda_memory import check, driver

    for i, ((f, gx, gy, gz, bx, by, bz, *dyn), (name, _, _)) in enumerate(
            zip(plan._kernels, plan._launch_info, strict=True)):
        events[i].record()
        check(driver.cuLaunchKernel(f, gx, gy, gz, bx, by, bz, dyn[0] if dyn else 0, 0,
                                    plan.block.kernel_addresses[i], 0),
              "cuLaunchKernel", context=f"profiling kernel {name}")
    events[-1].record()


def _queue_direct(fast: Any, plan: Any, events: Sequence[Any]) -> None:
    """`_queue` through ctypes (`runtime.fast_driver`)."""
    from ..errors import CudaError
    from ..runtime import cuda_memory

    def error_text(err: int) -> str:
        return cuda_memory.error_text(cuda_memory.driver.CUresult(err))

    # `DirectCalls.launch` takes no argtypes: handles and addresses as c_void_p
    record, launch = fast.event_record, fast.launch
    addresses = [fast.pointer(a) for a in plan.block.kernel_addresses]
    handles = [int(e.handle) for e in events]
    for i, ((f, gx, gy, gz, bx, by, bz, *dyn), (name, _, _)) in enumerate(
            zip(plan._kernels, plan._launch_info, strict=True)):
        err = record(handles[i], None) or launch(fast.pointer(int(f)), gx, gy, gz, bx, by, bz, dyn[0] if dyn else 0,
                                                 None, addresses[i], None)
        if err:
            raise CudaError(f"profiling kernel {name}: {error_text(err)}")
    err = record(handles[-1], None)
    if err:
        raise CudaError(f"profiling: cuEventRecord: {error_text(err)}")
