"""Calling JIT-compiled host kernels: argument checks, temporaries, the thread pool.

A `HostKernel` holds the entry points of one compiled function (see `tcmlir.codegen.lower` for
the ABI): one ``void {name}_{g}(buffers, sizes, lo, hi, err)`` per top-level group of the loop
AST, run in order. A group with a parallel loop also has ``{name}_{g}_range(sizes, out)``; its
loop's iterations are split into at most ``threads * CHUNKS_PER_THREAD`` equal chunks, one
call each, which the calling thread and the ``threads - 1`` workers of the kernel's
`ThreadPoolExecutor` take in turn as they come free (ctypes releases the GIL during the call). A group runs as one call
when it has no parallel loop, when ``threads == 1``, or when the loop has fewer than
``min_parallel_iterations`` iterations. A failed gather bounds check raises `CallError` naming
the tensor, the statement, the dimension, the index value and the extent.
"""

from __future__ import annotations

import ctypes
import itertools
import os
import threading
from collections.abc import Callable, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass

import numpy as np

from .. import ir as tc
from ..binding import needs_zero_fill
from ..errors import CallError, format_located

__all__ = ["EntryPoint", "ErrorSlot", "HostKernel"]

GROUP_FN = ctypes.CFUNCTYPE(None, ctypes.c_void_p, ctypes.c_void_p, ctypes.c_int64, ctypes.c_int64,
                            ctypes.c_void_p)
RANGE_FN = ctypes.CFUNCTYPE(None, ctypes.c_void_p, ctypes.c_void_p)
# A parallel loop is cut into this many chunks per thread, taken by the threads as they come
# free (`HostKernel._run_chunks`), so a thread that starts late leaves less undone.
CHUNKS_PER_THREAD = 4
# Sentinels for "no bound": far inside int64 so the kernel's start-alignment arithmetic
# (lo - first, rounded up to the stride) cannot overflow.
_LO, _HI = -(2**62), 2**62


class ErrorSlot(ctypes.Structure):
    """A group call's ``err`` (`codegen.lower`): ``code`` is 1 + the failed gather site (0: no
    failure), ``index`` the value read and ``extent`` the extent it had to stay under."""

    _fields_ = (("code", ctypes.c_int32), ("pad", ctypes.c_int32), ("index", ctypes.c_int64),
                ("extent", ctypes.c_int64))


@dataclass(frozen=True)
class EntryPoint:
    """One group's function (and its parallel loop's range function, if any)."""

    name: str
    call: Callable[..., None]
    range: Callable[..., None] | None = None


@dataclass(frozen=True)
class GatherInfo:
    tensor: str
    statement: int
    where: str
    dim: int


class HostKernel:
    """A compiled TC function on the host. ``keepalive`` holds the JIT engine the code lives in."""

    def __init__(self, fn: tc.Function, entries: Sequence[EntryPoint], gathers: Sequence[object],
                 llvm_ir: str, optimized_ir: str, keepalive: object, sizes: Mapping[str, int] | None = None,
                 threads: int | None = None, min_parallel_iterations: int = 2,
                 on_chip: Sequence[str] = ()):
        self.fn = fn
        # temporaries the code keeps in stack rows (`codegen.host_rows`): no buffer, a null
        # pointer in their slot
        self.on_chip = frozenset(on_chip)
        self.entries = tuple(entries)
        self.llvm_ir = llvm_ir
        self.optimized_ir = optimized_ir
        self.compiled_sizes = dict(sizes or {})
        self.threads = max(1, threads if threads is not None else (os.cpu_count() or 1))
        self.min_parallel_iterations = max(2, min_parallel_iterations)
        self._keepalive = keepalive
        self._gathers = tuple(_gather_info(fn, g) for g in gathers)
        self._pool: ThreadPoolExecutor | None = None
        self.plans: dict[tuple, object] = {}  # size values -> host_plan.HostPlan
        self._pool_lock = threading.Lock()

    def __repr__(self) -> str:
        par = sum(e.range is not None for e in self.entries)
        return (f"<HostKernel {self.fn.name}: {len(self.entries)} group(s), {par} parallel, "
                f"threads={self.threads}>")

    # ------------------------------------------------------------ calling

    def check_sizes(self, sizes: Mapping[str, int]) -> dict[str, int]:
        """The size values of a call merged with those fixed at compile time (CallError on a
        conflict or a missing size)."""
        sizes = {k: int(v) for k, v in sizes.items()}
        for k, v in self.compiled_sizes.items():
            if sizes.get(k, v) != v:
                raise CallError(f"{self.fn.name} was compiled for {k}={v}, called with {k}={sizes[k]}")
        sizes = {**self.compiled_sizes, **sizes}
        missing = [s for s in self.fn.sizes if s not in sizes]
        if missing:
            raise CallError(f"{self.fn.name}: sizes {missing} are not bound")
        return sizes

    def run(self, arrays: Mapping[str, np.ndarray], sizes: Mapping[str, int]) -> dict[str, np.ndarray]:
        """Run on ``arrays`` (every input and output by name); returns the outputs (written in place)."""
        sizes = self.check_sizes(sizes)
        buffers = self._buffers(arrays, sizes)
        ptrs = (ctypes.c_void_p * max(1, len(buffers)))(*(a.ctypes.data for a in buffers))
        size_arr = (ctypes.c_int64 * max(1, len(self.fn.sizes)))(*(sizes[s] for s in self.fn.sizes))
        for entry in self.entries:
            self._run_group(entry, ptrs, size_arr)
        return {t.name: arrays[t.name] for t in self.fn.outputs}

    def _buffers(self, arrays: Mapping[str, np.ndarray], sizes: Mapping[str, int]) -> list[np.ndarray]:
        written = {st.tensor for st in self.fn.statements}
        out = []
        for t in self.fn.tensors:
            shape = tuple(s.evaluate(sizes) for s in t.shape)
            if t.role is tc.Role.TEMP and t.name in self.on_chip:
                out.append(np.empty(0, dtype=t.dtype.numpy))
                continue
            if t.role is tc.Role.TEMP:
                make = np.zeros if needs_zero_fill(self.fn, t, sizes) else np.empty
                out.append(make(shape, dtype=t.dtype.numpy))
                continue
            if t.name not in arrays:
                raise CallError(f"{self.fn.name}: no array given for {t.role.value} {t.name}")
            a = arrays[t.name]
            if not isinstance(a, np.ndarray):
                raise CallError(f"{self.fn.name}: {t.name} must be a numpy array, got {type(a).__name__}")
            if a.dtype != t.dtype.numpy:
                raise CallError(f"{self.fn.name}: {t.name} has dtype {a.dtype}, expected {t.dtype}")
            if a.shape != shape:
                raise CallError(f"{self.fn.name}: {t.name} has shape {a.shape}, expected {shape}")
            if not a.flags.c_contiguous or (t.name in written and not a.flags.writeable):
                raise CallError(f"{self.fn.name}: {t.name} must be a C-contiguous"
                                f"{' writeable' if t.name in written else ''} array")
            out.append(a)
        # the kernel assumes distinct tensors do not overlap (noalias): copy inputs that do
        for i, t in enumerate(self.fn.tensors):
            if t.name in written:
                continue
            if any(t2.name in written and np.may_share_memory(out[i], out[j])
                   for j, t2 in enumerate(self.fn.tensors) if j != i):
                out[i] = out[i].copy()
        return out

    def _run_group(self, entry: EntryPoint, ptrs: ctypes.Array, sizes: ctypes.Array) -> None:
        chunks = self._chunks(entry, sizes)
        self._run_chunks(entry, chunks, ptrs, sizes, [ErrorSlot() for _ in chunks])

    def _run_chunks(self, entry: EntryPoint, chunks: Sequence[tuple[int, int]], ptrs: ctypes.Array,
                    sizes: ctypes.Array, errs: Sequence[ErrorSlot]) -> None:
        """Run one group's chunks (several: the calling thread and the pool's workers take the
        next chunk not yet taken until none is left); ``errs`` start at 0."""
        if len(chunks) == 1:
            entry.call(ptrs, sizes, chunks[0][0], chunks[0][1], ctypes.byref(errs[0]))
        else:
            # The caller works too (its core is already running) and nobody waits for a worker
            # that starts late: on a loaded machine a woken worker may wait milliseconds for a
            # core, and the others then take its share (a range iterator's next() is atomic).
            order = iter(range(len(chunks)))

            def work() -> None:
                for i in order:
                    entry.call(ptrs, sizes, chunks[i][0], chunks[i][1], ctypes.byref(errs[i]))

            pool = self._executor()
            futures = [pool.submit(work) for _ in range(min(self.threads, len(chunks)) - 1)]
            try:
                work()
            finally:
                for f in futures:
                    f.result()
        for e in errs:
            if e.code:
                self._raise_gather(e)

    def _chunks(self, entry: EntryPoint, sizes: ctypes.Array) -> list[tuple[int, int]]:
        if entry.range is None or self.threads == 1:
            return [(_LO, _HI)]
        out = (ctypes.c_int64 * 3)()
        entry.range(sizes, out)
        first, end, inc = out[0], out[1], out[2]
        trips = -(-(end - first) // inc) if inc > 0 and end > first else 0
        if trips < self.min_parallel_iterations:
            return [(_LO, _HI)]
        n = min(self.threads * CHUNKS_PER_THREAD, trips)
        bounds = [first + (c * trips // n) * inc for c in range(n + 1)]
        bounds[0], bounds[-1] = _LO, _HI  # the outer chunks also cover anything the range missed
        return list(itertools.pairwise(bounds))

    def _executor(self) -> ThreadPoolExecutor:
        with self._pool_lock:
            if self._pool is None:
                self._pool = ThreadPoolExecutor(max(1, self.threads - 1), thread_name_prefix=f"tc-{self.fn.name}")
            return self._pool

    def _raise_gather(self, err: ErrorSlot) -> None:
        code = err.code
        if not 1 <= code <= len(self._gathers):
            raise CallError(f"{self.fn.name}: kernel reported unknown error code {code}")
        g = self._gathers[code - 1]
        dim = f" in dimension {g.dim}" if g.dim >= 0 else ""
        raise CallError(f"{self.fn.name}: gather index {err.index}{dim} of tensor {g.tensor} is "
                        f"out of bounds (extent {err.extent}) in statement {g.statement}"
                        f"{g.where}")

    def close(self) -> None:
        """Shut the thread pool down (the kernel stays callable; a new pool starts on demand)."""
        with self._pool_lock:
            if self._pool is not None:
                self._pool.shutdown(wait=True)
                self._pool = None

    def __del__(self) -> None:  # pragma: no cover - interpreter shutdown order varies
        pool = getattr(self, "_pool", None)
        if pool is not None:
            pool.shutdown(wait=False)


def _gather_info(fn: tc.Function, site: object) -> GatherInfo:
    tensor, k, span = site.tensor, site.statement, site.span  # type: ignore[attr-defined]
    where = ""
    if fn.source is not None and span is not None:
        where = "\n" + format_located(fn.source, span, f"the gather of {tensor} is here")
    return GatherInfo(tensor, k, where, getattr(site, "dim", -1))
