"""A split call's prepared launch: what depends only on the executor's key, worked out once.

Place: `cuda_split.SplitExecutor` calls `prepare` on its first call (the executor is made once
per input types, shapes, devices and options, `execute.split_call`) and runs the `Prepared` on
every call. Done here, once:

* each part's sub-call: its `launch_plan.CudaPlan` (made from `Slab` views of the first call's
  slabs, which checks them like a call) and a `ParamBlock` of the part's own, packed with the
  sizes, the error flag and every pointer that never changes: buffers the part keeps for its
  copied input slabs, its temporaries and (on a device other than the output's) its output
  rows — the part's stream is its own, so the next call's use of them is ordered after this
  call's without any synchronisation;
* every copy as integers (``code, destination, source index, source offset, bytes``), its kind
  decided once (host → device, device-local, peer, or staged when peers cannot talk);
* the callers' streams' sources (torch's / CuPy's current stream getters, the legacy stream)
  and their events, the parts' streams and events (made by the executor);
* how each input's pointer is read (`sources`): ``data_ptr()``, ``data.ptr``, a numpy array's
  address, a converted scalar, every shard's pointer.

Per call, the executor reads the inputs' pointers, makes the outputs, writes the changing
slots (in-place slab pointers, output rows) and queues event records and waits, copies, zero
fills and launches: no isl, no binding, no per-part Python objects.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from ..binding import scalar_array
from ..errors import CallError
from ..runtime.array_views import classify
from ..signature import ALIGN_BYTES
from .inputs import row_bytes
from .shards import Sharded

__all__ = ["Prepared", "prepare", "sources_fast", "sources_from_views"]

# how an input's source pointer(s) are read per call (`sources_fast`)
G_TORCH, G_CUPY, G_NUMPY, G_NUMPY_COPY, G_SCALAR, G_SHARDS, G_CLASSIFY = range(7)
# per-call operations of a part's inputs and outputs
SET, H2D, D2D, PEER, STAGED = range(5)
# how an output on the output device is made per call
F_LIBRARY, F_HOST, F_DEVICE = range(3)


@dataclass
class Caller:
    """A device the call touches, and its caller's stream (read per call)."""

    device: int
    context: Any
    current: Any          # () -> the library's current stream handle on this device
    event: Any            # recorded on that stream before the parts start
    memory: Any           # `streams.memory_for` of the device (outputs, shards)


@dataclass
class Final:
    """An output, gathered on the output device."""

    how: int
    shape: tuple[int, ...]
    nbytes: int
    dtype: Any
    lib_dtype: Any
    zero: bool            # no part writes some of its rows: zero it first
    held: Any = None      # F_HOST: the device buffer the parts write into


@dataclass
class PartRun:
    device: int
    context: Any
    handle: int
    done: Any
    plan: Any                                   # the sub-call's `CudaPlan`
    block: Any                                  # the part's own `ParamBlock`
    params: Any                                 # what the plan's `launch_packed` takes for it
    ins: tuple = ()                             # (code, slot|dst, source index, offset, bytes, extra)
    outs: tuple = ()                            # (slot, final index, byte offset): rows in place
    shard_outs: tuple = ()                      # (slot, output index, shape, bytes, rows, dtype)
    zero: tuple = ()                            # (slot, bytes) zero-filled before the launch
    copies_out: tuple = ()                      # (code, final index, offset, src ptr, bytes, extra)
    memory: Any = None                          # the device's memory (shards' outputs)


@dataclass
class Prepared:
    getters: tuple[int, ...]
    callers: tuple[Caller, ...]
    out_pos: int                                # the output device's index in ``callers``
    finals: tuple[Final, ...]
    parts: tuple[PartRun, ...]
    kind: Any                                   # the inputs' `ArrayKind`
    check_capture: bool                         # a capture must be refused (see `SplitExecutor`)
    gather_plans: tuple[Any, ...]               # sub-plans with a gather flag
    shapes: tuple[tuple[int, ...], ...]         # the outputs' shapes
    shard_kinds: tuple[Any, ...]                # per output, the `ArrayKind` of its shards
    held: list = field(default_factory=list)    # buffers kept for the executor's lifetime


def getter_for(x: Any, view: Any) -> int:
    """How the fast path reads ``x``'s pointer (the key fixes its type, shape and strides)."""
    from ..runtime.array_views import ArrayKind, DeviceArrayView, HostArrayView

    if isinstance(view, Sharded):
        return G_SHARDS
    if isinstance(x, (bool, int, float, np.generic)):
        return G_SCALAR
    if isinstance(x, np.ndarray):
        return G_NUMPY if x.flags.c_contiguous else G_NUMPY_COPY
    if isinstance(view, DeviceArrayView):
        return {ArrayKind.TORCH_CUDA: G_TORCH, ArrayKind.CUPY: G_CUPY}.get(view.kind, G_CLASSIFY)
    if (isinstance(view, HostArrayView) and view.kind is ArrayKind.TORCH_CPU
            and view.array.flags.c_contiguous):
        return G_TORCH
    return G_CLASSIFY


def sources_fast(prepared: Prepared, fn: Any, inputs: Sequence[Any], keep: list) -> list[int]:
    """The inputs' pointers (shards: one per shard), read with the prepared getters."""
    src: list[int] = []
    for code, x, t in zip(prepared.getters, inputs, fn.inputs, strict=True):
        if code == G_TORCH:
            src.append(x.data_ptr())
        elif code == G_NUMPY:
            src.append(x.ctypes.data)
        elif code == G_CUPY:
            src.append(x.data.ptr)
        elif code == G_SHARDS:
            src.extend(s.ptr for s in x.shards)
        else:
            if code == G_SCALAR:
                host = scalar_array(fn.name, t, x)
            elif code == G_NUMPY_COPY:
                host = np.ascontiguousarray(x)
            else:
                view = classify(x, f"{fn.name}: input {t.name}")
                if hasattr(view, "ptr"):
                    src.append(view.ptr)
                    continue
                host = np.ascontiguousarray(view.array)
            keep.append(host)
            src.append(host.ctypes.data)
    return src


def sources_from_views(fn: Any, views: dict[str, Any], keep: list) -> list[int]:
    """The same from `inputs.locate_inputs`'s views (the slow path's, and the first call's)."""
    src: list[int] = []
    for t in fn.inputs:
        view = views[t.name]
        if isinstance(view, Sharded):
            src.extend(s.ptr for s in view.shards)
        elif hasattr(view, "ptr"):
            src.append(view.ptr)
        else:
            host = np.ascontiguousarray(view.array)
            keep.append(host)
            src.append(host.ctypes.data)
    return src


def prepare(ex: Any, inputs: Sequence[Any], views: dict[str, Any], src: list[int]) -> Prepared:
    """Everything a call of ``ex`` (a `cuda_split.SplitExecutor`) repeats, from its first
    call's ``inputs``, their ``views`` and source pointers ``src``."""
    from ..runtime.array_views import ArrayKind, DeviceArrayView
    from ..runtime.streams import memory_for
    from .slabs import Slab, input_devices

    fn, plan, rt = ex.ir, ex.plan, ex.runtime
    kind = next((views[t.name].kind for t in fn.inputs if t.rank > 0), ArrayKind.NUMPY)
    out_dev = plan.output_device
    getters, base, n = [], {}, 0
    for t, x in zip(fn.inputs, inputs, strict=True):
        view = views[t.name]
        base[t.name] = n
        n += len(view.shards) if isinstance(view, Sharded) else 1
        getters.append(getter_for(x, view))
    where = {t.name: (views[t.name].locations if isinstance(views[t.name], Sharded) else
                      views[t.name].device_ordinal if isinstance(views[t.name], DeviceArrayView)
                      else None) for t in fn.inputs}
    devices = sorted(input_devices(where) | {p.device for p in plan.parts} | {out_dev})
    callers = tuple(
        Caller(dev, rt.context(dev), memory.current_stream, ex._event(dev), memory)
        for dev, memory in ((d, memory_for(kind if kind.on_device else ArrayKind.CUDA_ARRAY, rt, d))
                            for d in devices))
    out_pos = devices.index(out_dev)
    out_memory = callers[out_pos].memory
    sizes = dict(plan.sizes)
    held: list[Any] = []

    def hold(nbytes: int, device: int) -> int:
        buf = rt.alloc(max(1, nbytes), device)
        held.append(buf)
        return buf.ptr

    finals = []
    for t in (() if ex.shards else fn.outputs):
        shape = tuple(e.evaluate(sizes) for e in t.shape)
        nbytes = math.prod(shape) * t.dtype.itemsize
        if kind is ArrayKind.TORCH_CUDA or kind is ArrayKind.CUPY:
            final = Final(F_LIBRARY, shape, nbytes, t.dtype, out_memory.dtype(t.dtype),
                          not plan.covered[t.name])
        elif kind in (ArrayKind.NUMPY, ArrayKind.TORCH_CPU):
            final = Final(F_HOST, shape, nbytes, t.dtype, None, not plan.covered[t.name])
            final.held = hold(nbytes, out_dev)
        else:
            final = Final(F_DEVICE, shape, nbytes, t.dtype, None, not plan.covered[t.name])
        finals.append(final)
    events = {c.device: c.event for c in callers}
    parts = []
    for k, (part, state) in enumerate(zip(plan.parts, ex.parts, strict=True)):
        dev = state.device

        def copy_op(dst: int, src_dev: int, index: int, offset: int, nbytes: int,
                    name: str, dev: int = dev) -> tuple:
            if src_dev is None:
                return (H2D, dst, index, offset, nbytes, None)
            if src_dev == dev:
                return (D2D, dst, index, offset, nbytes, None)
            if ex.peers.direct(src_dev, dev):
                return (PEER, dst, index, offset, nbytes,
                        (rt.context(dev).handle, rt.context(src_dev).handle))
            return (STAGED, dst, index, offset, nbytes, (src_dev, events.get(src_dev), name))

        sub, consts, sets, ins = [], {}, {}, []
        for i, t in enumerate(fn.inputs):
            view, b = views[t.name], base[t.name]
            lo, hi = part.slabs.get(t.name, (0, 1))
            if isinstance(view, Sharded):
                row = view.row_bytes
                sub_shape = (hi - lo, *view.shape[1:])
                pieces = view.pieces(lo, hi)
                first = pieces[0][0] if pieces else None
                if (ex.in_place and len(pieces) == 1 and first.device == dev
                        and pieces[0][1:] == (lo, hi)):
                    j = view.shards.index(first)
                    sets[i] = (b + j, (lo - first.rows[0]) * row)
                    sub.append(Slab(src[b + j] + sets[i][1], sub_shape, t.dtype, first.array))
                    continue
                consts[i] = ptr = hold((hi - lo) * row, dev)
                for shard, a, z in pieces:
                    j = view.shards.index(shard)
                    ins.append(copy_op(ptr + (a - lo) * row, shard.device, b + j,
                                       (a - shard.rows[0]) * row, (z - a) * row,
                                       f"{t.name} {shard.rows}"))
                sub.append(Slab(ptr, sub_shape, t.dtype))
                continue
            on_device = isinstance(view, DeviceArrayView)
            shape = tuple(view.shape)
            row = row_bytes(shape, t.dtype.itemsize, t.rank)
            sub_shape = shape if t.rank == 0 else (hi - lo, *shape[1:])
            nbytes = row * (1 if t.rank == 0 else hi - lo)
            offset = 0 if t.rank == 0 else lo * row
            if on_device and view.device_ordinal == dev and ex.in_place:
                sets[i] = (b, offset)
                sub.append(Slab(src[b] + offset, sub_shape, t.dtype, view.owner))
                continue
            consts[i] = ptr = hold(nbytes, dev)
            if nbytes:
                ins.append(copy_op(ptr, view.device_ordinal if on_device else None, b, offset,
                                   nbytes, t.name))
            sub.append(view.array[()] if t.rank == 0 and not on_device
                       else Slab(ptr, sub_shape, t.dtype))
        sub_plan = state.plan = ex._sub_plan(k, sub)
        in_slots, out_slots, temps, aligned = sub_plan.slots()
        block = sub_plan.block.blank()  # the same slots, each kernel taking its own
        for s in range(block.count):
            block.values[s] = sub_plan.block.values[s]  # sizes, the error flag
        ops = [(SET, in_slots[i], si, off, 0, None) for i, (si, off) in sets.items()]
        for i, ptr in consts.items():
            block.values[in_slots[i]] = ptr
        outs, shard_outs, zero, copies_out = [], [], [], []
        for j, t in enumerate(fn.outputs):
            lo, hi = part.slabs.get(t.name, (0, 1))  # a scalar: one "row"
            shape = tuple(e.evaluate(sizes) for e in t.shape)
            row = row_bytes(shape, t.dtype.itemsize, t.rank)
            sub_shape = (hi - lo, *shape[1:]) if t.rank else ()
            slot, nbytes = out_slots[j], (hi - lo) * row
            if ex.shards:
                shard_outs.append((slot, j, sub_shape, nbytes, (lo, hi), t.dtype))
            elif dev == out_dev and (lo * row % ALIGN_BYTES == 0 or t.name not in aligned):
                outs.append((slot, j, lo * row))  # (outputs are allocated aligned)
            else:  # rows on another device, or rows the kernel cannot write in place unaligned
                block.values[slot] = ptr = hold(nbytes, dev)
                if nbytes:
                    copies_out.append((j, lo * row, ptr, nbytes, f"out {t.name}"))
            if ex._zero[k][t.name] and nbytes:
                zero.append((slot, nbytes))
        for slot, nbytes, fill in temps:
            block.values[slot] = hold(nbytes, dev)
            if fill:
                zero.append((slot, nbytes))
        parts.append(PartRun(dev, rt.context(dev), state.handle, state.done, sub_plan, block,
                             sub_plan.packed_params(block),
                             tuple(ops + ins), tuple(outs), tuple(shard_outs), tuple(zero),
                             _out_copies(ex, copies_out, dev, out_dev, rt),
                             callers[devices.index(dev)].memory))
    gather_plans = tuple({id(p.plan): p.plan for p in parts if p.plan.gathers}.values())
    check_capture = bool(held) or bool(gather_plans) or kind is not ArrayKind.TORCH_CUDA
    shapes = tuple(tuple(e.evaluate(sizes) for e in t.shape) for t in fn.outputs)
    shard_kind = kind if kind.on_device else ArrayKind.CUDA_ARRAY
    return Prepared(tuple(getters), callers, out_pos, tuple(finals), tuple(parts), kind,
                    check_capture, gather_plans, shapes, (shard_kind,) * len(shapes), held)


def _out_copies(ex: Any, copies: list[tuple], dev: int, out_dev: int, rt: Any) -> tuple:
    """A part's output copies to the output device: peer when the devices talk, else staged
    (on one device: a stand-in moved into place)."""
    out = []
    for j, offset, ptr, nbytes, name in copies:
        if dev == out_dev:  # an aligned stand-in for unaligned rows: moved into place
            out.append((D2D, j, offset, ptr, nbytes, None))
        elif ex.peers.direct(dev, out_dev):
            extra = (rt.context(out_dev).handle, rt.context(dev).handle)
            out.append((PEER, j, offset, ptr, nbytes, extra))
        else:
            out.append((STAGED, j, offset, ptr, nbytes, name))
    return tuple(out)


def refuse_capture(entry: str) -> CallError:
    return CallError(
        f"{entry}: this split call cannot be captured in a CUDA graph: its parts reuse buffers "
        "of their own (copied input slabs, temporaries, output rows) and host work across "
        "calls, which a graph replay would race with; capture one-device calls (or split "
        "calls whose torch inputs are already on the parts' devices)")
