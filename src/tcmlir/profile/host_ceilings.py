"""The host's ceilings: a STREAM-like copy, our own FMA-chain kernel, the cost of one call.

Place: `ceilings.measure_ceilings("cpu")` calls `measure_host`; `ceilings.ceilings_for` caches
the result. Everything a measurement needs (arrays, the compiled kernel, its packed pointer
and size arrays, the worker threads) is made before its clock starts; the timed region only
runs the work:

* **copy bandwidth** (bytes read + written per second): ``numpy.copyto`` between two
  preallocated, already touched arrays of `COPY_FLOATS` float32 (64 MiB each, larger than a
  host's last-level cache), one slice per host thread (numpy drops the GIL while copying),
  the best of `RUNS` — the host's copy bandwidth, as STREAM measures it;
* **fp32 FMA throughput** (FLOP/s): a TC kernel whose every element runs `CHAIN` dependent
  FMAs, compiled by our pipeline for the cpu target (all host threads), its loop groups called
  through the runner's entry points on pointers packed once; the flops are counted with
  `counts.count_work` — what our generated code reaches, best of `RUNS`. The host target
  contracts ``x * a + b`` into one vector FMA (`codegen.target.HostTarget.contract_floats`),
  the instruction the packed contraction kernel (`codegen/host_gemm.py`) runs on;
* **launch cost**: the time per call of that kernel's entry on one element, `CALLS` calls back
  to back (the ctypes call and the thread hand-off: the host's analogue of an empty launch).
"""

from __future__ import annotations

import ctypes
import itertools
import os
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import numpy as np

__all__ = ["CHAIN", "measure_host"]

CHAIN = 96
COPY_FLOATS = 1 << 24
CHAIN_FLOATS = 1 << 20
RUNS = 5
CALLS = 200

_COPY = "def copy(float(N) X) -> (Y) { Y(i) = X(i) }"
_clock = time.perf_counter  # the measurements' clock (a test watches what runs while it runs)


def _chain_source() -> str:
    e = "X(i)"
    for _ in range(CHAIN):
        e = f"({e} * a + b)"
    return f"def fma_chain(float(N) X, float a, float b) -> (Y) {{ Y(i) = {e} }}"


def _best(work: Callable[[], None], runs: int) -> float:
    """The fewest seconds of ``runs`` calls of ``work`` (after one untimed call)."""
    work()
    times = []
    for _ in range(runs):
        start = _clock()
        work()
        times.append(_clock() - start)
    return min(times)


def copy_bandwidth(n: int = COPY_FLOATS, threads: int | None = None, runs: int = RUNS) -> float:
    """Bytes read + written per second by a threaded ``numpy.copyto`` of ``n`` float32."""
    threads = max(1, threads or os.cpu_count() or 1)
    x = np.random.default_rng(0).random(n, dtype=np.float32)
    y = np.zeros_like(x)  # touched: no page faults in the timed copies
    bounds = [k * n // threads for k in range(threads + 1)]
    pieces = [(y[lo:hi], x[lo:hi]) for lo, hi in itertools.pairwise(bounds)]
    if threads == 1:
        def work() -> None:
            np.copyto(y, x)
        return 2 * x.nbytes / _best(work, runs)
    with ThreadPoolExecutor(threads) as pool:
        def work() -> None:
            for f in [pool.submit(np.copyto, dst, src) for dst, src in pieces]:
                f.result()
        seconds = _best(work, runs)
    if not np.array_equal(y[-16:], x[-16:]):  # pragma: no cover - numpy is broken
        raise AssertionError("the host copy did not copy")
    return 2 * x.nbytes / seconds


class _PackedCall:
    """A compiled cpu kernel's loop groups on arrays bound and pointers packed once."""

    def __init__(self, fn: Any, runner: Any, inputs: tuple[Any, ...]):
        from ..binding import allocate_outputs, bind_host_inputs

        self.runner = runner
        bound = bind_host_inputs(fn, inputs)
        sizes = self.runner.check_sizes(bound.sizes)
        self.arrays = {**bound.arrays, **allocate_outputs(fn, bound.sizes)}
        self._buffers = self.runner._buffers(self.arrays, sizes)
        self.ptrs = (ctypes.c_void_p * max(1, len(self._buffers)))(
            *(a.ctypes.data for a in self._buffers))
        self.sizes = (ctypes.c_int64 * max(1, len(fn.sizes)))(*(sizes[s] for s in fn.sizes))

    def __call__(self) -> None:
        for entry in self.runner.entries:
            self.runner._run_group(entry, self.ptrs, self.sizes)


def measure_host(*, copy_floats: int = COPY_FLOATS, chain_floats: int = CHAIN_FLOATS,
                 runs: int = RUNS) -> tuple[float, float, float]:
    """(copy bytes/s, fp32 FLOP/s, seconds per call) of this host (see the module docstring)."""
    from ..codegen.host import compile_host
    from ..compiler import lower
    from ..config import get_config
    from ..lang import check, parse
    from ..options import MappingOptions
    from .counts import count_work

    bandwidth = copy_bandwidth(copy_floats, runs=runs)
    # compiled as a cpu call of the definition compiles it (`compiler.compile_kernel`), without
    # the artifact cache: the parametric default options, the configured threads
    chain = check(parse(_chain_source(), "<host ceilings>"))
    a, b = np.float32(0.999), np.float32(0.001)
    x = np.random.default_rng(1).random(chain_floats, dtype=np.float32)
    opts = MappingOptions.default_for(chain, "cpu").with_parametric()
    runner = compile_host(lower(chain, None, opts, "cpu"), opts.threads or get_config().threads)
    flops = count_work(chain, {"N": chain_floats}).flops / _best(_PackedCall(chain, runner, (x, a, b)),
                                                               runs)
    one = _PackedCall(chain, runner, (x[:1].copy(), a, b))

    def calls() -> None:
        for _ in range(CALLS):
            one()

    launch = _best(calls, runs) / CALLS
    return bandwidth, flops, launch
