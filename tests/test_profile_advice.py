"""The advice rules against what the H200 profile of the bench suite showed (issue 14).

Each rule is checked on a kernel that has its problem and on one that has not, the cuda
kernels compiled for sm_90 without a GPU and profiled with given times (`build_profile`):

* ``[promotion]`` no longer fires on a row kernel (layernorm's map-rows kernel read X once:
  its phases reuse the loaded row), and still fires on the naive matmul;
* ``[ceilings]`` compares a read-only kernel with the read ceiling (the row sum's 4.17 TB/s
  is not "above the ceilings" when reads alone reach 4.2);
* ``[occupancy]`` fires at the grouped convolution's 25% (78 registers x 512 threads), not
  at a register-tiled matmul's 25%;
* ``[registers]`` names the conv's ``I`` re-read for every ``f`` without register tiling;
* ``[shared]`` reads matmul's hot loop in the PTX: ld.shared bytes per FMA and the 2-way
  conflicts of its 128-bit B reads;
* ``[host]`` a call whose time exceeds its kernels' (tmm: 52 us for 27.4 us of kernels);
* ``[launch]`` names the split-K fold and the zero-initialisation kernels.
"""

from __future__ import annotations

import dataclasses
import re

import numpy as np
import pytest

import tcmlir as tc
from tcmlir.codegen.ptx_tools import find_ptxas
from tcmlir.profile import Ceilings, build_profile
from tcmlir.profile.advice import _occupancy
from tcmlir.profile.occupancy import KernelResources, theoretical_occupancy
from tcmlir.profile.ptx_shape import bank_conflicts, entry_bodies, inner_loop_shape
from tcmlir.profile.report import KernelProfile
from tcmlir.profile.structure import kernel_structures

needs_ptxas = pytest.mark.skipif(find_ptxas() is None, reason="ptxas not on PATH")
H200 = Ceilings(3.84e12, 5.1e13, 4.5e-6, device="NVIDIA H200", arch="sm_90", source="given",
                read_bandwidth=4.2e12)
MATMUL = "def mm(float(M,K) A, float(K,N) B) -> (C) { C(m,n) +=! A(m,k) * B(k,n) }"
TMM = "def tmm(float(M,K) A, float(N,K) B) -> (C) { C(m,n) +=! A(m,k) * B(n,k) }"
ADD = "def add(float(N,M) A, float(N,M) B) -> (C) { C(i,j) = A(i,j) + B(i,j) }"
ROWSUM = "def rowsum(float(N, D) X) -> (S) { S(n) +=! X(n, d) }"
COLSUM = "def colsum(float(N, D) X) -> (S) { S(d) +=! X(n, d) }"
LAYERNORM = """def layernorm(float(N, D) X) -> (O) {
  mean(n) +=! X(n, d) / D
  c(n, d) = X(n, d) - mean(n)
  var(n) +=! c(n, d) * c(n, d) / D
  O(n, d) = c(n, d) * rsqrt(var(n) + 1e-5)
}"""
GCONV = """def gconv(float(N,G,C,H,W) I, float(G,F,C,KH,KW) W1) -> (O) {
  O(n,g,f,h,w) +=! I(n,g,c,h+kh,w+kw) * W1(g,f,c,kh,kw)
}"""


def zeros(*shape):
    return np.zeros(shape, np.float32)


def compiled(src, *inputs, options=None):
    return tc.define(src).compile(*inputs, target="cuda", arch="sm_90", options=options)


def profile(kernel, time_s, kernel_times=None, lowered=None, **kw):
    """`build_profile` with given times; ``lowered``: `kernel_structures(kernel)`, made once."""
    n = len(kernel.runner.image.kernels)
    if lowered is not None:
        kw.update(structures=lowered[0], kernel_fn=lowered[1].fn)
    times = kernel_times if kernel_times is not None else [time_s / n] * n
    return build_profile(kernel, time_s=time_s, kernel_times=times,
                         ceilings=kw.pop("ceilings", H200), **kw)


@pytest.fixture(scope="module")
def tmm():
    """The bench's tmm 128x1024x1024: split-K, a contraction kernel and its fold."""
    k = compiled(TMM, zeros(128, 1024), zeros(1024, 1024))
    assert len(k.runner.image.kernels) == 2
    return k


def tagged(advice, tag):
    return [a for a in advice if a.startswith(f"[{tag}]")]


# ---------------------------------------------------------------- 1. row kernels read once


@needs_ptxas
def test_a_row_kernel_reads_its_row_once_so_no_promotion_advice():
    X = zeros(64, 4096)
    k = compiled(LAYERNORM, X)   # map-rows: one kernel, X read in 3 phases (4 reads inlined)
    (ks,), _ = kernel_structures(k)
    assert ks.rows and "X" in ks.same_thread_reads
    # the generated kernel really loads X once: 4096 / B threads per row = 4096 / B floats
    # per thread, in 128-bit loads, though the unrolled phases read each of them 4 times
    body = "\n".join(entry_bodies(k.ptx)[ks.name])
    assert len(re.findall(r"ld\.global\.nc\.v4", body)) == 4096 // ks.block[0] // 4
    assert len(re.findall(r"ld\.global", body)) == 4096 // ks.block[0] // 4
    p = profile(k, 1e-3)
    assert tagged(p.advice, "promotion") == []
    # the rule still fires where a kernel re-reads from global memory: the naive matmul
    bad = profile(compiled(MATMUL, zeros(64, 48), zeros(48, 40),
                           options=tc.MappingOptions.naive()), 1e-3)
    assert any(" B 64 times" in a for a in tagged(bad.advice, "promotion"))
    (naive,), _ = kernel_structures(compiled(MATMUL, zeros(64, 48), zeros(48, 40),
                                             options=tc.MappingOptions.naive()))
    assert not naive.rows and "B" not in naive.same_thread_reads


# ---------------------------------------------------------------- 2. the read ceiling


def test_bandwidth_of_a_read_write_mix():
    c = H200
    assert c.bandwidth_for(100, 0) == 4.2e12                 # read-only: the read ceiling
    assert c.bandwidth_for(50, 50) == c.bandwidth             # a copy's mix
    assert c.bandwidth_for(10, 90) == c.bandwidth             # mostly writes: the copy's
    quarter = 1 / (0.5 / 4.2e12 + 0.5 / 3.84e12)               # w = 1/4: halfway in time
    assert c.bandwidth_for(75, 25) == pytest.approx(quarter)
    assert Ceilings(3.84e12, 5e13).bandwidth_for(100, 0) == 3.84e12   # no read ceiling


@needs_ptxas
def test_a_read_only_kernel_is_compared_with_the_read_ceiling():
    X = zeros(4096, 1024)
    k = compiled(ROWSUM, X)
    nbytes = 4 * 4096 * 1024 + 4 * 4096
    t = nbytes / 4.17e12                      # what the H200 row sum reached
    p = profile(k, t)
    kp = p.kernels[0]
    assert kp.bandwidth_ceiling == pytest.approx(1 / ((1 - 2 / 1025) / 4.2e12
                                                      + (2 / 1025) / 3.84e12))
    assert 0.98 < kp.roofline_fraction <= 1 and tagged(p.advice, "ceilings") == []
    # against the copy's ceiling alone it reads as "measured low" (what the H200 profile said)
    old = profile(k, t, ceilings=Ceilings(3.84e12, 5.1e13, 4.5e-6, source="given"))
    assert any("1.09x" in a for a in tagged(old.advice, "ceilings"))
    # above the read ceiling by more than 5%: the ceilings are low indeed
    fast = profile(k, nbytes / 4.5e12)
    assert tagged(fast.advice, "ceilings")
    assert p.to_dict()["kernels"][0]["bandwidth_ceiling"] == kp.bandwidth_ceiling


# ---------------------------------------------------------------- 3. occupancy and registers


def _kp(**kw):
    base = dict(name="k", time_s=1e-3, flops=1, bytes=1, ops={}, statements=("S0",),
                bound="compute", roofline_fraction=0.3, grid=(64, 1, 1), block=(512, 1, 1))
    return KernelProfile(**{**base, **kw})


def test_occupancy_advice_at_the_grouped_convs_25_percent():
    occ = theoretical_occupancy(512, KernelResources(78, 2048), "sm_90")
    assert (occ.fraction, occ.limiter, occ.blocks_per_sm) == (0.25, "registers", 1)
    kp = _kp(registers=78, shared_bytes=2048, occupancy=occ.fraction,
             occupancy_limiter=occ.limiter, blocks_per_sm=occ.blocks_per_sm)
    (advice,) = _occupancy(kp)
    assert "25%" in advice and "78 registers per thread x 512 threads per block" in advice
    assert "holds 1 block(s)" in advice and "map_to_threads" in advice
    assert "register_tiling" in advice
    # a register-tiled kernel at 25% (matmul's 8x8 tile: 127 registers x 256 threads) is fine
    tiled = _kp(registers=127, occupancy=0.25, occupancy_limiter="registers", blocks_per_sm=2)
    assert _occupancy(tiled, register_tiled=True) == []
    assert _occupancy(_kp(registers=255, occupancy=0.125, occupancy_limiter="registers"),
                      register_tiled=True)
    assert _occupancy(_kp(registers=32, occupancy=1.0, occupancy_limiter="warps")) == []
    # near its roofline a low occupancy costs nothing (the H200's softmax: 19% at 98%)
    near = dataclasses.replace(kp, roofline_fraction=0.98)
    assert _occupancy(near) == [] and _occupancy(dataclasses.replace(kp, roofline_fraction=0.5))


@needs_ptxas
def test_grouped_conv_advice_names_occupancy_and_register_reuse():
    inputs = (zeros(2, 4, 16, 16, 16), zeros(4, 16, 16, 3, 3))
    # the convolution mapping before register tiles (what the H200 profiled)
    k = compiled(GCONV, *inputs, options=tc.MappingOptions.cuda_convolution(5, register=False))
    (ks,), _ = kernel_structures(k)
    assert ("S0", "I") in ks.thread_reuse and not ks.register_tiled
    assert ("S0", "W1") not in ks.thread_reuse   # W1 depends on f: no reuse within a thread
    # the driver's resources on the H200: 78 registers x 512 threads
    p = profile(k, 1e-3, resources={"gconv_k0": KernelResources(78, 2048, source="driver")})
    (occ,) = tagged(p.advice, "occupancy")
    assert "78 registers per thread x 512 threads" in occ
    (reg,) = tagged(p.advice, "registers")
    assert "elements of I (shared memory)" in reg and "register_tiling" in reg
    assert "private_memory(True)" in reg
    # the PTX's evidence: W1 loaded from shared memory for every FMA (LLVM hoisted I's window
    # out of the f loop) and the accumulator O read and written in global memory
    assert "4.00 bytes of shared memory per FMA" in reg
    assert "accumulators in global memory (1 ld.global and 2 st.global" in reg
    # where the hot loop shows neither cost, the code already keeps the values in registers
    from tcmlir.profile.advice import _registers
    from tcmlir.profile.counts import count_work
    from tcmlir.profile.ptx_shape import LoopShape

    work = count_work(k.function.ir, dict(k.sizes))
    cheap = LoopShape(fmas=64, shared_bytes=32, shared_loads=4, widest_load=16)
    assert _registers(k.function.ir, ks, work, cheap) == []
    assert _registers(k.function.ir, ks, work, None)   # no PTX loop: the schedule alone
    assert "[autotune]" not in {a.split("]")[0] + "]" for a in p.advice}
    # register tiling and private memory on: no register advice (the default convolution
    # mapping keeps 16 channels of outputs per thread in registers)
    conv = compiled(GCONV, *inputs)
    (cks,), _ = kernel_structures(conv)
    assert cks.register_tiled and tagged(profile(conv, 1e-3).advice, "registers") == []
    tiled = compiled(MATMUL, zeros(256, 256), zeros(256, 256))
    (tks, *_), _ = kernel_structures(tiled)
    assert tks.register_tiled and tagged(profile(tiled, 1e-3).advice, "registers") == []
    flat = compiled(ADD, zeros(64, 48), zeros(64, 48))
    assert tagged(profile(flat, 1e-3).advice, "registers") == []


# ---------------------------------------------------------------- 4. shared-memory bandwidth


def test_inner_loop_shape_and_bank_conflicts():
    ptx = """.visible .entry k0(
\t.param .u64 a
)
{
$L__BB0_1:
\tld.shared.v4.b32 \t{%r1, %r2, %r3, %r4}, [%rd1];
\tld.shared.f32 \t%r5, [%rd2];
\tfma.rn.f32 \t%r6, %r1, %r5, %r6;
\tfma.rn.f32 \t%r7, %r2, %r5, %r7;
\t@%p1 bra \t$L__BB0_1;
$L__BB0_2:
\tadd.s32 %r8, %r8, 1;
\t@%p2 bra \t$L__BB0_2;
\tret;
}
"""
    shape = inner_loop_shape(entry_bodies(ptx)["k0"])
    assert (shape.fmas, shape.shared_bytes, shape.shared_loads, shape.widest_load) == (2, 20, 2, 16)
    assert (shape.global_loads, shape.global_stores) == (0, 0)
    assert inner_loop_shape(["ret;"]) is None
    # a rotated loop (two overlapping back edges) is one region: its loads and stores count
    rotated = ["$L__BB0_7:", "st.global.b32 [%rd58], 0;", "$L__BB0_8:",
               "fma.rn.f32 %r1, %r2, %r3, %r1;", "st.global.b32 [%rd58], %r1;",
               "@%p7 bra $L__BB0_5;", "$L__BB0_5:", "@%p6 bra $L__BB0_7;",
               "ld.global.b32 %r1, [%rd58];", "bra.uni $L__BB0_8;", "ret;"]
    r = inner_loop_shape(rotated)
    assert (r.fmas, r.global_loads, r.global_stores) == (1, 1, 2)
    # 128-bit reads 32 bytes apart (matmul's B: 8 floats per thread): 2-way; 16 apart: none
    assert bank_conflicts(32, 16) == 2 and bank_conflicts(16, 16) == 1
    assert bank_conflicts(0, 16) == 1 and bank_conflicts(4, 4) == 1   # broadcast, consecutive
    assert bank_conflicts(128, 4) == 32 and bank_conflicts(8, 4) == 2


@needs_ptxas
def test_shared_memory_bound_matmul():
    fn = tc.define(MATMUL)
    # the defaults at 4096^3 (128x128 tiles, 8x8 register tiles) before B's columns were
    # interleaved (what the H200 measured at 57%), compiled small
    default = tc.MappingOptions.default_for(fn.ir, "cuda", {"M": 4096, "K": 4096, "N": 4096})
    assert default.register_interleave == (0, 4)
    opts = tc.MappingOptions.cuda_contraction((128, 128, 16), (8, 8))
    k = fn.compile(zeros(128, 128), zeros(128, 128), target="cuda", arch="sm_90", options=opts)
    lowered = kernel_structures(k)
    (ks,), _ = lowered
    shared = {a.tensor: a.stride for a in ks.strides if a.kind == "shared"}
    assert shared == {"A": 0, "B": 8}   # A broadcast along tx, B 8 floats per thread
    ideal = 2 * 128 ** 3 / H200.flops
    slow = profile(k, ideal / 0.57, lowered=lowered, resources={})   # the H200: 57%
    (advice,) = tagged(slow.advice, "shared")
    assert "static estimate" in advice and "64 bytes with ld.shared for 64 FMAs" in advice
    assert "2-way bank conflicted" in advice and "B: neighbouring threads read 32 bytes" in advice
    assert "register_tiling" in advice and "interleave_registers(0, 4)" in advice
    # interleaved register tiles: B's 16-byte vectors consecutive across threads, no conflict,
    # 1 B/FMA: what the shared pipe feeds, so no advice at the same 57%
    lace = fn.compile(zeros(128, 128), zeros(128, 128), target="cuda", arch="sm_90",
                      options=default)
    laced = kernel_structures(lace)
    assert {a.tensor: a.stride for a in laced[0][0].strides if a.kind == "shared"} == {
        "A": 0, "B": 4}
    assert tagged(profile(lace, ideal / 0.57, lowered=laced, resources={}).advice,
                  "shared") == []
    near = profile(k, ideal / 0.9, lowered=lowered, resources={})
    assert tagged(near.advice, "shared") == []   # near the roofline
    # a memory-bound kernel without FMAs gets none
    assert tagged(profile(compiled(ADD, zeros(64, 48), zeros(64, 48)), 1e-3).advice,
                  "shared") == []


# ---------------------------------------------------------------- 5. host-bound calls


@needs_ptxas
def test_host_bound_call(tmm):
    k = tmm
    lowered = kernel_structures(k)
    p = profile(k, 52e-6, [22.6e-6, 4.8e-6], host_s=31e-6, lowered=lowered, resources={})
    (advice,) = tagged(p.advice, "host")
    assert "52.0 us" in advice and "27.4 us" in advice and "24.6 us (47%)" in advice
    assert "torch.cuda.graph" in advice and "31.0 us per call" in advice
    assert p.host_s == 31e-6 and "host: 31 us per call" in str(p)
    assert tagged(profile(k, 28e-6, [22.6e-6, 4.8e-6], lowered=lowered, resources={}).advice,
                  "host") == []


# ---------------------------------------------------------------- 6. what a tiny kernel is


@needs_ptxas
def test_launch_advice_names_folds_and_initialisation_kernels(tmm):
    k = tmm
    p = profile(k, 52e-6, [22.6e-6, 4.8e-6])
    (fold,) = tagged(p.advice, "launch")
    assert fold.startswith("[launch] tmm_k1 takes 4.8 us") and "split-K fold" in fold
    assert "more work" not in fold
    col = compiled(COLSUM, zeros(256, 1024))
    assert [x.name for x in col.runner.image.kernels] == ["colsum_k0", "colsum_k1"]
    q = profile(col, 60e-6, [4.0e-6, 50e-6])
    (init,) = tagged(q.advice, "launch")
    assert init.startswith("[launch] colsum_k0") and "initialisation kernel" in init
    assert "S set to the reduction's identity" in init
    tiny = profile(compiled(ADD, zeros(8, 8), zeros(8, 8)), 3e-6)
    assert "more work" in tagged(tiny.advice, "launch")[0]


# ---------------------------------------------------------------- on the GPU (the bench suite)


def _gpu_profile(src, *shapes, options=None):
    rng = np.random.default_rng(0)
    inputs = [rng.standard_normal(s, dtype=np.float32) for s in shapes]
    return tc.define(src, target="cuda").profile(*inputs, options=options, runs=10)


@pytest.mark.gpu
def test_gpu_bench_row_kernels_get_no_false_advice():
    """layernorm / row sum at the bench's 32768x4096: no [promotion] (the row is read once)
    and no [ceilings] (read-only work against the measured read ceiling)."""
    ln = _gpu_profile(LAYERNORM, (32768, 4096))
    assert tagged(ln.advice, "promotion") == [] and tagged(ln.advice, "ceilings") == [], ln
    rs = _gpu_profile(ROWSUM, (32768, 4096))
    assert rs.ceilings.read_bandwidth > 0, "ceilings of version 3 measure the read ceiling"
    assert rs.kernels[0].bandwidth_ceiling == pytest.approx(rs.ceilings.read_bandwidth,
                                                            rel=0.01)
    assert tagged(rs.advice, "ceilings") == [], rs
    cs = _gpu_profile(COLSUM, (4096, 32768))
    assert tagged(cs.advice, "ceilings") == [], cs


@pytest.mark.gpu
def test_gpu_bench_tmm_is_host_bound_and_its_fold_is_named():
    p = _gpu_profile(TMM, (128, 1024), (1024, 1024))
    assert p.host_s > 0
    gap = p.time_s - sum(k.time_s for k in p.kernels)
    if gap > 0.25 * p.time_s and gap > 5e-6:
        assert tagged(p.advice, "host"), p
    for a in tagged(p.advice, "launch"):
        if a.startswith("[launch] tmm_k1"):
            assert "split-K fold" in a


@pytest.mark.gpu
def test_gpu_bench_matmul_and_conv_name_their_causes():
    """The mappings the H200 profiled before B's columns were interleaved and convolutions
    register-tiled (the defaults since): the advice names what changed."""
    mm = _gpu_profile(MATMUL, (4096, 4096), (4096, 4096),
                      options=tc.MappingOptions.cuda_contraction((128, 128, 16), (8, 8)))
    if mm.roofline_fraction < 0.8:
        assert tagged(mm.advice, "shared"), mm
    conv = _gpu_profile(GCONV, (32, 32, 16, 16, 16), (32, 16, 16, 3, 3),
                        options=tc.MappingOptions.cuda_convolution(5, register=False))
    assert tagged(conv.advice, "registers"), conv
    k = conv.kernels[0]
    if k.occupancy is not None and k.occupancy <= 0.25:
        assert tagged(conv.advice, "occupancy"), conv


def test_host_ceilings_advice_prints_host_rates_with_their_prefix():
    """A host's FMA ceiling (14 GFLOP/s, what the host's chain reached before FMA contraction)
    below a matmul's rate reads "14 GFLOP/s" in the [ceilings] advice, not "0.0 TFLOP/s"."""
    a = np.ones((256, 256), np.float32)
    k = tc.define(MATMUL, target="cpu").compile(a, a)
    t = 2 * 256**3 / 5e10
    p = build_profile(k, time_s=t, kernel_times=[t],
                      ceilings=Ceilings(1e10, 1.4e10, 3e-6, source="given"))
    advice = tagged(p.advice, "ceilings")
    assert advice and "the FMA ceiling 14 GFLOP/s" in advice[0] and "0.0 T" not in advice[0]
