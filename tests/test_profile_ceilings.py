"""The profiler's ceilings: the measurement kernels, the GPU measurement over a fake driver,
the cache (versions, overrides), the host measurement's method, the `[launch]` threshold.

The GPU measurement (`gpu_ceilings.measure_gpu`) runs here on `fake_cuda`, extended with
device attributes, streams and a simulator that really copies and runs the FMA recurrence, so
what is launched, what is timed between which events, and how the numbers are derived are
checked without a GPU (every event pair reads 0.25 ms). The kernels' PTX is assembled with
``ptxas -arch=sm_90`` and run, thread by thread, by a small interpreter of the PTX subset
they use (`PtxThreads`): the copy on sizes that exercise the unrolled trips and the tail, the
FMA kernel against the float64 recurrence. The ``gpu`` tests at the end check the numbers on
a real device.
"""

from __future__ import annotations

import ctypes
import gc
import json
import struct
import types

import numpy as np
import pytest
from fake_cuda import FakeDriver, FakeRuntime, install_fake

import tcmlir as tc
from tcmlir.codegen.ptx_tools import find_ptxas, ptxas_check
from tcmlir.errors import TCError
from tcmlir.profile import Ceilings, build_profile
from tcmlir.profile import ceilings as mod
from tcmlir.profile import gpu_ceilings as gpu
from tcmlir.runtime import cuda_memory

needs_ptxas = pytest.mark.skipif(find_ptxas() is None, reason="ptxas not on PATH")
EVENT_S = 0.25e-3  # what the fake's cuEventElapsedTime reads
SMS = 2


# ---------------------------------------------------------------- the kernels


@needs_ptxas
def test_measurement_kernels_assemble_for_sm_90():
    from tcmlir.profile.occupancy import ptxas_resources

    ptx = gpu.ceilings_ptx("sm_90")
    assert ptx.isascii() and ".target sm_90" in ptx
    ptxas_check(ptx, "sm_90")
    res = ptxas_resources(ptx, "sm_90")
    # full occupancy (2048 threads of <= 32 registers on sm_90) and nothing spilled
    assert set(res) == {gpu.COPY_ENTRY, gpu.READ_ENTRY, gpu.FMA_ENTRY, gpu.EMPTY_ENTRY}
    assert all(r.registers <= 32 and not r.spill_bytes for r in res.values())


def test_copy_kernel_moves_128_bit_vectors_and_fma_kernel_has_independent_chains():
    copy = gpu.copy_ptx()
    body = copy.split(f"${gpu.COPY_ENTRY}_main:")[1].split(f"${gpu.COPY_ENTRY}_tail:")[0]
    assert body.count("ld.global.v4.u32") == gpu.COPY_UNROLL == body.count("st.global.v4.u32")
    # every load of a trip is issued before its first store
    assert body.rindex("ld.global") < body.index("st.global")
    fma = gpu.fma_ptx()
    loop = fma.split(f"${gpu.FMA_ENTRY}_loop:")[1].split(f"${gpu.FMA_ENTRY}_done:")[0]
    fmas = [line.split()[1].rstrip(",") for line in loop.splitlines() if "fma.rn.f32" in line]
    assert len(fmas) == gpu.FMA_CHAINS * gpu.FMA_UNROLL
    # chain k's FMA reads the value written FMA_CHAINS instructions earlier, never the last one
    assert all(fmas[i] != fmas[i - 1] for i in range(1, len(fmas)))
    assert fmas[:gpu.FMA_CHAINS] * gpu.FMA_UNROLL == fmas
    assert len(set(fmas)) == gpu.FMA_CHAINS
    assert "st.global.f32" in fma  # the results are stored: no dead code to remove
    read = gpu.read_ptx()
    body = read.split(f"${gpu.READ_ENTRY}_main:")[1].split(f"${gpu.READ_ENTRY}_tail:")[0]
    assert body.count("ld.global.v4.f32") == gpu.COPY_UNROLL and "st.global" not in body
    assert body.rindex("ld.global") < body.index("add.f32"), "all loads in flight first"


class PtxThreads:
    """A small interpreter of the PTX subset the measurement kernels use, thread by thread
    (they share nothing but global memory), so their index arithmetic and results are
    checked here rather than only on a GPU. Global memory is ``memory`` (bytes, addresses
    are offsets into it)."""

    def __init__(self, ptx: str, entry: str, memory: np.ndarray):
        head, body = ptx.split(f".entry {entry}(")[1].split(")", 1)
        self.params = [line.split()[-1].rstrip(",") for line in head.splitlines()
                       if ".param" in line]
        lines = body.split("{", 1)[1].split("\n}", 1)[0].splitlines()
        self.code = [ln.split("//")[0].strip().rstrip(";") for ln in lines]
        self.code = [c for c in self.code if c and not c.startswith(".reg")]
        self.labels = {c[:-1]: i for i, c in enumerate(self.code) if c.endswith(":")}
        self.mem = memory

    def run(self, grid: int, block: int, args: list) -> int:
        steps = 0
        for b in range(grid):
            for t in range(block):
                steps += self._thread(b, t, grid, block, dict(zip(self.params, args,
                                                                  strict=True)))
        return steps

    def _value(self, regs, tok):
        tok = tok.strip()
        if tok.startswith("0f"):
            return np.frombuffer(bytes.fromhex(tok[2:])[::-1], np.float32)[0]
        if tok.startswith("%"):
            return regs.get(tok)  # None: a destination not written yet
        return int(tok)

    def _thread(self, b, t, grid, block, params) -> int:
        special = {"%ctaid.x": b, "%tid.x": t, "%ntid.x": block, "%nctaid.x": grid}
        regs, pc, steps = dict(special), 0, 0
        f32 = np.float32
        while True:
            ins = self.code[pc]
            pc += 1
            steps += 1
            if ins.endswith(":"):
                continue
            guard = None
            if ins.startswith("@"):
                guard, ins = ins.split(None, 1)
                if not regs[guard[1:]]:
                    continue
            op, _, rest = ins.partition(" ")
            ops = [o.strip() for o in rest.replace("{", "").replace("}", "").split(",")] \
                if rest else []
            v = [self._value(regs, o) if not o.startswith("[") else o for o in ops[1:]]
            kind = op.split(".")
            if op == "ret":
                return steps
            if kind[0] == "bra":
                pc = self.labels[ops[0]]
            elif op.startswith("ld.param"):
                regs[ops[0]] = params[ops[1][1:-1]]
            elif op in ("cvta.to.global.u64", "mov.u32", "mov.f32", "mov.b64", "cvt.u64.u32"):
                regs[ops[0]] = v[0]
            elif op == "cvt.rn.f32.u32":
                regs[ops[0]] = f32(v[0])
            elif op in ("mul.wide.u32", "mul.lo.s64"):
                regs[ops[0]] = v[0] * v[1]
            elif op in ("add.s64", "add.s32"):
                regs[ops[0]] = v[0] + v[1]
            elif op == "add.f32":
                regs[ops[0]] = f32(v[0] + v[1])
            elif op == "mul.f32":
                regs[ops[0]] = f32(v[0] * v[1])
            elif op == "mad.lo.s32":
                regs[ops[0]] = v[0] * v[1] + v[2]
            elif op == "shl.b64":
                regs[ops[0]] = v[0] << v[1]
            elif op == "fma.rn.f32":
                regs[ops[0]] = f32(float(v[0]) * float(v[1]) + float(v[2]))
            elif kind[0] == "setp":
                cmp = {"ge": v[0] >= v[1], "lt": v[0] < v[1], "eq": v[0] == v[1]}[kind[1]]
                regs[ops[0]] = cmp
            elif op == "ld.global.v4.u32":
                addr = regs[ops[4][1:-1]]
                words = self.mem[addr:addr + 16].view(np.uint32)
                for k in range(4):
                    regs[ops[k]] = int(words[k])
            elif op == "ld.global.v4.f32":
                addr = regs[ops[4][1:-1]]
                lanes = self.mem[addr:addr + 16].view(np.float32)
                for k in range(4):
                    regs[ops[k]] = lanes[k]
            elif op == "st.global.v4.u32":
                addr = regs[ops[0][1:-1]]
                self.mem[addr:addr + 16].view(np.uint32)[:] = [regs[o] for o in ops[1:5]]
            elif op == "st.global.f32":
                addr = regs[ops[0][1:-1]]
                self.mem[addr:addr + 4].view(np.float32)[0] = regs[ops[1]]
            else:  # pragma: no cover - an instruction the kernels gained
                raise AssertionError(f"the test's PTX interpreter lacks {ins!r}")


@pytest.mark.parametrize("vectors", [1, 37, 4 * 2 * 8, 4 * 2 * 8 * 3 + 5])
def test_copy_kernel_copies_every_vector_once(vectors):
    """2 blocks of 8 threads over ``vectors`` 16-byte vectors: main trips and the tail."""
    rng = np.random.default_rng(vectors)
    memory = np.zeros(64 + 32 * vectors, np.uint8)
    src, dst = 64, 64 + 16 * vectors
    memory[src:dst] = rng.integers(0, 256, 16 * vectors, dtype=np.uint8)
    PtxThreads(gpu.ceilings_ptx(), gpu.COPY_ENTRY, memory).run(2, 8, [dst, src, vectors])
    np.testing.assert_array_equal(memory[dst:], memory[src:dst])
    assert not memory[:src].any(), "nothing written outside the destination"


@pytest.mark.parametrize("vectors", [1, 37, 4 * 2 * 8 * 3 + 5])
def test_read_kernel_sums_every_vector_once(vectors):
    """2 blocks of 8 threads: thread t stores the sum of the vectors t, t + 16, ... (lanes
    included); small integers, so the float sums are exact."""
    rng = np.random.default_rng(vectors)
    values = rng.integers(0, 8, 4 * vectors).astype(np.float32)
    memory = np.zeros(64 + 16 * vectors, np.uint8)
    memory[64:] = values.view(np.uint8)
    PtxThreads(gpu.ceilings_ptx(), gpu.READ_ENTRY, memory).run(2, 8, [0, 64, vectors])
    want = [values.reshape(vectors, 4)[t::16].sum() for t in range(16)]
    np.testing.assert_array_equal(memory[:64].view(np.float32), want)
    np.testing.assert_array_equal(memory[64:].view(np.float32), values), "the source is kept"


def test_fma_kernel_stores_the_recurrence_of_every_thread():
    memory = np.zeros(4 * 3 * 16, np.uint8)
    a, b = np.float32(0.9999), np.float32(1e-4)
    PtxThreads(gpu.ceilings_ptx(), gpu.FMA_ENTRY, memory).run(3, 16, [0, a, b, 2])
    want = gpu.fma_reference(np.arange(48), float(a), float(b), 2 * gpu.FMA_UNROLL)
    np.testing.assert_allclose(memory.view(np.float32), want, rtol=1e-6)
    zero = np.zeros(4 * 4, np.uint8)
    PtxThreads(gpu.ceilings_ptx(), gpu.FMA_ENTRY, zero).run(1, 4, [0, a, b, 0])
    np.testing.assert_allclose(zero.view(np.float32), gpu.fma_reference(np.arange(4), a, b, 0))


# ---------------------------------------------------------------- a fake GPU


class CeilingDriver(FakeDriver):
    """The fake plus device attributes, streams, a real byte memset, and a simulator of the
    measurement kernels (the copy moves bytes; the FMA kernel stores the recurrence)."""

    CUdevice_attribute = types.SimpleNamespace(**{
        f"CU_DEVICE_ATTRIBUTE_{n}": n for n in (
            "MAX_THREADS_PER_MULTIPROCESSOR", "MEMORY_CLOCK_RATE", "GLOBAL_MEMORY_BUS_WIDTH",
            "CLOCK_RATE", "MULTIPROCESSOR_COUNT", "COMPUTE_CAPABILITY_MAJOR",
            "COMPUTE_CAPABILITY_MINOR")})
    CUstream_flags = types.SimpleNamespace(CU_STREAM_DEFAULT=types.SimpleNamespace(value=0))

    def __init__(self, copies: bool = True):
        super().__init__()
        self.copies = copies
        self.reads = True
        self.attrs = {"MAX_THREADS_PER_MULTIPROCESSOR": 2048, "MEMORY_CLOCK_RATE": 3_201_000,
                      "GLOBAL_MEMORY_BUS_WIDTH": 6144, "CLOCK_RATE": 1_980_000,
                      "MULTIPROCESSOR_COUNT": SMS, "COMPUTE_CAPABILITY_MAJOR": 9,
                      "COMPUTE_CAPABILITY_MINOR": 0}
        self.simulate = self._run

    def cuDeviceGet(self, ordinal):
        return self.CUresult.CUDA_SUCCESS, ordinal

    def cuDeviceGetAttribute(self, attr, dev):
        return self.CUresult.CUDA_SUCCESS, self.attrs[attr]

    def cuStreamCreate(self, flags):
        self.calls.append(("cuStreamCreate",))
        return self.CUresult.CUDA_SUCCESS, 0x77

    def cuStreamDestroy(self, stream):
        return (self.CUresult.CUDA_SUCCESS,)

    def cuMemsetD8(self, ptr, value, count):
        self.calls.append(("cuMemsetD8", int(ptr), count, value))
        ctypes.memset(int(ptr), value, count)
        return (self.CUresult.CUDA_SUCCESS,)

    def cuLaunchKernel(self, f, gx, gy, gz, bx, by, bz, shared, stream, params, extra):
        self.grid, self.block = (gx, gy, gz), (bx, by, bz)
        return super().cuLaunchKernel(f, gx, gy, gz, bx, by, bz, shared, stream, params, extra)

    def _run(self, name, slots):
        if name == gpu.COPY_ENTRY and self.copies:
            dst, src, n = slots
            ctypes.memmove(dst, src, 16 * n)
        elif name == gpu.READ_ENTRY and self.reads:
            out, src, n = slots
            threads = self.grid[0] * self.block[0]
            data = np.ctypeslib.as_array((ctypes.c_float * (4 * n)).from_address(src))
            padded = np.zeros(-(-n // threads) * threads * 4, np.float32)
            padded[:4 * n] = data
            sums = padded.reshape(-1, threads, 4).sum(axis=(0, 2), dtype=np.float32)
            ctypes.memmove(out, sums.ctypes.data, 4 * threads)
        elif name == gpu.FMA_ENTRY:
            out, a, b, iterations = slots
            threads = self.grid[0] * self.block[0]
            f32 = [struct.unpack("<f", struct.pack("<I", v & 0xFFFFFFFF))[0] for v in (a, b)]
            steps = (iterations & 0xFFFFFFFF) * gpu.FMA_UNROLL
            got = gpu.fma_reference(np.arange(threads), *f32, steps).astype(np.float32)
            ctypes.memmove(out, got.ctypes.data, 4 * threads)


class CeilingRuntime(FakeRuntime):
    def device(self, ordinal: int = 0):
        return types.SimpleNamespace(arch="sm_90", name="Fake H200", multiprocessor_count=SMS,
                                     total_memory=64 << 20)

    def stream(self, device: int = 0):
        return cuda_memory.Stream(self.context_)


@pytest.fixture
def fake_gpu(monkeypatch):
    # earlier tests' device objects are finalised now, against their own drivers: collected
    # later, their frees would land in this driver's call log between the timed launches
    gc.collect()
    driver = CeilingDriver()
    install_fake(monkeypatch)
    from tcmlir.runtime import cuda as rcuda
    from tcmlir.runtime import cuda_launch

    for module in (cuda_memory, rcuda, cuda_launch):
        monkeypatch.setattr(module, "driver", driver)
    runtime = CeilingRuntime(driver)
    monkeypatch.setattr(cuda_launch, "get_runtime", lambda: runtime)
    return driver, runtime


def _samples(driver, entry):
    """The launches of ``entry`` between each pair of event records (after its warm-up)."""
    out, current = [], None
    for c in driver.calls:
        if c[0] == "cuEventRecord":
            if current is None:
                current = []
            else:
                out.append(current)
                current = None
        elif current is not None:
            current.append(c)
    return [s for s in out if s and s[0][0] == "cuLaunchKernel" and s[0][1] == entry]


def test_gpu_measurement_over_the_fake_driver(fake_gpu):
    driver, runtime = fake_gpu
    m = gpu.measure_gpu(runtime, copy_bytes=1 << 20, fma_iterations=2, launches=100, runs=3)
    # the copy: 2 x 1 MiB buffers, one full-occupancy wave, 3 samples of COPY_LAUNCHES
    copies = _samples(driver, gpu.COPY_ENTRY)
    assert len(copies) == 3 and all(len(s) == gpu.COPY_LAUNCHES for s in copies)
    assert all(c[0] == "cuLaunchKernel" for s in copies for c in s), "nothing else is timed"
    launch = copies[0][0]
    assert launch[2] == (SMS * 2048 // gpu.BLOCK, 1, 1) and launch[3] == (gpu.BLOCK, 1, 1)
    assert launch[5][2] == (1 << 20) // 16, "n counts 16-byte vectors"
    assert m.copy_bytes == 2 << 20
    assert m.bandwidth == pytest.approx(2 * (1 << 20) / (EVENT_S / gpu.COPY_LAUNCHES))
    # the read: the copy's source, the same grid, one float per thread stored
    reads = _samples(driver, gpu.READ_ENTRY)
    assert len(reads) == 3 and all(len(s) == gpu.COPY_LAUNCHES for s in reads)
    assert reads[0][0][2] == launch[2] and reads[0][0][5][1:] == launch[5][1:]
    assert m.read_bytes == 1 << 20
    assert m.read_bandwidth == pytest.approx((1 << 20) / (EVENT_S / gpu.COPY_LAUNCHES))
    # FMA: FMA_WAVES waves of blocks, the FLOP of every thread's chains
    fmas = _samples(driver, gpu.FMA_ENTRY)
    assert len(fmas) == 3 and all(len(s) == gpu.FMA_LAUNCHES for s in fmas)
    blocks = SMS * 8 * gpu.FMA_WAVES
    assert fmas[0][0][2] == (blocks, 1, 1)
    assert m.fma_flops == 2 * blocks * gpu.BLOCK * gpu.FMA_CHAINS * gpu.FMA_UNROLL * 2
    assert m.flops == pytest.approx(m.fma_flops / (EVENT_S / gpu.FMA_LAUNCHES))
    # the launch cost: 100 empty launches back to back between two events, no wait between
    empties = _samples(driver, gpu.EMPTY_ENTRY)
    assert len(empties) == 3 and all(len(s) == 100 for s in empties)
    assert all(c[1] == gpu.EMPTY_ENTRY and c[4] == 0x77 for s in empties for c in s)
    assert m.launch_s == pytest.approx(EVENT_S / 100) and m.launch_path == "cuda-python"
    # buffers are allocated before the clock starts and freed after
    allocs = [c for c in driver.calls if c[0] == "cuMemAlloc"]
    wave = SMS * 2048 // gpu.BLOCK
    assert sorted(c[1] for c in allocs) == sorted([1 << 20, 1 << 20, wave * gpu.BLOCK * 4,
                                                   blocks * gpu.BLOCK * 4])
    assert (m.name, m.arch) == ("Fake H200", "sm_90")


def test_a_copy_that_did_not_copy_is_refused(fake_gpu):
    driver, runtime = fake_gpu
    driver.copies = False
    with pytest.raises(TCError, match="copy kernel did not run right"):
        gpu.measure_gpu(runtime, copy_bytes=1 << 16, fma_iterations=1, launches=10, runs=1)


def test_a_read_that_did_not_read_is_refused(fake_gpu):
    driver, runtime = fake_gpu
    driver.reads = False
    with pytest.raises(TCError, match="read kernel's sums"):
        gpu.measure_gpu(runtime, copy_bytes=1 << 16, fma_iterations=1, launches=10, runs=1)


def test_theoretical_peaks_from_the_device_attributes(fake_gpu):
    bandwidth, flops = gpu.theoretical_peaks(0)
    assert bandwidth == pytest.approx(2 * 3.201e9 * 6144 / 8)      # 4.92 TB/s: the H200's
    assert flops == pytest.approx(2 * 128 * SMS * 1.98e9)
    driver, _ = fake_gpu
    driver.attrs["MEMORY_CLOCK_RATE"] = 0                            # not reported
    assert gpu.theoretical_peaks(0)[0] is None


# ---------------------------------------------------------------- the cache


def test_cuda_ceilings_are_cached_by_version(fake_gpu, tmp_path, monkeypatch):
    monkeypatch.delenv("TCMLIR_CEILINGS", raising=False)
    monkeypatch.setenv("TCMLIR_CACHE_DIR", str(tmp_path))
    key = "cuda|sm_90|Fake H200"
    # an entry of the old method (no version): the 2.94 TB/s the TC copy kernel measured
    old = {"bandwidth": 2.94e12, "flops": 2.38e13, "launch_s": 3.95e-5, "device": "Fake H200",
           "arch": "sm_90", "target": "cuda", "source": "measured"}
    (tmp_path / "ceilings.json").write_text(json.dumps({key: old, "other|x|y": {"a": 1}}))
    monkeypatch.setattr(gpu, "COPY_BYTES", 1 << 20)
    monkeypatch.setattr(gpu, "LAUNCHES", 50)
    monkeypatch.setattr(gpu, "FMA_ITERATIONS", 1)
    before = mod.MEASURE_COUNTS["measure"]
    first = mod.ceilings_for("cuda")
    assert first.source == "measured" and mod.MEASURE_COUNTS["measure"] == before + 1
    assert first.bandwidth == pytest.approx(2 * (1 << 20) / (EVENT_S / gpu.COPY_LAUNCHES))
    assert first.launch_s == pytest.approx(EVENT_S / 50)
    assert first.read_bandwidth == pytest.approx((1 << 20) / (EVENT_S / gpu.COPY_LAUNCHES))
    assert (first.device, first.arch, first.target) == ("Fake H200", "sm_90", "cuda")
    stored = json.loads((tmp_path / "ceilings.json").read_text())
    assert stored[key]["version"] == mod.CEILINGS_VERSION and "other|x|y" in stored
    second = mod.ceilings_for("cuda")
    assert second.source == "cache" and mod.MEASURE_COUNTS["measure"] == before + 1
    assert (second.bandwidth, second.read_bandwidth) == (first.bandwidth, first.read_bandwidth)
    # an entry of an older version is measured again
    stored[key]["version"] = mod.CEILINGS_VERSION - 1
    (tmp_path / "ceilings.json").write_text(json.dumps(stored))
    assert mod.ceilings_for("cuda").source == "measured"
    assert mod.MEASURE_COUNTS["measure"] == before + 2


def test_the_environment_and_given_ceilings_override_without_measuring(fake_gpu, monkeypatch):
    monkeypatch.setenv("TCMLIR_CEILINGS", "bandwidth=4.21e12,flops=5.1e13,launch=3e-6")
    before = mod.MEASURE_COUNTS["measure"]
    ceil = mod.ceilings_for("cuda")
    assert (ceil.source, ceil.bandwidth, ceil.launch_s) == ("env", 4.21e12, 3e-6)
    assert ceil.read_bandwidth == 0 and ceil.bandwidth_for(100, 0) == 4.21e12
    monkeypatch.setenv("TCMLIR_CEILINGS", "bandwidth=3.84e12,flops=5.1e13,read=4.2e12")
    assert mod.ceilings_for("cuda").bandwidth_for(100, 0) == 4.2e12
    given = mod.ceilings_for("cuda", {"bandwidth": 1e12, "flops": 1e13})
    assert given.source == "given" and mod.MEASURE_COUNTS["measure"] == before
    driver, _ = fake_gpu
    assert not any(c[0] == "cuLaunchKernel" for c in driver.calls)


def test_measure_command_prints_the_ceilings_and_the_peaks(fake_gpu, tmp_path, monkeypatch,
                                                           capsys):
    monkeypatch.setenv("TCMLIR_CACHE_DIR", str(tmp_path))
    monkeypatch.setattr(gpu, "COPY_BYTES", 1 << 20)
    monkeypatch.setattr(gpu, "LAUNCHES", 50)
    monkeypatch.setattr(gpu, "FMA_ITERATIONS", 1)
    assert mod.main(["--measure", "--target", "cuda"]) == 0
    out = capsys.readouterr().out
    assert "cuda ceilings of Fake H200 (sm_90; measured)" in out
    assert "launch cost     5.00 us" in out and "peak from the device attributes: 4.92 TB/s" in out
    assert "(copy: 2.1 MB moved per launch;" in out and "50 empty launches per sample" in out
    assert "read bandwidth  " in out and "read: 1.05 MB per launch" in out
    assert json.loads((tmp_path / "ceilings.json").read_text())["cuda|sm_90|Fake H200"]


# ---------------------------------------------------------------- the host measurement


def test_host_measurement_times_no_allocation_or_binding(monkeypatch):
    """The timed regions of the host FMA and launch measurements call only the packed entry
    points: no binding, allocation or argument packing happens while the clock runs."""
    from tcmlir.profile import host_ceilings as host
    from tcmlir.runtime.host import HostKernel

    clock = {"on": False, "bad": [], "ticks": 0}
    real_counter = host._clock

    def counter():
        clock["on"] = not clock["on"]
        clock["ticks"] += 1
        return real_counter()

    def watch(name, real):
        def wrapped(*a, **k):
            if clock["on"]:
                clock["bad"].append(name)
            return real(*a, **k)
        return wrapped

    monkeypatch.setattr(host, "_clock", counter)
    monkeypatch.setattr(HostKernel, "_buffers", watch("_buffers", HostKernel._buffers))
    monkeypatch.setattr(HostKernel, "run", watch("run", HostKernel.run))
    from tcmlir import binding

    for name in ("bind_host_inputs", "allocate_outputs"):
        monkeypatch.setattr(binding, name, watch(name, getattr(binding, name)))
    bandwidth, flops, launch = host.measure_host(copy_floats=1 << 16, chain_floats=1 << 12,
                                                 runs=2)
    assert clock["ticks"] == 3 * 2 * 2 and not clock["on"]   # 3 measurements, 2 runs each
    assert clock["bad"] == [] and bandwidth > 1e8 and flops > 1e7 and 0 < launch < 1e-2


# ---------------------------------------------------------------- the [launch] threshold

TMM = "def tmm(float(M,K) A, float(N,K) B) -> (C) { C(m,n) +=! A(m,k) * B(n,k) }"
ADD = "def add(float(N,M) A, float(N,M) B) -> (C) { C(i,j) = A(i,j) + B(i,j) }"


def _kernel(src, *inputs):
    # naive options compile fast; the rule reads only the times
    return tc.define(src).compile(*inputs, target="cuda", arch="sm_90",
                                  options=tc.MappingOptions.naive())


def _launch_advice(kernel, time_s, launch_s):
    n = len(kernel.runner.image.kernels)
    ceil = Ceilings(4.21e12, 6.0e13, launch_s, source="measured")
    p = build_profile(kernel, time_s=time_s, kernel_times=[time_s / n] * n, ceilings=ceil,
                      resources={})
    return [a for a in p.advice if a.startswith("[launch]")]


def test_launch_advice_fires_only_near_the_measured_launch_cost(fake_gpu):
    """tmm 128x1024x1024 took 39.5 us on the H200: with the launch cost measured as the time
    per back-to-back launch (here 2.5 us through the fake: 0.25 ms / 100) it is not
    launch-bound; a tiny kernel of 3 us is. (The old one-call measurement said 39.5 us.)"""
    _, runtime = fake_gpu
    launch_s = gpu.measure_gpu(runtime, copy_bytes=1 << 16, fma_iterations=1, launches=100,
                               runs=1).launch_s
    assert launch_s == pytest.approx(2.5e-6)
    rng = np.random.default_rng(0)
    tmm = _kernel(TMM, rng.random((32, 64), np.float32), rng.random((64, 64), np.float32))
    assert _launch_advice(tmm, 39.5e-6, launch_s) == []
    x = rng.random((8, 8), np.float32)
    tiny = _launch_advice(_kernel(ADD, x, x), 3e-6, launch_s)
    assert tiny and "about the launch cost (2.5 us)" in tiny[0]
    assert _launch_advice(tmm, 39.5e-6, 39.5e-6), "the old launch cost flagged tmm"


# ---------------------------------------------------------------- on the GPU


@pytest.mark.gpu
def test_gpu_measured_ceilings_are_near_the_device_peaks(capsys):
    m = gpu.measure_gpu()
    bandwidth, flops = gpu.theoretical_peaks(0)
    with capsys.disabled():
        print(f"\nceilings: copy {m.bandwidth / 1e12:.2f} TB/s (peak {bandwidth}), FMA "
              f"{m.flops / 1e12:.1f} TFLOP/s (peak {flops}), launch {m.launch_s * 1e6:.2f} us "
              f"({m.launch_path}), read {m.read_bandwidth / 1e12:.2f} TB/s")
    assert m.copy_bytes >= 1 << 30
    assert 0 < m.launch_s < 20e-6
    # reads alone outrun a copy's mix (H200: 4.2 TB/s against 3.84): a read-only kernel's ceiling
    assert m.read_bandwidth > 0.95 * m.bandwidth
    if bandwidth is None or flops is None:
        pytest.skip("the driver reports no memory clock / bus width / clock: no data-sheet "
                    "peak to compare with")
    assert 0.7 * bandwidth <= m.bandwidth <= bandwidth
    assert 0.7 * flops <= m.flops <= flops


@pytest.mark.gpu
def test_gpu_measurement_kernels_compute_right():
    """The copy kernel on random data with a remainder (main loop and tail), the FMA kernel's
    every thread against the float64 recurrence."""
    from tcmlir.runtime.cuda import get_runtime

    rt = get_runtime()
    module = rt.load_ptx(gpu.ceilings_ptx(rt.device(0).arch))
    n = 4 * 37 * 256 * 3 + 5  # vectors: three full trips of a 37-block grid and a tail
    host = np.random.default_rng(0).integers(0, 2**32, 4 * n, dtype=np.uint32)
    src, dst = rt.to_device(host), rt.alloc(host.nbytes)
    rt.launch(module.function(gpu.COPY_ENTRY), 37, 256, [dst, src, np.uint64(n)], sync=True)
    got = dst.copy_to_host(np.empty_like(host))
    np.testing.assert_array_equal(got, host)
    out = rt.alloc(64 * 128 * 4)
    a, b = np.float32(0.9999), np.float32(1e-4)
    rt.launch(module.function(gpu.FMA_ENTRY), 64, 128, [out, a, b, np.uint32(3)], sync=True)
    res = out.copy_to_host(np.empty(64 * 128, np.float32))
    want = gpu.fma_reference(np.arange(64 * 128), float(a), float(b), 3 * gpu.FMA_UNROLL)
    np.testing.assert_allclose(res, want, rtol=1e-4)
    values = np.random.default_rng(1).integers(0, 8, 4 * n).astype(np.float32)
    src, sums = rt.to_device(values), rt.alloc(37 * 256 * 4)
    rt.launch(module.function(gpu.READ_ENTRY), 37, 256, [sums, src, np.uint64(n)], sync=True)
    got = sums.copy_to_host(np.empty(37 * 256, np.float32))
    want = [values.reshape(n, 4)[t::37 * 256].sum() for t in range(37 * 256)]
    np.testing.assert_array_equal(got, want)


@pytest.mark.gpu
def test_gpu_ceilings_are_measured_once_and_cached(tmp_path, monkeypatch):
    monkeypatch.delenv("TCMLIR_CEILINGS", raising=False)
    monkeypatch.setenv("TCMLIR_CACHE_DIR", str(tmp_path))
    import time

    start = time.perf_counter()
    first = mod.ceilings_for("cuda")
    took = time.perf_counter() - start
    assert first.source == "measured" and took < 5.0
    assert mod.ceilings_for("cuda").source == "cache"
    stored = json.loads((tmp_path / "ceilings.json").read_text())
    assert all(e["version"] == mod.CEILINGS_VERSION for e in stored.values())
