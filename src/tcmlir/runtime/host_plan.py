"""A prepared host call (``target="cpu"``): made once per (kernel, signature).

Place: `tcmlir.api.TCFunction.__call__` → `HostPlan.call` → the JIT entry points of a
`HostKernel`. Everything `HostKernel.run` works out on every call depends only on the
signature — each tensor's shape, the size array, the chunks each group's parallel loop is cut
into, which fresh buffers must start at zero — so a plan computes it once. A call then only
takes the inputs' addresses, allocates outputs and temporaries (``np.empty`` where the first
statement sets every element, else ``np.zeros``), rewrites the pointer array and calls the
groups. The caller guarantees the inputs match the plan's signature (`signature.call_key`
selects the plan; a key is only registered after a full check of the same key).

**Split or not, measured.** Handing chunks to the thread pool costs a thread wake-up per
chunk — about 80 us on this project's 2-core host, more than many whole kernels (matmul 64³:
13 us on one thread, 106 us on two; an add of 65536 floats 12 against 93 us) — so whether a
call's parallel loops are split is decided per plan from its own timings, not from a table:
below `SERIAL_INSTANCES` statement instances a call always runs on the calling thread; above
it, when the loops can be split, the plan's first calls run on the calling thread alone or split,
`PROBE_CALLS` of each in the order unsplit, split, split, unsplit, ... (each way as often first
as second of two calls in a row); then it splits only where its fastest recent
split call took less than `SPLIT_GAIN` times its fastest recent unsplit one. Every call is
timed, and once the calls made since the last look at the other way took `EXPLORE_FIRST`
times that way's recent time, one call runs the other way again; each look that confirms the
choice doubles that interval (up to `EXPLORE_MAX`), a look that overturns it starts again.
A choice made while the machine was busy (another library's threads spinning on the cores
after its call, say) is revisited within ten calls' worth of time, and a settled one costs
about 1/`EXPLORE_MAX` of the run time. Results do not depend on the choice (chunks are whole
iterations of a parallel loop).
"""

from __future__ import annotations

import ctypes
import threading
import time
from collections import deque
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from .. import ir as tc
from ..binding import needs_zero_fill
from .host import _HI, _LO, ErrorSlot, HostKernel

# Below this many statement instances a call runs on the calling thread without measuring:
# handing chunks to the pool costs tens of microseconds, more than the whole kernel (z = x + y
# on 1024 floats ran in 78 us on two threads).
SERIAL_INSTANCES = 1 << 16
PROBE_CALLS = 4    # calls timed unsplit and as many split (in ABBA order) before a plan chooses
SPLIT_GAIN = 0.9   # the split is used when its fastest recent call is at least 10% faster
# run time, in calls of the other way, before the next look at it: EXPLORE_FIRST after a new
# choice, doubled by each look that confirms it, at most EXPLORE_MAX (~0.1% of the run time)
EXPLORE_FIRST = 10
EXPLORE_MAX = 1000


_char_at = ctypes.c_char.from_buffer


_UNTYPED = ctypes.CFUNCTYPE(None)

_SCALARS = (bool, int, float)


def _raw(fn: Any) -> Any:
    """``fn`` (a ctypes function) as a prototype without argument types: called with ctypes
    objects only, which it passes as they are."""
    return _UNTYPED(ctypes.cast(fn, ctypes.c_void_p).value)


def _address(a: np.ndarray) -> int:
    """The data address of a C-contiguous array (through the buffer protocol, which is cheaper
    than ``a.ctypes.data``; read-only arrays refuse a writable view and take the slow way)."""
    try:
        return ctypes.addressof(_char_at(a))
    except (TypeError, ValueError, BufferError):
        return a.ctypes.data


class HostPlan:
    """One signature's call of a `HostKernel`; ``call(inputs)`` returns the outputs."""

    def __init__(self, kernel: HostKernel, fn: tc.Function, sizes: Mapping[str, int]):
        self.kernel = kernel
        sizes = kernel.check_sizes(sizes)
        self.sizes = dict(sizes)
        tensors = fn.tensors
        index = {t.name: k for k, t in enumerate(tensors)}
        self._inputs = tuple((index[t.name], t.dtype.numpy) for t in fn.inputs)
        shape = {t.name: tuple(e.evaluate(sizes) for e in t.shape) for t in tensors}
        self._fresh = tuple(
            (index[t.name], shape[t.name], t.dtype.numpy,
             np.zeros if needs_zero_fill(fn, t, sizes) else np.empty)
            for t in (*fn.outputs, *fn.temporaries) if t.name not in kernel.on_chip)
        self._n_outputs = len(fn.outputs)
        # (slot, shape, numpy dtype, np.empty or np.zeros) of each output, in order
        self.fresh_outputs = self._fresh[: self._n_outputs]
        self._n_tensors = len(tensors)
        self._size_array = (ctypes.c_int64 * max(1, len(fn.sizes)))(*(sizes[s] for s in fn.sizes))
        small = tc.instance_count(fn, sizes) < SERIAL_INSTANCES
        # the split form of each group (its parallel loop's chunks), used when measured faster
        self._groups = tuple((entry, ((_LO, _HI),) if small else tuple(kernel._chunks(entry, self._size_array)))
                             for entry in kernel.entries)
        self._pointers = (ctypes.c_void_p * max(1, self._n_tensors))()
        self._errors = [[ErrorSlot() for _ in chunks] for _, chunks in self._groups]
        self._lock = threading.Lock()
        # every group on the calling thread: its JIT function called with prebuilt ctypes
        # arguments and no argtypes (ctypes converting five arguments through their
        # declared types cost ~1 us of a ~10 us call)
        # (None where an entry is not a JIT function, e.g. wrapped by a test: the general path)
        try:
            self._serial: tuple | None = tuple(
                (_raw(entry.call), (self._pointers, self._size_array, ctypes.c_int64(_LO),
                                    ctypes.c_int64(_HI), ctypes.byref(errs[0])), errs[0])
                for (entry, _), errs in zip(self._groups, self._errors, strict=True))
        except ctypes.ArgumentError:
            self._serial = None
        splits = any(len(chunks) > 1 for _, chunks in self._groups)
        # each way's recent call times (unsplit, split); None: nothing to choose
        self._times: tuple[deque[float], deque[float]] | None = (
            (deque(maxlen=PROBE_CALLS), deque(maxlen=PROBE_CALLS)) if splits else None)
        self._since = 0.0  # seconds of calls since the other way last ran
        self._interval = EXPLORE_FIRST  # the other way's calls' worth of time between looks
        self._choice = False  # the way chosen (the way a call runs: `split`)
        self.split = False  # whether calls split their parallel loops (measured: see above)

    def call(self, inputs: Sequence[Any]) -> Any:
        """Run on ``inputs`` (C-contiguous numpy arrays or torch CPU tensors of the plan's
        signature, or scalars for rank-0 ones); returns numpy outputs."""
        keep = []  # converted scalars: alive until the kernel returns
        fresh = []
        if self._lock.acquire(blocking=False):
            pointers, errors, owned = self._pointers, self._errors, True
        else:  # another thread runs this plan: use private arrays
            pointers = (ctypes.c_void_p * max(1, self._n_tensors))()
            errors = [[ErrorSlot() for _ in chunks] for _, chunks in self._groups]
            owned = False
        try:
            for (k, dtype), x in zip(self._inputs, inputs, strict=True):
                cls = x.__class__
                if cls is np.ndarray:
                    pointers[k] = _address(x)
                elif cls in _SCALARS or isinstance(x, np.generic):
                    x = np.asarray(x, dtype=dtype)
                    keep.append(x)
                    pointers[k] = _address(x)
                else:  # a contiguous torch CPU tensor (`host_calls.host_ready`)
                    pointers[k] = x.data_ptr()
            for k, shape, dtype, make in self._fresh:
                a = make(shape, dtype)
                fresh.append(a)
                pointers[k] = _address(a)
            timed = self._times is not None and owned
            began = time.perf_counter() if timed else 0.0
            if not self.split and owned and self._serial is not None:
                for f, args, err in self._serial:
                    err.code = 0
                    f(*args)
                    if err.code:
                        self.kernel._raise_gather(err)
            else:
                for (entry, chunks), errs in zip(self._groups, errors, strict=True):
                    if not self.split:
                        chunks, errs = ((_LO, _HI),), errs[:1]
                    for e in errs:
                        e.code = 0
                    self.kernel._run_chunks(entry, chunks, pointers, self._size_array, errs)
            if timed:
                self._measured(time.perf_counter() - began)
        finally:
            if owned:
                self._lock.release()
        if self._n_outputs == 1:
            return fresh[0]
        return tuple(fresh[: self._n_outputs])

    def _measured(self, seconds: float) -> None:
        """Record a call's time for the way it ran and choose how the next call runs (see
        the module docstring): the measuring order while either way has fewer than
        `PROBE_CALLS` times, else the chosen way, and the other way once it is due."""
        times = self._times
        assert times is not None
        times[self.split].append(seconds)
        unsplit, split = times
        if len(unsplit) < PROBE_CALLS or len(split) < PROBE_CALLS:
            # unsplit, split, split, unsplit, unsplit, split, ...: each way as often first
            # and second of two calls in a row (a caller that times pairs, or alternates with
            # another library, weighs on both alike)
            done = len(unsplit) + len(split)
            self.split = (done + 1) // 2 % 2 == 1
            return
        choice = min(split) < SPLIT_GAIN * min(unsplit)
        if choice != self._choice:  # a new choice: look back at the other way soon
            self._since, self._interval = 0.0, EXPLORE_FIRST
        elif self.split != choice:  # a look that confirmed the choice: the next one later
            self._since, self._interval = 0.0, min(2 * self._interval, EXPLORE_MAX)
        else:
            self._since += seconds
        self._choice = choice
        other = times[not choice]
        self.split = (not choice) if self._since > self._interval * min(other) else choice


def host_plan(kernel: HostKernel, fn: tc.Function, sizes: Mapping[str, int]) -> HostPlan:
    """The kernel's plan for these size values, made on first use (kept on the kernel)."""
    key = tuple(sorted(sizes.items()))
    plan = kernel.plans.get(key)
    if plan is None:
        plan = kernel.plans.setdefault(key, HostPlan(kernel, fn, sizes))
    return plan
