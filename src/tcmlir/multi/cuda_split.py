"""The CUDA executor of a split call: streams per part, slab copies, the gather.

Place: made by `multi.execute.split_call` once per input types, shapes and devices; each
part's launch goes through the single-device `launch_plan.CudaPlan` of the chunk's signature
(its outputs given: rows of the gathered output, or the part's own shard).

One call on CUDA, with parts ``p`` on devices ``d_p`` and outputs on device ``o``:

1. an event is recorded on the caller's stream of every device holding an input and of ``o``
   (torch's / CuPy's current stream, else the legacy stream), after the outputs are made on
   ``o`` (and zeroed where no part writes);
2. part ``p`` runs on its own stream of ``d_p`` (made once), which waits for those events, then
   gets its input slabs: an input already on ``d_p`` is used in place (a pointer to its first
   row), else copied into a pool buffer (host → device, ``cuMemcpyDtoDAsync`` on one device,
   ``cuMemcpyPeerAsync`` between peers, staged through pinned host memory otherwise);
3. the part's outputs are its rows of the final outputs when ``d_p == o`` (no gather copy),
   else pool buffers copied to ``o`` after the launches, on the part's stream;
4. every caller stream waits for every part's last event, so later work (and the allocator's
   reuse of inputs freed by the caller) is ordered after the split call; numpy outputs are
   copied back and the output stream synchronised (the only host wait, besides staging).
"""

from __future__ import annotations

import math
import threading
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from .. import ir
from ..binding import needs_zero_fill
from ..errors import CallError
from .inputs import locate_inputs, row_bytes, size_values
from .shards import Shard, Sharded

__all__ = ["SplitExecutor"]


class _Slab:
    """Rows of a tensor in device memory, as a CUDA array: what a part's sub-call receives."""

    def __init__(self, ptr: int, shape: tuple[int, ...], dtype: Any, owner: Any = None):
        from ..runtime.arrays import _typestr

        self.shape, self.dtype, self.owner = shape, dtype, owner
        self.__cuda_array_interface__ = {"shape": shape, "typestr": _typestr(dtype),
                                         "data": (ptr, False), "strides": None, "version": 3}


@dataclass
class _PartState:
    device: int
    stream: Any            # a `cuda_memory.Stream` of the part's device
    handle: int
    done: Any              # a driver event, recorded after the part's last work
    plan: Any = None       # the sub-call's `CudaPlan`, made on the first call


class SplitExecutor:
    """A split call on CUDA devices, made once per input types, shapes and devices."""

    in_place = True  # inputs on a part's device are used where they are (False: copied, a test knob)

    def __init__(self, fn: Any, kernel: Any, runtime: Any = None, shards: bool = False):
        from ..runtime.cuda_launch import get_runtime
        from ..runtime.peer import PeerAccess

        self.fn, self.plan, self.kernels = fn, kernel.plan, kernel.kernels
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
        fn_ir = fn.ir
        self._zero = [{t.name: needs_zero_fill(fn_ir, t, dict(p.sizes)) for t in fn_ir.outputs}
                      for p in self.plan.parts]

    def _event(self, device: int) -> Any:
        event = self._events.get(device)
        if event is None:
            self.runtime.context(device)
            flags = _driver().CUevent_flags.CU_EVENT_DISABLE_TIMING.value
            event = self._events[device] = _check(_driver().cuEventCreate(flags), "cuEventCreate")
        return event

    def __call__(self, inputs: Sequence[Any], stream: Any = None) -> Any:
        with self._lock:
            return self._call(inputs, stream)

    def _call(self, inputs: Sequence[Any], stream: Any) -> Any:
        from ..runtime.arrays import ArrayKind, DeviceArrayView
        from ..runtime.peer import record_event, wait_event
        from ..runtime.streams import memory_for, stream_handle

        fn, plan, rt = self.fn.ir, self.plan, self.runtime
        views, where = locate_inputs(fn, inputs)
        if size_values(fn, views) != dict(plan.sizes):
            raise CallError(f"{fn.name}: the split was planned for sizes {dict(plan.sizes)}")
        kind = next((views[t.name].kind for t in fn.inputs if t.rank > 0), ArrayKind.NUMPY)
        out_dev = plan.output_device
        callers = {}  # device -> (caller's stream handle, its memory)
        for dev in sorted(_devices(where) | {p.device for p in plan.parts} | {out_dev}):
            memory = memory_for(kind if kind.on_device else ArrayKind.CUDA_ARRAY, rt, dev)
            handle = (stream_handle(stream) if stream is not None and dev == out_dev
                      else memory.current_stream())
            callers[dev] = (handle, memory)
        out_handle, out_memory = callers[out_dev]
        rt.context(out_dev)
        finals, results, copies_back, keep = {}, [], [], []
        shards: dict[str, list] = {t.name: [] for t in fn.outputs}
        for t in (() if self.shards else fn.outputs):
            shape = tuple(e.evaluate(dict(plan.sizes)) for e in t.shape)
            nbytes = math.prod(shape) * t.dtype.itemsize
            ptr, result, owner = _output(kind, out_memory, rt, out_dev, shape, t.dtype, nbytes,
                                         out_handle)
            if not plan.covered[t.name]:
                _memset(ptr, nbytes, out_handle)
            finals[t.name] = (ptr, shape)
            results.append(result)
            keep.append(owner)
            if kind in (ArrayKind.NUMPY, ArrayKind.TORCH_CPU):
                copies_back.append((result, ptr, nbytes, owner))
        for dev, (handle, _) in callers.items():
            rt.context(dev)
            record_event(self._event(dev), handle)
        released = []  # (pool, buffer, stream) given back after the call's work is queued
        for k, (part, state) in enumerate(zip(plan.parts, self.parts, strict=True)):
            ctx = rt.context(state.device)
            for dev in callers:
                wait_event(state.handle, self._event(dev))
            pool = rt.pool(state.device)
            sub = []
            for t in fn.inputs:
                view = views[t.name]
                lo, hi = part.slabs.get(t.name, (0, 1))
                if t.rank == 0 and not isinstance(view, DeviceArrayView):
                    sub.append(view.array[()])
                    continue
                sub.append(self._input_slab(t, view, lo, hi, state, ctx, pool, released))
            outs = []
            for t in fn.outputs:
                lo, hi = part.slabs.get(t.name, (0, 1))  # a scalar: one "row"
                shape = tuple(e.evaluate(dict(plan.sizes)) for e in t.shape)
                ptr = finals[t.name][0] if t.name in finals else 0
                row = row_bytes(shape, t.dtype.itemsize, t.rank)
                sub_shape = (hi - lo, *shape[1:]) if t.rank else ()
                if self.shards:  # the part's own array, left on its device
                    memory = callers[state.device][1]
                    slab_ptr, array, _ = _output(kind if kind.on_device else ArrayKind.CUDA_ARRAY,
                                                 memory, rt, state.device, sub_shape, t.dtype,
                                                 (hi - lo) * row, state.handle)
                    shards[t.name].append(Shard(state.device, (lo, hi), array, slab_ptr))
                elif state.device == out_dev:
                    slab_ptr = ptr + lo * row
                else:
                    buf = pool.acquire((hi - lo) * row, state.handle)
                    released.append((pool, buf, state.handle))
                    slab_ptr = buf.ptr
                if self._zero[k][t.name]:
                    _memset(slab_ptr, (hi - lo) * row, state.handle)
                outs.append(_Slab(slab_ptr, sub_shape, t.dtype))
            if state.plan is None:
                state.plan = self._sub_plan(k, sub)
            state.plan.call(sub, state.handle, outs)
            for t, slab in zip(fn.outputs, outs, strict=True):
                if state.device != out_dev and not self.shards:
                    lo, hi = part.slabs.get(t.name, (0, 1))
                    ptr, shape = finals[t.name]
                    row = row_bytes(shape, t.dtype.itemsize, t.rank)
                    self._copy(ptr + lo * row, out_dev, _slab_ptr(slab), state.device,
                               (hi - lo) * row, state, None, name=f"out {t.name}")
            record_event(state.done, state.handle)
        for dev, (handle, _) in callers.items():
            rt.context(dev)
            for state in self.parts:
                wait_event(handle, state.done)
        for pool, buf, handle in released:
            pool.release(buf, handle)
        if copies_back:
            rt.context(out_dev)
            for result, ptr, nbytes, _ in copies_back:
                address = (result.ctypes.data if isinstance(result, np.ndarray)
                           else result.data_ptr())
                _check(_driver().cuMemcpyDtoHAsync(address, ptr, nbytes, out_handle),
                       f"cuMemcpyDtoHAsync({nbytes} bytes)", context=f"output of {fn.name}")
            _check(_driver().cuStreamSynchronize(out_handle), "cuStreamSynchronize",
                   context=f"after the split call of {fn.name}")
            for _, _, _, owner in copies_back:
                rt.pool(out_dev).release(owner, out_handle)
        if self.shards:
            results = [Sharded(tuple(e.evaluate(dict(plan.sizes)) for e in t.shape), t.dtype,
                               tuple(shards[t.name]),
                               kind if kind.on_device else ArrayKind.CUDA_ARRAY)
                       for t in fn.outputs]
        return results[0] if len(results) == 1 else tuple(results)

    def _input_slab(self, t: ir.Tensor, view: Any, lo: int, hi: int, state: _PartState,
                    ctx: Any, pool: Any, released: list) -> _Slab:
        from ..runtime.arrays import DeviceArrayView

        shape = tuple(view.shape)
        row = row_bytes(shape, t.dtype.itemsize, t.rank)
        sub_shape = shape if t.rank == 0 else (hi - lo, *shape[1:])
        nbytes = row * (1 if t.rank == 0 else hi - lo)
        offset = 0 if t.rank == 0 else lo * row
        if isinstance(view, Sharded):
            return self._from_shards(t, view, lo, hi, state, pool, released)
        on_device = isinstance(view, DeviceArrayView)
        if on_device and view.device_ordinal == state.device and self.in_place:
            return _Slab(view.ptr + offset, sub_shape, t.dtype, view.owner)
        buf = pool.acquire(nbytes, state.handle)
        released.append((pool, buf, state.handle))
        if on_device:
            self._copy(buf.ptr, state.device, view.ptr + offset, view.device_ordinal, nbytes,
                       state, self._events.get(view.device_ordinal), name=t.name)
        elif nbytes:
            host = view.array if view.array.flags.c_contiguous else np.ascontiguousarray(view.array)
            _check(_driver().cuMemcpyHtoDAsync(buf.ptr, host.ctypes.data + offset, nbytes,
                                               state.handle),
                   f"cuMemcpyHtoDAsync({nbytes} bytes)", context=f"input {t.name}")
        return _Slab(buf.ptr, sub_shape, t.dtype, buf)

    def _from_shards(self, t: ir.Tensor, view: Sharded, lo: int, hi: int, state: _PartState,
                     pool: Any, released: list) -> _Slab:
        """Rows [lo, hi) of a sharded input: in place when one shard on the part's device
        holds them all, else gathered from the shards that hold them."""
        row = view.row_bytes
        sub_shape = (hi - lo, *view.shape[1:])
        pieces = view.pieces(lo, hi)
        if (self.in_place and len(pieces) == 1 and pieces[0][0].device == state.device
                and pieces[0][1:] == (lo, hi)):
            shard = pieces[0][0]
            return _Slab(shard.ptr + (lo - shard.rows[0]) * row, sub_shape, t.dtype, shard.array)
        buf = pool.acquire((hi - lo) * row, state.handle)
        released.append((pool, buf, state.handle))
        for shard, a, b in pieces:
            self._copy(buf.ptr + (a - lo) * row, state.device,
                       shard.ptr + (a - shard.rows[0]) * row, shard.device, (b - a) * row, state,
                       self._events.get(shard.device), name=f"{t.name} {shard.rows}")
        return _Slab(buf.ptr, sub_shape, t.dtype, buf)

    def _copy(self, dst: int, dst_dev: int, src: int, src_dev: int, nbytes: int,
              state: _PartState, ready: Any, name: str = "output") -> None:
        from ..runtime.peer import copy_device_to_device, stage_through_host

        rt = self.runtime
        dst_ctx, src_ctx = rt.context(dst_dev), rt.context(src_dev)
        if self.peers.direct(src_dev, dst_dev):
            rt.context(state.device)  # the stream's context is current when queueing on it
            copy_device_to_device(dst, dst_dev, dst_ctx, src, src_dev, src_ctx, nbytes,
                                  state.handle)
            return
        key = (id(state), name)
        pinned = self._pinned.get(key)
        if pinned is None or pinned.nbytes < nbytes:
            pinned = self._pinned[key] = rt.pinned(nbytes, state.device)
        else:  # the previous call's copy out of it must have left
            _check(_driver().cuEventSynchronize(state.done), "cuEventSynchronize")
        if ready is None:  # an output, made by the part's own stream, written synchronously
            rt.context(state.device)
            _check(_driver().cuStreamSynchronize(state.handle), "cuStreamSynchronize")
        stage_through_host(dst, src, nbytes, pinned, ready, src_ctx, dst_ctx,
                           None if ready is None else state.handle)
        rt.context(state.device)

    def _sub_plan(self, k: int, sub: Sequence[Any]) -> Any:
        from ..runtime.arrays import bind_device_inputs

        kernel = self.kernels[k]
        bound = bind_device_inputs(self.fn.ir, sub)
        if bound.device != self.parts[k].device:
            raise CallError(f"{self.fn.entry}: part {k}'s inputs are on device {bound.device}, "
                            f"the part runs on device {self.parts[k].device}")
        runner = kernel.runner
        runner._source = getattr(self.fn.ir, "source", None)
        return runner.plan(kernel.compiled_ir or self.fn.ir, bound, sub, self.parts[k].handle)


def _devices(where: dict[str, Any]) -> set[int]:
    """The devices inputs live on (shards: every shard's)."""
    out: set[int] = set()
    for loc in where.values():
        if isinstance(loc, int):
            out.add(loc)
        elif loc is not None:
            out.update(d for d, _, _ in loc)
    return out


def _slab_ptr(slab: _Slab) -> int:
    return int(slab.__cuda_array_interface__["data"][0])


def _output(kind: Any, memory: Any, rt: Any, device: int, shape: tuple[int, ...], dtype: Any,
            nbytes: int, handle: int) -> tuple[int, Any, Any]:
    """(device pointer, the user's result, the object owning the device memory)."""
    from ..runtime.arrays import ArrayKind, DeviceArray

    if kind is ArrayKind.TORCH_CUDA or kind is ArrayKind.CUPY:
        ptr, result = memory.empty(shape, memory.dtype(dtype))
        return ptr, result, result
    if kind in (ArrayKind.NUMPY, ArrayKind.TORCH_CPU):
        buf = rt.pool(device).acquire(nbytes, handle)
        if kind is ArrayKind.TORCH_CPU:
            import torch

            result = torch.empty(shape, dtype=getattr(torch, dtype.value))
        else:
            result = np.empty(shape, dtype.numpy)
        return buf.ptr, result, buf
    buf = rt.alloc(nbytes, device)
    return buf.ptr, DeviceArray(buf, shape, dtype, stream=handle), buf


def _memset(ptr: int, nbytes: int, handle: int) -> None:
    if not nbytes:
        return
    if nbytes % 4 == 0:
        _check(_driver().cuMemsetD32Async(ptr, 0, nbytes // 4, handle),
               f"cuMemsetD32Async({nbytes} bytes)")
    else:
        _check(_driver().cuMemsetD8Async(ptr, 0, nbytes, handle), f"cuMemsetD8Async({nbytes} bytes)")


def _driver() -> Any:
    from ..runtime import cuda_memory

    return cuda_memory.driver


def _check(result: Any, what: str, context: str | None = None) -> Any:
    from ..runtime.cuda_memory import check

    return check(result, what, context)
