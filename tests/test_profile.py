"""fn.profile / kernel.profile, the ceilings, occupancy, the advice rules and `tcmlir profile`.

The host profile runs for real here (ceilings injected through TCMLIR_CEILINGS, except in the
one test that measures them); cuda kernels are compiled for sm_90 without a GPU and profiled
with given times through `build_profile`, which is everything but the clock. The tests marked
``gpu`` time real launches on the device.
"""

from __future__ import annotations

import json
import math

import numpy as np
import pytest

import tcmlir as tc
from tcmlir.cli import main
from tcmlir.codegen.ptx_tools import find_ptxas
from tcmlir.errors import TCError
from tcmlir.profile import Ceilings, build_profile
from tcmlir.profile.occupancy import (
    KernelResources,
    parse_ptxas_verbose,
    theoretical_occupancy,
)
from tcmlir.profile.report import KernelProfile

MATMUL = "def mm(float(M,K) A, float(K,N) B) -> (C) { C(m,n) +=! A(m,k) * B(k,n) }"
SOFTMAX = """def softmax(float(N, D) X) -> (Y) {
  mx(n) max=! X(n, d)
  e(n, d) = exp(X(n, d) - mx(n))
  s(n) +=! e(n, d)
  Y(n, d) = e(n, d) / s(n)
}"""
TRANSPOSE = "def tr(float(N,M) A) -> (B) { B(j,i) = A(i,j) }"
ADD = "def add(float(N,M) A, float(N,M) B) -> (C) { C(i,j) = A(i,j) + B(i,j) }"
TOTAL = "def total(float(N) X) -> (S) { S +=! X(i) }"
H200 = Ceilings(4.21e12, 5.1e13, 4e-6, device="NVIDIA H200", arch="sm_90", source="given")
HOST = "bandwidth=2e10,flops=1e11,launch=1e-5"
needs_ptxas = pytest.mark.skipif(find_ptxas() is None, reason="ptxas not on PATH")
rng = np.random.default_rng(0)


def f32(*shape):
    return rng.random(shape, dtype=np.float32)


@pytest.fixture
def host_ceilings(monkeypatch):
    monkeypatch.setenv("TCMLIR_CEILINGS", HOST)


def cuda_profile(src, inputs, options=None, time_s=1e-4, ceilings=H200):
    kernel = tc.define(src).compile(*inputs, target="cuda", arch="sm_90", options=options)
    n = len(kernel.runner.image.kernels)
    return build_profile(kernel, time_s=time_s, kernel_times=[time_s / n] * n, ceilings=ceilings)


def tags(advice):
    return {a.split("]")[0] + "]" for a in advice}


# ---------------------------------------------------------------- the host profile


def test_function_profile_on_the_host(host_ceilings):
    fn = tc.define(MATMUL, target="cpu")
    A, B = f32(64, 48), f32(48, 40)
    p = fn.profile(A, B, runs=5)
    assert isinstance(p, tc.Profile)
    assert p.flops == 2 * 64 * 48 * 40 and p.bytes == 4 * (64 * 48 + 48 * 40 + 64 * 40)
    assert p.time_s > 0 and p.runs == 5
    assert p.achieved_flops == pytest.approx(p.flops / p.time_s)
    assert p.achieved_bandwidth == pytest.approx(p.bytes / p.time_s)
    assert p.bound == "compute"   # 8.1 FLOP/B against a ridge of 5
    assert 0 < p.roofline_fraction <= 1
    assert p.ceilings.source == "env" and p.ceilings.bandwidth == 2e10
    assert len(p.kernels) == 1 and isinstance(p.kernels[0], tc.KernelProfile)
    k = p.kernels[0]
    assert (k.flops, k.bytes) == (p.flops, p.bytes) and 0 < k.roofline_fraction <= 1
    assert k.time_s > 0 and k.grid is None and k.occupancy is None
    assert isinstance(p.advice, list) and all(isinstance(a, str) for a in p.advice)
    d = json.loads(json.dumps(p.to_dict()))
    assert d["flops"] == p.flops and d["kernels"][0]["name"] == k.name
    assert d["flops_formula"] and "M" in d["flops_formula"]
    assert d["transfer_bytes"] == 0
    text = str(p)
    assert "total" in text and k.name in text and "roofline" in text


def test_kernel_profile_and_several_host_groups(host_ceilings):
    fn = tc.define(SOFTMAX, target="cpu")
    X = f32(64, 50)
    kernel = fn.compile(X, options=tc.MappingOptions.naive())
    p = kernel.profile(X, runs=3)
    assert len(p.kernels) == len(kernel.runner.entries) > 1
    assert p.flops == 5 * 64 * 50 and p.bytes == 8 * 64 * 50
    # per group: the temporaries a later group reads are traffic of both
    assert sum(k.bytes for k in p.kernels) > p.bytes
    assert sum(k.flops for k in p.kernels) == p.flops
    assert all(0 < k.roofline_fraction <= 1 for k in p.kernels)


def test_profile_rejects_bad_runs(host_ceilings):
    fn = tc.define(ADD, target="cpu")
    with pytest.raises(TCError, match="runs"):
        fn.profile(f32(4, 4), f32(4, 4), runs=0)


def test_numpy_target_profiles_as_one_kernel(host_ceilings):
    p = tc.define(ADD, target="numpy").profile(f32(8, 8), f32(8, 8), runs=2)
    assert [k.name for k in p.kernels] == ["reference"] and p.flops == 64


# ---------------------------------------------------------------- ceilings


def test_ceilings_env_knob(monkeypatch):
    from tcmlir.config import get_config

    monkeypatch.setenv("TCMLIR_CEILINGS", "bandwidth=1e9,flops=2e9")
    assert get_config().ceilings == {"bandwidth": 1e9, "flops": 2e9}
    for bad in ("bandwidth=1e9", "speed=3", "bandwidth=x,flops=1", "bandwidth=-1,flops=1"):
        monkeypatch.setenv("TCMLIR_CEILINGS", bad)
        with pytest.raises(TCError, match="TCMLIR_CEILINGS"):
            get_config()


def test_given_ceilings_win(host_ceilings):
    fn = tc.define(ADD, target="cpu")
    p = fn.profile(f32(8, 8), f32(8, 8), runs=2, ceilings={"bandwidth": 1e9, "flops": 1e9})
    assert p.ceilings.source == "given" and p.ceilings.bandwidth == 1e9
    with pytest.raises(TCError, match="ceilings"):
        fn.profile(f32(8, 8), f32(8, 8), runs=2, ceilings={"speed": 1})


def test_host_ceilings_are_measured_once_and_cached(tmp_path, monkeypatch):
    from tcmlir.profile import ceilings as mod

    monkeypatch.delenv("TCMLIR_CEILINGS", raising=False)
    monkeypatch.setenv("TCMLIR_CACHE_DIR", str(tmp_path))
    before = mod.MEASURE_COUNTS["measure"]
    first = mod.ceilings_for("cpu")
    assert first.source == "measured" and mod.MEASURE_COUNTS["measure"] == before + 1
    assert first.bandwidth > 1e8 and first.flops > 1e8 and 0 < first.launch_s < 0.1
    assert first.arch and first.device
    stored = json.loads((tmp_path / "ceilings.json").read_text())
    assert [e["version"] for k, e in stored.items() if k.startswith("cpu|")] == [
        mod.CEILINGS_VERSION]
    second = mod.ceilings_for("cpu")
    assert second.source == "cache" and mod.MEASURE_COUNTS["measure"] == before + 1
    assert (second.bandwidth, second.flops) == (first.bandwidth, first.flops)


# ---------------------------------------------------------------- occupancy


def test_theoretical_occupancy_arithmetic():
    # 256 threads, 72 registers: 2304 per warp -> 28 warps of registers -> 3 blocks of 8 warps
    occ = theoretical_occupancy(256, KernelResources(72, 25600), "sm_90")
    assert (occ.blocks_per_sm, occ.limiter) == (3, "registers") and occ.fraction == 24 / 64
    occ = theoretical_occupancy(128, KernelResources(32, 100 * 1024), "sm_90")
    assert (occ.blocks_per_sm, occ.limiter) == (2, "shared memory")
    occ = theoretical_occupancy(1024, KernelResources(32, 0), "sm_90")
    assert (occ.fraction, occ.limiter) == (1.0, "warps")
    occ = theoretical_occupancy(32, KernelResources(16, 0), "sm_90")
    assert (occ.blocks_per_sm, occ.limiter, occ.fraction) == (32, "blocks", 0.5)


def test_parse_ptxas_verbose():
    text = """ptxas info    : 0 bytes gmem
ptxas info    : Compiling entry function 'mm_k0' for 'sm_90'
ptxas info    : Function properties for mm_k0
    8 bytes stack frame, 4 bytes spill stores, 4 bytes spill loads
ptxas info    : Used 80 registers, used 1 barriers, 14336 bytes smem
ptxas info    : Compiling entry function 'mm_k1' for 'sm_90'
ptxas info    : Used 12 registers
"""
    res = parse_ptxas_verbose(text)
    assert res["mm_k0"] == KernelResources(80, 14336, 4, 8)
    assert res["mm_k1"] == KernelResources(12, 0)


@needs_ptxas
def test_cuda_kernels_get_registers_and_occupancy_from_ptxas():
    p = cuda_profile(MATMUL, (f32(64, 48), f32(48, 40)), tc.MappingOptions.naive())
    k = p.kernels[0]
    assert k.resources_from == "ptxas" and k.registers > 0 and k.shared_bytes == 0
    assert k.grid == (2, 2, 1) and k.block == (32, 8, 1)   # 32x32 tiles over 64x40
    assert 0 < k.occupancy <= 1 and k.occupancy_limiter
    assert "2x2x1/32x8x1" in str(p)


# ---------------------------------------------------------------- advice rules


@needs_ptxas
def test_advice_coalescing():
    bad = cuda_profile(TRANSPOSE, (f32(64, 48),), tc.MappingOptions.naive())
    assert any(a.startswith("[coalescing]") and " A " in a and "48 elements" in a
               for a in bad.advice)
    good = cuda_profile(ADD, (f32(64, 48), f32(64, 48)), tc.MappingOptions.naive())
    assert "[coalescing]" not in tags(good.advice)


@needs_ptxas
def test_advice_promotion():
    A, B = f32(64, 48), f32(48, 40)
    bad = cuda_profile(MATMUL, (A, B), tc.MappingOptions.naive())
    promo = [a for a in bad.advice if a.startswith("[promotion]")]
    assert any(" A 40 times" in a for a in promo) and any(" B 64 times" in a for a in promo)
    shared = cuda_profile(MATMUL, (A, B), tc.MappingOptions.naive().shared_memory(True))
    assert "[promotion]" not in tags(shared.advice)
    flat = cuda_profile(ADD, (f32(64, 48), f32(64, 48)), tc.MappingOptions.naive())
    assert "[promotion]" not in tags(flat.advice)
    # a per-row value re-read along its row (softmax's max) is reuse the caches serve
    rows = cuda_profile(SOFTMAX, (f32(128, 96),), tc.MappingOptions.naive())
    assert "[promotion]" not in tags(rows.advice)


def test_thread_strides_of_row_and_parametric_kernels():
    from tcmlir.profile.host_ceilings import _COPY
    from tcmlir.profile.structure import kernel_structures

    X = f32(64, 100)
    sm = tc.define(SOFTMAX)
    row = sm.compile(X, target="cuda", arch="sm_90",   # map-rows, 512 threads per row
                     options=tc.MappingOptions.default_for(sm.ir, "cuda"))
    (ks,), _ = kernel_structures(row)
    assert ks.thread_mapped and ks.reduction_threads > 32
    assert {a.tensor: a.stride for a in ks.strides if a.kind == "read"}["X"] == 1
    copy = tc.define(_COPY)
    opts = tc.MappingOptions.default_for(copy.ir, "cuda").with_parametric()
    (ks,), _ = kernel_structures(copy.compile(f32(1000), target="cuda", arch="sm_90",
                                              options=opts))
    assert {(a.tensor, a.stride) for a in ks.strides} == {("X", 1), ("Y", 1)}
    tr = tc.define(TRANSPOSE).compile(X, target="cuda", arch="sm_90",
                                      options=tc.MappingOptions.naive())
    (ks,), _ = kernel_structures(tr)
    assert {(a.tensor, a.stride) for a in ks.strides} == {("A", 100), ("B", 1)}


@needs_ptxas
def test_advice_reduction_on_few_threads():
    x = f32(4096)
    bad = cuda_profile(TOTAL, (x,), tc.MappingOptions.naive())
    assert any(a.startswith("[reduction]") and "32 thread" in a for a in bad.advice)
    good = cuda_profile(TOTAL, (x,))   # the defaults spread it over the grid
    assert "[reduction]" not in tags(good.advice)


@needs_ptxas
def test_advice_fusion_of_a_row_program():
    X = f32(128, 96)
    bad = cuda_profile(SOFTMAX, (X,), tc.MappingOptions.naive())
    assert len(bad.kernels) > 1 and "[fusion]" in tags(bad.advice)
    good = cuda_profile(SOFTMAX, (X,))   # map-rows: one kernel
    assert len(good.kernels) == 1 and "[fusion]" not in tags(good.advice)


def _kp(**kw):
    base = dict(name="k", time_s=1e-3, flops=1, bytes=1, ops={}, statements=("S0",),
                bound="memory", roofline_fraction=0.9, grid=(1, 1, 1), block=(256, 1, 1))
    return KernelProfile(**{**base, **kw})


def test_advice_occupancy():
    from tcmlir.profile.advice import _occupancy

    low = _kp(registers=255, shared_bytes=0, occupancy=1 / 8, occupancy_limiter="registers",
              roofline_fraction=0.4)
    assert _occupancy(low) and "255 registers" in _occupancy(low)[0]
    assert _occupancy(_kp(registers=255, occupancy=1 / 8, occupancy_limiter="registers")) == []
    smem = _kp(registers=32, shared_bytes=120000, occupancy=1 / 8,
               occupancy_limiter="shared memory", roofline_fraction=0.4)
    assert "120000 bytes of shared memory" in _occupancy(smem)[0]
    assert _occupancy(_kp(registers=32, occupancy=0.75, occupancy_limiter="warps")) == []
    assert _occupancy(_kp()) == []   # unknown resources: no claim


@needs_ptxas
def test_advice_launch_bound_and_autotune():
    args = (f32(64, 48), f32(64, 48))
    fast = cuda_profile(ADD, args, tc.MappingOptions.naive(), time_s=3e-6)
    assert "[launch]" in tags(fast.advice)
    slow = cuda_profile(ADD, args, tc.MappingOptions.naive(), time_s=1e-3)
    assert "[launch]" not in tags(slow.advice)
    # 1 ms for 36 kB: far from the roofline with nothing else to blame
    assert tags(slow.advice) == {"[autotune]"} and slow.roofline_fraction < 0.5
    ideal = 3 * 4 * 64 * 48 / H200.bandwidth
    near = cuda_profile(ADD, args, tc.MappingOptions.naive(), time_s=ideal / 0.8,
                        ceilings=Ceilings(H200.bandwidth, H200.flops, 0.0))
    assert near.roofline_fraction == pytest.approx(0.8) and near.advice == []


@needs_ptxas
def test_advice_when_the_ceilings_are_low():
    args = (f32(64, 48), f32(64, 48))
    ideal = 3 * 4 * 64 * 48 / H200.bandwidth
    p = cuda_profile(ADD, args, tc.MappingOptions.naive(), time_s=ideal / 2,
                     ceilings=Ceilings(H200.bandwidth, H200.flops, 0.0))
    assert p.roofline_fraction == 1.0 and "[ceilings]" in tags(p.advice)


# ---------------------------------------------------------------- the command line


@pytest.fixture
def softmax_file(tmp_path):
    path = tmp_path / "softmax.tc"
    path.write_text(SOFTMAX)
    return path


def test_cli_profile_json(softmax_file, host_ceilings, capsys):
    rc = main(["profile", str(softmax_file), "--sizes", "N=32,D=40", "--target", "cpu",
               "--runs", "3", "--json"])
    assert rc == 0
    d = json.loads(capsys.readouterr().out)
    assert d["flops"] == 5 * 32 * 40 and d["bytes"] == 8 * 32 * 40
    assert d["bound"] == "memory" and 0 < d["roofline_fraction"] <= 1 and d["kernels"]


def test_cli_profile_table_with_options(softmax_file, host_ceilings, capsys):
    rc = main(["profile", str(softmax_file), "--sizes", "N=32,D=40", "--target", "cpu",
               "--runs", "2", "--options", "naive"])
    out = capsys.readouterr().out
    assert rc == 0 and "profile of softmax" in out and "total" in out
    assert "softmax_0" in out and "softmax_1" in out   # naive options: several groups
    rc = main(["profile", str(softmax_file), "--sizes", "N=4,D=4", "--target", "cpu",
               "--options", "{not json"])
    assert rc == 2 and "--options" in capsys.readouterr().err


def test_cli_profile_plot(softmax_file, host_ceilings, tmp_path, capsys):
    pytest.importorskip("matplotlib")
    png = tmp_path / "roofline.png"
    rc = main(["profile", str(softmax_file), "--sizes", "N=32,D=40", "--target", "cpu",
               "--runs", "2", "--options", "naive", "--plot", str(png)])
    assert rc == 0 and png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert png.stat().st_size > 10_000 and "roofline written" in capsys.readouterr().out


def test_cli_ncu_needs_cuda(softmax_file, host_ceilings, capsys):
    rc = main(["profile", str(softmax_file), "--sizes", "N=4,D=4", "--target", "cpu",
               "--runs", "1", "--ncu"])
    assert rc == 2 and "--ncu" in capsys.readouterr().err


def test_parse_ncu_csv():
    from tcmlir.profile.ncu import parse_ncu_csv

    text = '''==PROF== Connected to process 1
"ID","Process ID","Process Name","Host Name","Kernel Name","Context","Stream","Block Size","Grid Size","Device","CC","Section Name","Metric Name","Metric Unit","Metric Value"
"0","1","python","h","mm_k0","1","7","(32, 8, 1)","(2, 8, 1)","0","9.0","Command line profiler metrics","dram__bytes_read.sum","Mbyte","1.50"
"0","1","python","h","mm_k0","1","7","(32, 8, 1)","(2, 8, 1)","0","9.0","Command line profiler metrics","dram__bytes_write.sum","Kbyte","512"
"0","1","python","h","mm_k0","1","7","(32, 8, 1)","(2, 8, 1)","0","9.0","Command line profiler metrics","sm__warps_active.avg.pct_of_peak_sustained_active","%","41.5"
'''
    got = parse_ncu_csv(text)["mm_k0"]
    assert got["dram_bytes"] == pytest.approx(1.5e6 + 512e3)
    assert got["achieved_occupancy"] == pytest.approx(0.415)


# ---------------------------------------------------------------- on the GPU


@pytest.mark.gpu
def test_gpu_profile_of_a_matmul(tmp_path, monkeypatch):
    monkeypatch.setenv("TCMLIR_CACHE_DIR", str(tmp_path))
    fn = tc.define(MATMUL, target="cuda")
    M = K = N = 1024
    p = fn.profile(f32(M, K), f32(K, N), runs=10)
    assert p.target == "cuda" and p.flops == 2 * M * N * K
    assert p.bytes == 4 * (M * K + K * N + M * N)
    assert p.ceilings.source == "measured" and p.ceilings.arch.startswith("sm_")
    assert 1e12 < p.ceilings.bandwidth < 1e13 and 5e12 < p.ceilings.flops < 2e14
    assert 0 < p.ceilings.launch_s < 1e-3
    assert 0 < p.roofline_fraction <= 1 and p.bound == "compute"
    # the ceilings are the device's, not our code's: no rate above them (issue 14)
    assert p.raw_fraction < 1 and "[ceilings]" not in tags(p.advice)
    k = p.kernels[0]
    assert k.resources_from == "driver" and k.registers > 0 and 0 < k.occupancy <= 1
    assert 0 < k.time_s <= p.time_s * 1.5
    again = fn.profile(f32(M, K), f32(K, N), runs=3)
    assert again.ceilings.source == "cache"


@pytest.mark.gpu
def test_gpu_profile_of_several_kernels_and_advice(monkeypatch):
    monkeypatch.setenv("TCMLIR_CEILINGS", "bandwidth=4.21e12,flops=5.1e13,launch=4e-6")
    fn = tc.define(SOFTMAX, target="cuda")
    X = f32(4096, 1024)
    naive = fn.profile(X, options=tc.MappingOptions.naive(), runs=10)
    assert len(naive.kernels) > 1 and "[fusion]" in tags(naive.advice)
    assert sum(k.time_s for k in naive.kernels) == pytest.approx(naive.time_s, rel=0.5)
    rows = fn.profile(X, runs=10)
    assert len(rows.kernels) == 1 and rows.roofline_fraction > naive.roofline_fraction
    assert math.isfinite(rows.achieved_bandwidth) and rows.bound == "memory"


@pytest.mark.gpu
def test_gpu_cli_ncu(softmax_file, capsys, monkeypatch):
    import shutil

    if shutil.which("ncu") is None:
        pytest.skip("ncu not on PATH")
    monkeypatch.setenv("TCMLIR_CEILINGS", "bandwidth=4.21e12,flops=5.1e13,launch=4e-6")
    rc = main(["profile", str(softmax_file), "--sizes", "N=1024,D=1024", "--target", "cuda",
               "--runs", "3", "--ncu", "--json"])
    d = json.loads(capsys.readouterr().out)
    assert rc == 0 and d["kernels"][0]["ncu"]["dram_bytes"] > 0.5 * d["bytes"]


# ---------------------------------------------------------------- the cuda clock over a fake driver


def test_cuda_profile_over_the_fake_driver(monkeypatch):
    """The cuda timing path (the whole sequence, then each kernel alone with the plan's packed
    parameters) and the driver's resource attributes, on `fake_cuda` (events read 0.25 ms)."""
    from fake_cuda import FakeFunction, install_fake, simulate_with_host

    import tcmlir.cache.artifacts as artifacts
    from tcmlir.runtime.cuda_launch import CudaRunner

    driver, runtime = install_fake(monkeypatch)
    monkeypatch.setattr(artifacts, "make_cuda_runner",
                        lambda image, key, device=0: CudaRunner(image, device, runtime=runtime))
    monkeypatch.setattr(FakeFunction, "num_registers", 40, raising=False)
    monkeypatch.setattr(FakeFunction, "local_bytes", 0, raising=False)
    X = f32(64, 40)
    fn = tc.define(SOFTMAX, target="cuda")
    kernel = fn.compile(X, options=tc.MappingOptions.naive())
    simulate_with_host(driver, kernel.runner.image,
                       tc.define(SOFTMAX, target="cpu").compile(X, options=tc.MappingOptions.naive()))
    n = len(kernel.runner.image.kernels)
    p = kernel.profile(X, runs=4, ceilings=H200)
    # an event pair reads 0.25 ms, so a sample queues 4 calls (1 ms / 0.25 ms): 62.5 us each
    assert p.time_s == pytest.approx(0.25e-3 / 4) and len(p.kernels) == n > 1
    # each kernel timed between two events inside the sequence: one event pair, 0.25 ms
    assert all(k.time_s == pytest.approx(0.25e-3) for k in p.kernels)
    launches = [c for c in driver.calls if c[0] == "cuLaunchKernel"]
    # the whole sequence: a warm-up, then 4 samples of an untimed lead call and 4 timed calls;
    # one more call (its temporaries for the later kernels); then 4 timed runs of the sequence,
    # an event before each kernel; then 4 calls timed on the host's clock, each after the
    # device is idle (`host_s`)
    assert len(launches) == (1 + 4 * (1 + 4)) * n + n + 4 * n + 4 * n
    timed = launches[-8 * n:-4 * n]
    assert [c[1] for c in timed] == [k.name for _ in range(4) for k in kernel.runner.image.kernels]
    assert all(k.resources_from == "driver" and k.registers == 40 for k in p.kernels)
    assert [k.grid for k in p.kernels] == [k.grid for k in kernel.runner.image.kernels]
    assert p.flops == 5 * 64 * 40 and "[fusion]" in tags(p.advice)
    assert 0 < p.host_s < 1 and "per call in the launch path" in str(p)


@needs_ptxas
def test_merge_ncu_with_a_stand_in_ncu(tmp_path, monkeypatch):
    """merge_ncu runs `ncu --csv ... python -m tcmlir run ...` and merges per kernel name; a
    stand-in ncu on the PATH checks the command line and prints Nsight Compute's CSV."""
    import argparse
    import os

    from tcmlir.profile.ncu import merge_ncu

    p = cuda_profile(MATMUL, (f32(64, 48), f32(48, 40)), tc.MappingOptions.naive())
    script = tmp_path / "ncu"
    script.write_text(
        "#!/bin/sh\n"
        'case "$*" in *"-m tcmlir run"*"--target cuda"*"--sizes M=64"*) ;; *) exit 3;; esac\n'
        "echo '==PROF== Disconnected'\n"
        "echo '\"ID\",\"Kernel Name\",\"Metric Name\",\"Metric Unit\",\"Metric Value\"'\n"
        "echo '\"0\",\"mm_k0\",\"dram__bytes_read.sum\",\"Kbyte\",\"20.5\"'\n"
        "echo '\"0\",\"mm_k0\",\"dram__bytes_write.sum\",\"byte\",\"10240\"'\n"
        "echo '\"0\",\"mm_k0\",\"sm__warps_active.avg.pct_of_peak_sustained_active\",\"%\",\"80\"'\n")
    script.chmod(0o755)
    monkeypatch.setenv("PATH", f"{tmp_path}{os.pathsep}{os.environ['PATH']}")
    args = argparse.Namespace(file="mm.tc", name=None, sizes="M=64,K=48,N=40", seed=0,
                              options=None)
    merge_ncu(p, args)
    assert p.kernels[0].ncu == pytest.approx({"dram_bytes_read": 20500.0,
                                              "dram_bytes_written": 10240.0,
                                              "achieved_occupancy": 0.8, "dram_bytes": 30740.0})
    assert "ncu mm_k0: DRAM 30.7 kB" in str(p) and "achieved occupancy 80%" in str(p)


def test_per_kernel_events_through_ctypes_queue_event_launch_pairs():
    """Where libcuda is reachable through ctypes the per-kernel timing queues its events and
    launches there (a tiny kernel then reads about the launch cost, not cuda-python's
    overhead); the order is an event before each kernel and one after the last."""
    import types

    from tcmlir.errors import CudaError
    from tcmlir.profile.profiler import _queue_direct

    calls = []
    fast = types.SimpleNamespace(
        event_record=lambda e, s: calls.append(("record", e, s)) or 0,
        launch=lambda f, *rest: calls.append(("launch", f, rest[:6], rest[8])) or 0,
        pointer=lambda v: v)  # (the real one wraps handles and addresses in c_void_p)
    plan = types.SimpleNamespace(_kernels=[(11, 2, 1, 1, 32, 1, 1), (12, 4, 1, 1, 64, 1, 1)],
                                 _launch_info=[("k0", 0, 0), ("k1", 0, 0)],
                                 block=types.SimpleNamespace(kernel_addresses=(0xAB, 0xCD)))
    events = [types.SimpleNamespace(handle=100 + i) for i in range(3)]
    _queue_direct(fast, plan, events)
    # each kernel with its own parameters (`ParamBlock.kernel_addresses`)
    assert calls == [("record", 100, None), ("launch", 11, (2, 1, 1, 32, 1, 1), 0xAB),
                     ("record", 101, None), ("launch", 12, (4, 1, 1, 64, 1, 1), 0xCD),
                     ("record", 102, None)]
    fast.launch = lambda *a: 700
    with pytest.raises(CudaError, match="profiling kernel k0"):
        _queue_direct(fast, plan, events)
