"""The CUDA executor of a split call: streams per part, slab copies, the gather.

Place: made by `multi.execute.split_call` once per input types, shapes, devices and options;
its first call prepares everything that does not change between calls (`multi.prepared`: each
part's `launch_plan.CudaPlan` of the chunk's signature and a parameter block of its own, the
buffers it keeps, every copy as integers), so a warm call only reads the inputs' pointers and
queues driver work.

One call on CUDA, with parts ``p`` on devices ``d_p`` and outputs on device ``o``:

1. an event is recorded on the caller's stream of every device holding an input and of ``o``
   (torch's / CuPy's current stream, else the legacy stream), after the outputs are made on
   ``o`` (and zeroed where no part writes);
2. part ``p`` runs on its own stream of ``d_p`` (made once), which waits for those events, then
   gets its input slabs: an input already on ``d_p`` is used in place (a pointer to its first
   row), else copied into a buffer the part keeps (host → device, ``cuMemcpyDtoDAsync`` on one
   device, ``cuMemcpyPeerAsync`` between peers, staged through pinned host memory otherwise);
3. the part's outputs are its rows of the final outputs when ``d_p == o`` (no gather copy),
   else buffers of the part copied to ``o`` after the launches, on the part's stream;
4. every caller stream waits for every part's last event, so later work (and the allocator's
   reuse of inputs freed by the caller) is ordered after the split call; numpy outputs are
   copied back and the output stream synchronised (the only host wait, besides staging).

A part's kept buffers are used only on its own stream, so one call's use of them is ordered
after the previous call's without a wait; a CUDA graph capture of such a call is refused
(`prepared.refuse_capture`): a replay would share them with later calls.
"""

from __future__ import annotations

import threading
import weakref
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from ..binding import needs_zero_fill
from ..errors import CallError
from ..runtime import cuda_memory
from ..runtime.array_views import ArrayKind
from ..runtime.arrays import DeviceArray, bind_device_inputs
from ..runtime.cuda_launch import _capturing
from ..runtime.streams import stream_handle
from .inputs import locate_inputs
from .prepared import (
    D2D,
    F_HOST,
    F_LIBRARY,
    H2D,
    PEER,
    SET,
    prepare,
    refuse_capture,
    sources_fast,
    sources_from_views,
)
from .shards import Shard, Sharded

_COPIES = {H2D: "cuMemcpyHtoDAsync", D2D: "cuMemcpyDtoDAsync", PEER: "cuMemcpyPeerAsync"}

__all__ = ["SplitExecutor"]


@dataclass
class _PartState:
    device: int
    stream: Any            # a `cuda_memory.Stream` of the part's device
    handle: int
    done: Any              # a driver event, recorded after the part's last work
    plan: Any = None       # the sub-call's `CudaPlan`, set when the executor is prepared


class SplitExecutor:
    """A split call on CUDA devices, made once per input types, shapes and devices."""

    def __init__(self, fn: Any, kernel: Any, runtime: Any = None, shards: bool = False):
        from ..runtime.cuda_launch import get_runtime
        from ..runtime.peer import PeerAccess

        # the function's IR and name, not the function: it holds its executors, and no cycle
        # keeps an executor's buffers alive once the function is gone
        self.ir, self.entry = fn.ir, fn.entry
        self._fn = weakref.ref(fn)  # to compile a part's kernel for its slabs' alignment
        self.plan, self.kernels = kernel.plan, kernel.kernels
        self.shards = shards  # outputs left on the parts' devices (`shards.Sharded`)
        self.runtime = rt = runtime or get_runtime()
        self.peers = PeerAccess(rt)
        flags = _driver().CUevent_flags.CU_EVENT_DISABLE_TIMING.value
        self.parts = []
        for part in self.plan.parts:
            rt.context(part.device)
            stream = rt.stream(part.device)
            self.parts.append(_PartState(part.device, stream, int(stream.handle),
                                         _check(_driver().cuEventCreate(flags), "cuEventCreate")))
        self._events: dict[int, Any] = {}
        self._pinned: dict[tuple[int, str], Any] = {}
        self._lock = threading.Lock()
        self.prepared: Any = None  # a `prepared.Prepared`, made by the first call
        self._zero = [{t.name: needs_zero_fill(self.ir, t, dict(p.sizes)) for t in self.ir.outputs}
                      for p in self.plan.parts]

    in_place = True  # inputs on a part's device are used where they are (False: copied, a test knob)

    def __setattr__(self, name: str, value: Any) -> None:
        if name == "in_place":  # the prepared copies depend on it: prepare again
            self.__dict__["prepared"] = None
        super().__setattr__(name, value)

    def _event(self, device: int) -> Any:
        event = self._events.get(device)
        if event is None:
            self.runtime.context(device)
            flags = _driver().CUevent_flags.CU_EVENT_DISABLE_TIMING.value
            event = self._events[device] = _check(_driver().cuEventCreate(flags), "cuEventCreate")
        return event

    def __call__(self, inputs: Sequence[Any], stream: Any = None,
                 views: dict[str, Any] | None = None) -> Any:
        """One call; ``views``: the inputs' `inputs.locate_inputs` views (None: the inputs are
        of the types, shapes and devices this executor was made for, read directly)."""
        fn = self.ir
        keep: list[Any] = []  # host copies that must outlive the queueing of their copies
        with self._lock:
            prepared = self.prepared
            if prepared is None and views is None:
                views = locate_inputs(fn, inputs)[0]
            if views is None:
                src = sources_fast(prepared, fn, inputs, keep)
            else:
                src = sources_from_views(fn, views, keep)
                if prepared is None:
                    prepared = self.prepared = prepare(self, inputs, views, src)
            return self._run(prepared, src, stream)

    def _run(self, p: Any, src: list[int], stream: Any) -> Any:
        d, rt, plan = cuda_memory.driver, self.runtime, self.plan
        ok = d.CUresult.CUDA_SUCCESS
        callers = p.callers
        handles = [c.current() for c in callers]
        if stream is not None:
            handles[p.out_pos] = stream_handle(stream)
        out, out_h = callers[p.out_pos], handles[p.out_pos]
        if p.check_capture and _capturing(out_h):
            raise refuse_capture(self.entry)
        out.context.activate()
        finals, results, backs = [], [], []
        for f in p.finals:
            if f.how == F_LIBRARY:
                ptr, result = out.memory.empty(f.shape, f.lib_dtype)
            elif f.how == F_HOST:
                ptr, result = f.held, _host_result(p.kind, f.shape, f.dtype)
                backs.append((result, ptr, f.nbytes))
            else:
                buf = rt.alloc(f.nbytes, out.device)
                ptr, result = buf.ptr, DeviceArray(buf, f.shape, f.dtype, stream=out_h)
            if f.zero:
                _memset(ptr, f.nbytes, out_h)
            finals.append(ptr)
            results.append(result)
        record, wait = d.cuEventRecord, d.cuStreamWaitEvent
        for c, h in zip(callers, handles, strict=True):
            c.context.activate()
            if (r := record(c.event, h))[0] != ok:
                _check(r, "cuEventRecord", context=f"stream {h:#x}")
        events = [c.event for c in callers]
        shards: list[list[Shard]] = [[] for _ in p.shard_kinds]
        for part, state in zip(p.parts, self.parts, strict=True):
            part.context.activate()
            h = part.handle
            for event in events:
                if (r := wait(h, event, 0))[0] != ok:
                    _check(r, "cuStreamWaitEvent", context=f"stream {h:#x}")
            values = part.block.values
            for code, dst, i, off, n, extra in part.ins:
                if code == SET:
                    values[dst] = src[i] + off
                    continue
                if code == H2D:
                    r = d.cuMemcpyHtoDAsync(dst, src[i] + off, n, h)
                elif code == D2D:
                    r = d.cuMemcpyDtoDAsync(dst, src[i] + off, n, h)
                elif code == PEER:
                    r = d.cuMemcpyPeerAsync(dst, extra[0], src[i] + off, extra[1], n, h)
                else:
                    self._staged(dst, part.device, src[i] + off, extra[0], n, part, extra[1],
                                 extra[2])
                    continue
                if r[0] != ok:
                    _check(r, f"{_COPIES[code]}({n} bytes)", context=f"input of {plan.entry}")
            for slot, j, off in part.outs:
                values[slot] = finals[j] + off
            for slot, j, shape, n, rows, dtype in part.shard_outs:
                ptr, array, _ = _output(p.shard_kinds[j], part.memory, rt, part.device, shape,
                                        dtype, n, h)
                values[slot] = ptr
                shards[j].append(Shard(part.device, rows, array, ptr))
            for slot, n in part.zero:
                _memset(values[slot], n, h)
            state.plan.launch_packed(part.params, h)  # (a profiler may wrap state.plan)
            for code, j, off, ptr, n, extra in part.copies_out:
                if code == PEER or code == D2D:
                    r = (d.cuMemcpyPeerAsync(finals[j] + off, extra[0], ptr, extra[1], n, h)
                         if code == PEER else d.cuMemcpyDtoDAsync(finals[j] + off, ptr, n, h))
                    if r[0] != ok:
                        _check(r, f"{_COPIES[code]}({n} bytes)", context=f"output of {plan.entry}")
                else:
                    self._staged(finals[j] + off, out.device, ptr, part.device, n, part, None,
                                 extra)
            if (r := record(part.done, h))[0] != ok:
                _check(r, "cuEventRecord", context=f"stream {h:#x}")
        for c, h in zip(callers, handles, strict=True):
            c.context.activate()
            for part in p.parts:
                if (r := wait(h, part.done, 0))[0] != ok:
                    _check(r, "cuStreamWaitEvent", context=f"stream {h:#x}")
        if backs:
            out.context.activate()
            for result, ptr, nbytes in backs:
                address = (result.ctypes.data if isinstance(result, np.ndarray)
                           else result.data_ptr())
                _check(d.cuMemcpyDtoHAsync(address, ptr, nbytes, out_h),
                       f"cuMemcpyDtoHAsync({nbytes} bytes)", context=f"output of {plan.entry}")
            _check(d.cuStreamSynchronize(out_h), "cuStreamSynchronize",
                   context=f"after the split call of {plan.entry}")
            for sub in p.gather_plans:  # the flags' reads have landed: this call's failure
                sub.report_pending(landed=True)
        if self.shards:
            results = [Sharded(shape, t.dtype, tuple(shards[j]), p.shard_kinds[j])
                       for j, (t, shape) in enumerate(zip(self.ir.outputs, p.shapes,
                                                          strict=True))]
        return results[0] if len(results) == 1 else tuple(results)

    def _staged(self, dst: int, dst_dev: int, src: int, src_dev: int, nbytes: int,
                part: Any, ready: Any, name: str) -> None:
        """A copy between devices without peer access, through pinned memory of the part's."""
        from ..runtime.peer import stage_through_host

        rt = self.runtime
        dst_ctx, src_ctx = rt.context(dst_dev), rt.context(src_dev)
        key = (id(part), name)
        pinned = self._pinned.get(key)
        if pinned is None or pinned.nbytes < nbytes:
            pinned = self._pinned[key] = rt.pinned(nbytes, part.device)
        else:  # the previous call's copy out of it must have left
            _check(_driver().cuEventSynchronize(part.done), "cuEventSynchronize")
        if ready is None:  # an output, made by the part's own stream, written synchronously
            rt.context(part.device)
            _check(_driver().cuStreamSynchronize(part.handle), "cuStreamSynchronize")
        stage_through_host(dst, src, nbytes, pinned, ready, src_ctx, dst_ctx,
                           None if ready is None else part.handle)
        rt.context(part.device)

    def _sub_plan(self, k: int, sub: Sequence[Any]) -> Any:
        kernel = self.kernels[k]
        bound = bind_device_inputs(self.ir, sub)
        if bound.device != self.parts[k].device:
            raise CallError(f"{self.entry}: part {k}'s inputs are on device {bound.device}, "
                            f"the part runs on device {self.parts[k].device}")
        if bound.signature != kernel.signature and not getattr(kernel.options, "parametric",
                                                               False):
            # the slabs' own alignment (a slab in place starts at a row, which may not be
            # 16-byte aligned: the kernel specialises on it, `Signature.align`)
            kernel = self._fn()._compile(sub, kernel.options, "cuda", None)[0]
        runner = kernel.runner
        runner._source = getattr(self.ir, "source", None)
        return runner.plan(kernel.compiled_ir or self.ir, bound, sub, self.parts[k].handle)


def _host_result(kind: Any, shape: tuple[int, ...], dtype: Any) -> Any:
    if kind is ArrayKind.TORCH_CPU:
        import torch

        return torch.empty(shape, dtype=getattr(torch, dtype.value))
    return np.empty(shape, dtype.numpy)


def _output(kind: Any, memory: Any, rt: Any, device: int, shape: tuple[int, ...], dtype: Any,
            nbytes: int, handle: int) -> tuple[int, Any, Any]:
    """(device pointer, the user's result, the object owning the device memory)."""
    if kind is ArrayKind.TORCH_CUDA or kind is ArrayKind.CUPY:
        ptr, result = memory.empty(shape, memory.dtype(dtype))
        return ptr, result, result
    buf = rt.alloc(nbytes, device)
    return buf.ptr, DeviceArray(buf, shape, dtype, stream=handle), buf


def _memset(ptr: int, nbytes: int, handle: int) -> None:
    if not nbytes:
        return
    d = cuda_memory.driver
    if nbytes % 4 == 0:
        r = d.cuMemsetD32Async(ptr, 0, nbytes // 4, handle)
    else:
        r = d.cuMemsetD8Async(ptr, 0, nbytes, handle)
    if r[0] != d.CUresult.CUDA_SUCCESS:
        _check(r, f"cuMemsetD{32 if nbytes % 4 == 0 else 8}Async({nbytes} bytes)")


def _driver() -> Any:
    return cuda_memory.driver


_check = cuda_memory.check
