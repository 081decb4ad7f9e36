"""The GPU's ceilings, measured with kernels written for the job (PTX text), not with ours.

Place: `ceilings.measure_ceilings("cuda")` calls `measure_gpu`; the result is cached by
`ceilings.ceilings_for`; the kernels' PTX text is in `ceiling_kernels`. A ceiling measured with code our compiler generates is the ceiling of
that code (on the H200 a parametric TC copy reached 2.94 TB/s where a device copy moves 4.21,
a TC FMA chain 23.8 TFLOP/s where cuBLAS's SGEMM reaches 51), so the profile called the
default matmul "100%". Here each ceiling comes from a small PTX kernel built for it, loaded
with the runtime's module loader, run on device buffers allocated once, timed with CUDA
events around many back-to-back launches:

* **copy bandwidth** (bytes read + written per second): `copy_ptx`'s grid-stride copy with
  128-bit loads and stores (``ld.global.v4.u32`` / ``st.global.v4.u32``, `COPY_UNROLL`
  independent loads in flight per thread), one full-occupancy wave of blocks, over two buffers
  of `COPY_BYTES` (1 GiB moved per launch: far larger than any L2, 50 MB on the H200); the
  best of `RUNS` samples of `COPY_LAUNCHES` launches. The first and last 64 KiB of the
  destination are read back and checked, so a kernel that did not run cannot pass for a fast
  one;
* **read bandwidth** (bytes read per second; DRAM reads alone outrun a copy's mix, so a
  read-only kernel is compared with this one: `ceilings.Ceilings.bandwidth_for`): `read_ptx`'s
  grid-stride sum of the copy's source (`COPY_BYTES`) with the same 128-bit loads and
  `COPY_UNROLL` vectors in flight, each thread adding its vectors into 4 accumulators and
  storing their sum; the stored sums are added up and checked against the source's bytes;
* **fp32 FMA throughput** (FLOP/s, 2 per FMA): `fma_ptx`'s kernel, `FMA_CHAINS` independent
  accumulators per thread, each advanced `FMA_UNROLL` times per loop trip (``fma.rn.f32``: 128
  FMAs to 3 loop instructions), `FMA_WAVES` full-occupancy waves of blocks on every SM; the
  per-thread results are stored (and a few checked against a float64 recurrence) so nothing is
  dead code;
* **launch cost**: the time per launch of `LAUNCHES` back-to-back launches of an empty kernel
  on one stream, between two events — the enqueue rate, which is what a launch costs a
  sequence of calls (through ``libcuda`` with ctypes, as a cached call's launch plan does,
  where that is available; else through cuda-python).

`theoretical_peaks` reads the device attributes (memory clock × bus width × 2, SMs × clock ×
fp32 lanes × 2) for the GPU tests and ``python -m tcmlir.profile --measure``.
"""

from __future__ import annotations

import ctypes
import math
from dataclasses import dataclass
from typing import Any

import numpy as np

from ..errors import TCError
from .ceiling_kernels import (
    COPY_ENTRY,
    COPY_UNROLL,
    EMPTY_ENTRY,
    FMA_CHAINS,
    FMA_ENTRY,
    FMA_UNROLL,
    READ_ENTRY,
    ceilings_ptx,
    copy_ptx,
    empty_ptx,
    fma_ptx,
    fma_reference,
    read_ptx,
)

__all__ = ["COPY_ENTRY", "COPY_UNROLL", "EMPTY_ENTRY", "FMA_CHAINS", "FMA_ENTRY", "FMA_UNROLL",
           "READ_ENTRY", "GpuMeasurement", "ceilings_ptx", "copy_ptx", "empty_ptx", "fma_ptx",
           "fma_reference", "measure_gpu", "read_ptx", "theoretical_peaks"]

COPY_BYTES = 512 << 20      # per buffer: 1 GiB moved per launch
COPY_LAUNCHES = 3           # launches per sample
FMA_ITERATIONS = 64         # loop trips: 8192 FMAs per thread
FMA_WAVES = 4               # full-occupancy waves of blocks
FMA_LAUNCHES = 4
LAUNCHES = 2000             # empty launches per launch-cost sample
RUNS = 5                    # samples; the best is kept
BLOCK = 256
CHECK_BYTES = 64 << 10      # read back from each end of the copy's destination
_FILL = 0x3C                # the source's byte pattern

# fp32 lanes per SM by compute capability major (minor where it differs)
_FP32_LANES = {(6, 0): 64, (7, 0): 64, (7, 5): 64, (8, 0): 64}


@dataclass(frozen=True)
class GpuMeasurement:
    """What `measure_gpu` found: the four ceilings and what they were measured over."""

    bandwidth: float        # bytes/s, read + write
    flops: float            # fp32 FLOP/s
    launch_s: float         # seconds per back-to-back empty launch
    copy_bytes: int         # bytes moved per copy launch
    fma_flops: int          # FLOP per FMA launch
    launches: int           # empty launches per sample
    launch_path: str        # "ctypes" or "cuda-python"
    name: str = ""
    arch: str = ""
    read_bandwidth: float = 0.0   # bytes/s, read only
    read_bytes: int = 0           # bytes read per read launch


# ---------------------------------------------------------------- measuring


def _driver() -> Any:
    from ..runtime import cuda_memory

    return cuda_memory.driver


def device_attributes(ordinal: int, *names: str) -> dict[str, int]:
    """``cuDeviceGetAttribute`` for each ``CU_DEVICE_ATTRIBUTE_<name>``; a name the driver
    does not know or answers with an error is left out."""
    from ..runtime.cuda_memory import check

    drv = _driver()
    dev = check(drv.cuDeviceGet(ordinal), f"cuDeviceGet({ordinal})")
    out = {}
    for name in names:
        enum = getattr(drv.CUdevice_attribute, f"CU_DEVICE_ATTRIBUTE_{name}", None)
        if enum is None:
            continue
        result = drv.cuDeviceGetAttribute(enum, dev)
        if result[0] == drv.CUresult.CUDA_SUCCESS:
            out[name] = int(result[1])
    return out


def theoretical_peaks(ordinal: int = 0) -> tuple[float | None, float | None]:
    """(bytes/s, fp32 FLOP/s) the data sheet promises, from the device attributes: memory
    clock × bus width × 2 (double data rate), SMs × clock × fp32 lanes × 2; None where the
    driver does not report what is needed."""
    attrs = device_attributes(ordinal, "MEMORY_CLOCK_RATE", "GLOBAL_MEMORY_BUS_WIDTH",
                              "CLOCK_RATE", "MULTIPROCESSOR_COUNT", "COMPUTE_CAPABILITY_MAJOR",
                              "COMPUTE_CAPABILITY_MINOR")
    mem, bus = attrs.get("MEMORY_CLOCK_RATE", 0), attrs.get("GLOBAL_MEMORY_BUS_WIDTH", 0)
    bandwidth = 2 * mem * 1e3 * bus / 8 if mem and bus else None
    clock, sms = attrs.get("CLOCK_RATE", 0), attrs.get("MULTIPROCESSOR_COUNT", 0)
    cc = (attrs.get("COMPUTE_CAPABILITY_MAJOR", 0), attrs.get("COMPUTE_CAPABILITY_MINOR", 0))
    lanes = _FP32_LANES.get(cc, 128 if cc[0] >= 8 else 64)
    flops = 2 * lanes * sms * clock * 1e3 if clock and sms else None
    return bandwidth, flops


class _Params:
    """A ``void*[]`` of kernel parameters for ``cuLaunchKernel`` (kept alive with it)."""

    def __init__(self, *values: Any):
        self.values = values  # ctypes scalars
        self.array = (ctypes.c_void_p * max(1, len(values)))(*(ctypes.addressof(v) for v in values))
        self.address = ctypes.addressof(self.array) if values else 0


class _Launcher:
    """Back-to-back launches on one stream between two timing events."""

    def __init__(self, rt: Any, device: int):
        from ..runtime.fast_driver import direct_calls

        self.rt, self.device = rt, device
        self.stream = rt.stream(device)
        self.handle = self.stream.handle
        self.start, self.end = rt.event(device), rt.event(device)
        self.direct = direct_calls(_driver())
        self.path = "cuda-python" if self.direct is None else "ctypes"

    def launch(self, function: Any, grid: int, block: int, params: int, count: int = 1) -> None:
        from ..errors import CudaError
        from ..runtime.cuda_memory import check, error_text

        f = function.handle
        if self.direct is not None:
            # `DirectCalls.launch` takes no argtypes: handles and addresses as c_void_p
            fi, si = self.direct.pointer(int(f)), self.direct.stream(int(self.handle))
            pi = self.direct.pointer(params)
            call = self.direct.launch
            for _ in range(count):
                err = call(fi, grid, 1, 1, block, 1, 1, 0, si, pi, None)
                if err:
                    raise CudaError(f"measuring the ceilings: cuLaunchKernel({function.name}) "
                                    f"failed: {error_text(_driver().CUresult(err))}")
            return
        drv = _driver()
        for _ in range(count):
            check(drv.cuLaunchKernel(f, grid, 1, 1, block, 1, 1, 0, self.handle, params, 0),
                  "cuLaunchKernel", context=f"measuring the ceilings ({function.name})")

    def best(self, function: Any, grid: int, block: int, params: int, count: int,
             runs: int) -> float:
        """The fewest seconds per launch over ``runs`` samples of ``count`` launches."""
        from ..runtime.cuda_memory import elapsed_ms

        self.rt.context(self.device)  # current on this thread (the ctypes path needs it)
        self.launch(function, grid, block, params)  # warm-up
        self.stream.synchronize()
        times = []
        for _ in range(runs):
            self.start.record(self.stream)
            self.launch(function, grid, block, params, count)
            self.end.record(self.stream)
            times.append(elapsed_ms(self.start, self.end) / 1e3 / count)
        return min(times)


def measure_gpu(runtime: Any = None, device: int = 0, *, copy_bytes: int | None = None,
                fma_iterations: int | None = None, launches: int | None = None,
                runs: int | None = None) -> GpuMeasurement:
    """Measure ``device``'s ceilings now (see the module docstring); ``copy_bytes`` per buffer
    (default `COPY_BYTES`, at most an eighth of the device's memory), the other sizes default
    to `FMA_ITERATIONS`, `LAUNCHES` and `RUNS`."""
    from ..runtime import cuda_launch

    fma_iterations = FMA_ITERATIONS if fma_iterations is None else fma_iterations
    launches = LAUNCHES if launches is None else launches
    runs = RUNS if runs is None else runs

    rt = runtime or cuda_launch.get_runtime()
    dev = rt.device(device)
    attrs = device_attributes(device, "MAX_THREADS_PER_MULTIPROCESSOR")
    per_sm = max(1, attrs.get("MAX_THREADS_PER_MULTIPROCESSOR", 2048) // BLOCK)
    wave = dev.multiprocessor_count * per_sm
    module = rt.load_ptx(ceilings_ptx(dev.arch), device, name="tcmlir-ceilings.ptx")
    copy_k, read_k, fma_k, empty_k = (module.function(n) for n in (
        COPY_ENTRY, READ_ENTRY, FMA_ENTRY, EMPTY_ENTRY))
    timer = _Launcher(rt, device)

    nbytes = copy_bytes if copy_bytes is not None else min(COPY_BYTES, dev.total_memory // 8)
    nbytes = max(16, nbytes // 16 * 16)
    src, dst = _alloc(rt, nbytes, device), _alloc(rt, nbytes, device)
    try:
        src.memset(_FILL)
        dst.memset(0)
        args = _Params(ctypes.c_uint64(dst.ptr), ctypes.c_uint64(src.ptr),
                       ctypes.c_uint64(nbytes // 16))
        copy_s = timer.best(copy_k, wave, BLOCK, args.address, COPY_LAUNCHES, runs)
        _check_copy(dst, nbytes)
        sums = _alloc(rt, wave * BLOCK * 4, device)
        try:
            args = _Params(ctypes.c_uint64(sums.ptr), ctypes.c_uint64(src.ptr),
                           ctypes.c_uint64(nbytes // 16))
            read_s = timer.best(read_k, wave, BLOCK, args.address, COPY_LAUNCHES, runs)
            _check_read(sums, wave * BLOCK, nbytes)
        finally:
            sums.close()
    finally:
        src.close()
        dst.close()

    blocks = wave * FMA_WAVES
    threads = blocks * BLOCK
    out = _alloc(rt, threads * 4, device)
    a, b = np.float32(0.9999), np.float32(1e-4)
    try:
        args = _Params(ctypes.c_uint64(out.ptr), ctypes.c_float(a), ctypes.c_float(b),
                       ctypes.c_uint32(fma_iterations))
        fma_s = timer.best(fma_k, blocks, BLOCK, args.address, FMA_LAUNCHES, runs)
        _check_fma(out, threads, float(a), float(b), fma_iterations * FMA_UNROLL)
    finally:
        out.close()

    empty = _Params()
    launch_s = timer.best(empty_k, 1, 32, empty.address, launches, runs)

    fma_flops = 2 * threads * FMA_CHAINS * FMA_UNROLL * fma_iterations
    bandwidth, flops, read = 2 * nbytes / copy_s, fma_flops / fma_s, nbytes / read_s
    if not all(math.isfinite(x) and x > 0 for x in (bandwidth, flops, launch_s, read)):
        raise TCError(f"measuring the GPU ceilings gave {bandwidth} B/s, {flops} FLOP/s, "
                      f"{read} B/s read, {launch_s} s per launch: the event clock is broken")
    return GpuMeasurement(bandwidth, flops, launch_s, 2 * nbytes, fma_flops, launches,
                          timer.path, name=getattr(dev, "name", ""), arch=dev.arch,
                          read_bandwidth=read, read_bytes=nbytes)


def _alloc(rt: Any, nbytes: int, device: int) -> Any:
    from ..errors import CudaError

    try:
        return rt.alloc(nbytes, device)
    except CudaError as exc:
        raise CudaError(f"measuring the ceilings: a buffer of {nbytes} bytes could not be "
                        f"allocated ({exc}); free memory on device {device}, or "
                        "set TCMLIR_CEILINGS=bandwidth=...,flops=...,launch=... to skip the "
                        "measurement") from None


def _check_copy(dst: Any, nbytes: int) -> None:
    """The first and last `CHECK_BYTES` of the destination hold the source's pattern."""
    n = min(CHECK_BYTES, nbytes)
    head = np.empty(n, np.uint8)
    dst.copy_to_host(head)
    tail = np.empty(n, np.uint8)
    _copy_tail(dst, tail, nbytes)
    for part, where in ((head, "first"), (tail, "last")):
        if not np.all(part == _FILL):
            raise TCError(f"measuring the copy bandwidth: the {where} {n} bytes of the copy's "
                          "destination do not hold the source's bytes; the copy kernel did not "
                          "run right, so its time says nothing (set TCMLIR_CEILINGS instead)")


def _check_read(sums: Any, threads: int, nbytes: int) -> None:
    """The threads' stored sums add up to the source's: ``nbytes / 4`` floats of the fill."""
    got = np.empty(threads, np.float32)
    sums.copy_to_host(got)
    value = float(np.frombuffer(bytes([_FILL] * 4), np.float32)[0])
    want = nbytes / 4 * value
    total = float(got.astype(np.float64).sum())
    if not math.isclose(total, want, rel_tol=1e-3):
        raise TCError(f"measuring the read bandwidth: the read kernel's sums add up to {total}, "
                      f"the source holds {want}; it did not read everything, so its time says "
                      "nothing (set TCMLIR_CEILINGS instead)")


def _copy_tail(dst: Any, tail: np.ndarray, nbytes: int) -> None:
    from ..runtime.cuda_memory import check

    drv = _driver()
    check(drv.cuMemcpyDtoH(tail.ctypes.data, drv.CUdeviceptr(dst.ptr + nbytes - tail.nbytes),
                           tail.nbytes), f"cuMemcpyDtoH({tail.nbytes} bytes)")


def _check_fma(out: Any, threads: int, a: float, b: float, steps: int) -> None:
    """The first and last 256 threads' results equal the float64 recurrence (to 1e-3)."""
    got = np.empty(threads, np.float32)
    out.copy_to_host(got)
    ids = np.unique(np.r_[0:min(256, threads), max(0, threads - 256):threads])
    want = fma_reference(ids, a, b, steps)
    if not np.allclose(got[ids], want, rtol=1e-3, atol=1e-3):
        k = int(ids[np.argmax(np.abs(got[ids] - want))])
        raise TCError(f"measuring the FMA throughput: thread {k} stored {got[k]}, the "
                      f"recurrence gives {want[list(ids).index(k)]}; the FMA kernel did not "
                      "run right, so its time says nothing (set TCMLIR_CEILINGS instead)")
