"""Tensor cores at any size and stride, and index groups planned as one dimension: which plans
(copy widths, groups, refusals), PTX for awkward shapes (ptxas-checked), and (GPU) results
against the reference interpreter."""

from __future__ import annotations

import re
import shutil

import numpy as np
import pytest
from conftest import ptxas_verbose

import tcmlir as tc
from tcmlir.poly.contraction import ContractionPlan, contraction_plan

needs_ptxas = pytest.mark.skipif(shutil.which("ptxas") is None, reason="ptxas not installed")

LAYOUTS = {
    "nn": "def f(float16(M, K) A, float16(K, N) B) -> (C) { C(m, n) +=! A(m, k) * B(k, n) }",
    "nt": "def f(float16(M, K) A, float16(N, K) B) -> (C) { C(m, n) +=! A(m, k) * B(n, k) }",
    "tn": "def f(float16(K, M) A, float16(K, N) B) -> (C) { C(m, n) +=! A(k, m) * B(k, n) }",
    "tt": "def f(float16(K, M) A, float16(N, K) B) -> (C) { C(m, n) +=! A(k, m) * B(n, k) }",
    "bf16-f32out": "def f(bfloat16(M, K) A, bfloat16(K, N) B) -> (float(M, N) C) "
                   "{ C(m, n) +=! A(m, k) * B(k, n) }",
    "batched": "def f(float16(Bt, N, K) X, float16(Bt, M, K) Y) -> (Z) "
               "{ Z(b, n, m) +=! X(b, n, k) * Y(b, m, k) }",
}
# several indices that are one dimension of every tensor that carries them
GROUPS = {
    "rows": ("def f(float16(M, N0, N1, R) X, float16(D, R) W) -> (XW) "
             "{ XW(m, n0, n1, d) +=! X(m, n0, n1, r) * W(d, r) }"),
    "two-k": ("def f(float16(M, K0, K1) A, float16(K0, K1, N) B) -> (C) "
              "{ C(m, n) +=! A(m, k0, k1) * B(k0, k1, n) }"),
    "cols-t": ("def f(float16(K, M) A, float16(K, N0, N1) B) -> (C) "
               "{ C(m, n0, n1) +=! A(k, m) * B(k, n0, n1) }"),
}
AWKWARD = (1, 7, 15, 17, 33, 100)
# every awkward size in each of M, N, K, the other two awkward as well
SHAPES = sorted({(s, 17, 33) for s in AWKWARD} | {(33, s, 17) for s in AWKWARD}
                | {(17, 33, s) for s in AWKWARD} | {(100, 100, 100), (1, 1, 1)})


def _define(src):
    return tc.define(src, target="cuda")


def _sizes(fn, m, n, k, batch=3):
    values = {"M": m, "N": n, "K": k, "Bt": batch, "D": n, "N0": 3, "N1": n, "K0": 2, "K1": k,
              "R": k}
    return {s: values[s] for s in fn.ir.sizes}


def _inputs(fn, sizes, rng):
    arrays = []
    for t in fn.ir.inputs:
        shape = tuple(s.evaluate(sizes) for s in t.shape)
        x = rng.integers(-3, 4, shape).astype(np.float32)  # exact in half precision
        if t.dtype.name == "FLOAT16":
            arrays.append(x.astype(np.float16))
        else:
            arrays.append(x.astype(pytest.importorskip("ml_dtypes").bfloat16))
    return arrays


def _plan(src, sizes) -> ContractionPlan:
    fn = _define(src)
    plan = contraction_plan(fn.ir, sizes)
    assert not isinstance(plan, str), plan
    return plan


# ---------------------------------------------------------------- plans


@pytest.mark.parametrize("layout, sizes, widths", [
    ("nn", {"M": 64, "N": 64, "K": 64}, (8, 8)),
    ("nn", {"M": 64, "N": 64, "K": 30}, (2, 8)),    # A's rows 60 bytes apart: 4-byte copies
    ("nn", {"M": 64, "N": 36, "K": 20}, (4, 4)),    # 40 and 72 bytes apart: 8-byte copies
    ("nn", {"M": 7, "N": 15, "K": 17}, (1, 1)),     # odd strides: element loads
    ("tt", {"M": 33, "N": 100, "K": 17}, (1, 1)),
    ("tt", {"M": 40, "N": 100, "K": 64}, (8, 8)),   # (K is contiguous in B: M decides A's)
])
def test_copy_widths_follow_the_strides(layout, sizes, widths):
    plan = _plan(LAYOUTS[layout], sizes)
    assert (plan.a.copy, plan.b.copy) == widths
    opts = tc.MappingOptions.default_for(_define(LAYOUTS[layout]), "cuda", sizes)
    assert opts.mma_tile, "every size runs on tensor cores by default"


def test_an_operand_without_a_contiguous_dimension_is_loaded_by_elements():
    src = ("def f(float16(K, M, Bt) A, float16(K, N, Bt) B) -> (C) "
           "{ C(b, m, n) +=! A(k, m, b) * B(k, n, b) }")
    plan = _plan(src, {"K": 16, "M": 16, "N": 16, "Bt": 2})
    assert plan.batch == ("b",)
    assert (plan.a.copy, plan.b.copy) == (1, 1)
    assert not plan.a.k_major  # stored along the smaller stride (m: 2, k: 32)


def test_row_indices_contiguous_together_are_one_dimension():
    plan = _plan(GROUPS["rows"], {"M": 3, "N0": 5, "N1": 7, "R": 30, "D": 33})
    assert plan.members(plan.m) == ("m", "n0", "n1") and plan.batch == ()
    assert plan.extent(plan.m) == 3 * 5 * 7 and plan.index_extent(plan.m) == 7
    assert plan.a.stride(plan.m) == 30 and plan.out_stride(plan.m) == 33


def test_column_indices_contiguous_together_are_one_dimension():
    plan = _plan(GROUPS["cols-t"], {"K": 20, "M": 9, "N0": 3, "N1": 5})
    assert plan.members(plan.n) == ("n0", "n1") and plan.extent(plan.n) == 15
    assert not plan.b.k_major and plan.b.stride(plan.k) == 15 and plan.b.copy == 1


def test_reduction_indices_contiguous_together_are_one_dimension():
    plan = _plan(GROUPS["two-k"], {"M": 64, "N": 64, "K0": 4, "K1": 16})
    assert plan.members(plan.k) == ("k0", "k1") and plan.extent(plan.k) == 64
    assert plan.a.k_major and plan.a.stride(plan.k) == 1 and plan.b.stride(plan.k) == 64


def test_row_indices_apart_in_memory_are_addressed_index_by_index():
    # m0 and m1 are both A's own, but A stores them the other way round: one row dimension of
    # 32 rows (not a batch of 4 tiles of 8), A's rows found run by run, its k still in 16-byte
    # copies
    src = ("def f(float16(M1, M0, K) A, float16(N, K) B) -> (C) "
           "{ C(m0, m1, n) +=! A(m1, m0, k) * B(n, k) }")
    plan = _plan(src, {"M0": 4, "M1": 8, "N": 16, "K": 16})
    assert plan.m == "m1" and plan.members(plan.m) == ("m0", "m1") and plan.batch == ()
    assert plan.a.row_scattered and not plan.b.row_scattered
    assert plan.a.k_major and plan.a.copy == 8
    assert [(s.below, s.extent, s.stride) for s in plan.segments(plan.m, plan.a.strides)] == [
        (1, 8, 64), (8, 4, 16)]


SCATTERED = {  # reduction indices that are one dimension of one operand only, or of neither
    "k-swapped": "def f(float16(M, K0, K1) A, float16(K1, K0, N) B) -> (C) "
                 "{ C(m, n) +=! A(m, k0, k1) * B(k1, k0, n) }",
    "k-apart": "def f(float16(M, K0, K1) A, float16(K0, N, K1) B) -> (C) "
               "{ C(m, n) +=! A(m, k0, k1) * B(k0, n, k1) }",
    "k-neither": "def f(float16(K1, M, K0) A, float16(K0, N, K1) B) -> (C) "
                 "{ C(m, n) +=! A(k1, m, k0) * B(k0, n, k1) }",
}


@pytest.mark.parametrize("name, scattered, widths", [
    ("k-swapped", (False, True), (8, 8)),   # B: its rows (n) contiguous: 16-byte copies
    ("k-apart", (False, True), (8, 8)),     # B: k0 apart, but runs of 8 k1 contiguous
    ("k-neither", (True, True), (4, 1)),    # A: runs of 4 k0 (8 bytes); B: k0 innermost, apart
])
def test_reduction_indices_apart_in_memory_are_addressed_index_by_index(name, scattered, widths):
    plan = _plan(SCATTERED[name], {"M": 16, "N": 16, "K0": 4, "K1": 8})
    assert len(plan.members(plan.k)) == 2
    assert (plan.a.k_scattered, plan.b.k_scattered) == scattered
    assert (plan.a.copy, plan.b.copy) == widths


def test_what_stays_refused():
    cases = {
        "def f(float16(M, K) A, float16(K, N, R) B) -> (C) { C(m, n) +=! A(m, k) * B(k, n, r) }":
            "does not read the reduction index",
        "def f(float16(M, K) A, float16(K, N) B, int32(K) P) -> (C) "
        "{ C(m, n) +=! A(m, P(k)) * B(k, n) }": "not read at affine indices",
        "def f(float16(M, KK) A, float16(K, N) B) -> (C) "
        "{ C(m, n) +=! A(m, k * m) * B(k, n) where k in 0:K }": "not read at affine indices",
        # depthwise: the filter has no output index of its own (per channel, a vector)
        "def dw(float16(N, C, H, W) I, float16(C, KH, KW) Wt) -> (O) "
        "{ O(n, c, h, w) +=! I(n, c, h + kh, w + kw) * Wt(c, kh, kw) }": "matrix-vector",
    }
    for src, why in cases.items():
        fn = _define(src)
        plan = contraction_plan(fn.ir, {s: 8 for s in fn.ir.sizes})
        assert isinstance(plan, str) and why in plan, plan


# ---------------------------------------------------------------- PTX


def _compile(src, sizes, rng, options=None):
    fn = _define(src)
    return fn.compile(*_inputs(fn, sizes, rng), target="cuda", arch="sm_90", options=options)


MMA_SYNC = tc.MappingOptions.naive().tensor_cores((64, 64, 32), (2, 2), 3)
WGMMA = tc.MappingOptions.naive().tensor_cores((128, 128, 64), (8, 1), 3, wgmma=True)


@needs_ptxas
@pytest.mark.parametrize("layout", list(LAYOUTS))
@pytest.mark.parametrize("shape", [(7, 15, 17), (100, 33, 30), (1, 1, 1), (33, 100, 36)])
@pytest.mark.parametrize("options", [MMA_SYNC, WGMMA], ids=["mma.sync", "wgmma"])
def test_awkward_shapes_assemble(layout, shape, options, tmp_path, rng):
    fn = _define(LAYOUTS[layout])
    kernel = _compile(LAYOUTS[layout], _sizes(fn, *shape), rng, options)
    assert "mma S0" in kernel.schedule
    arch = "sm_90a" if options is WGMMA else "sm_90"
    info = ptxas_verbose(tmp_path, kernel.ptx, layout, arch=arch)
    assert " 0 bytes spill stores" in info
    assert ".extern .func" not in kernel.ptx


@needs_ptxas
def test_narrow_copies_and_element_loads_in_ptx(tmp_path, rng):
    src = LAYOUTS["nn"]
    four = _compile(src, {"M": 64, "N": 64, "K": 30}, rng, MMA_SYNC).ptx   # A: 4-byte copies
    assert re.search(r"cp\.async\.ca\.shared\.global \[[^]]+\], \[[^]]+\], 4, %r", four)
    assert re.search(r"cp\.async\.cg\.shared\.global \[[^]]+\], \[[^]]+\], 16", four)  # B
    eight = _compile(src, {"M": 64, "N": 36, "K": 20}, rng, MMA_SYNC).ptx
    assert re.search(r"cp\.async\.ca\.shared\.global \[[^]]+\], \[[^]]+\], 8, %r", eight)
    odd = _compile(src, {"M": 7, "N": 15, "K": 17}, rng, MMA_SYNC).ptx
    assert "ld.global.nc.b16" in odd and "cp.async.ca.shared" not in odd
    ptxas_verbose(tmp_path, odd, "odd")


@needs_ptxas
@pytest.mark.parametrize("group", [*GROUPS, *SCATTERED])
@pytest.mark.parametrize("options", [MMA_SYNC, WGMMA], ids=["mma.sync", "wgmma"])
def test_groups_assemble(group, options, tmp_path, rng):
    src = {**GROUPS, **SCATTERED}[group]
    fn = _define(src)
    kernel = _compile(src, _sizes(fn, 33, 17, 24), rng, options)
    assert "mma S0" in kernel.schedule
    ptxas_verbose(tmp_path, kernel.ptx, group, arch="sm_90a" if options is WGMMA else "sm_90")


# ---------------------------------------------------------------- on the GPU


def _check(src, sizes, rng, options=None):
    fn = _define(src)
    arrays = _inputs(fn, sizes, rng)
    kernel = fn.compile(*arrays, options=options)
    assert "mma S0" in kernel.schedule, "planned on tensor cores"
    got = fn(*arrays, options=options)
    want = tc.define(src, target="numpy")(*arrays)
    # integer-valued inputs: the float32 sums are exact; one rounding to the output type
    np.testing.assert_allclose(np.asarray(got, np.float64), np.asarray(want, np.float64),
                               rtol=1e-2 if np.asarray(got).dtype != np.float32 else 1e-6)


@pytest.mark.gpu
@pytest.mark.parametrize("layout", list(LAYOUTS))
@pytest.mark.parametrize("shape", SHAPES)
def test_awkward_shapes_on_gpu(layout, shape, rng):
    fn = _define(LAYOUTS[layout])
    _check(LAYOUTS[layout], _sizes(fn, *shape), rng)


@pytest.mark.gpu
@pytest.mark.parametrize("layout", ["nn", "nt", "tn", "tt"])
@pytest.mark.parametrize("shape", [(7, 15, 17), (100, 33, 30), (1, 1, 1), (33, 100, 36), (17, 7, 100)])
@pytest.mark.parametrize("options", [MMA_SYNC, WGMMA], ids=["mma.sync", "wgmma"])
def test_awkward_shapes_each_engine_on_gpu(layout, shape, options, rng):
    fn = _define(LAYOUTS[layout])
    _check(LAYOUTS[layout], _sizes(fn, *shape), rng, options)


@pytest.mark.gpu
@pytest.mark.parametrize("group", [*GROUPS, *SCATTERED])
@pytest.mark.parametrize("shape", [(33, 17, 24), (7, 100, 15), (1, 1, 1), (100, 64, 64)])
@pytest.mark.parametrize("options", [None, MMA_SYNC, WGMMA], ids=["default", "mma.sync", "wgmma"])
def test_groups_on_gpu(group, shape, options, rng):
    src = {**GROUPS, **SCATTERED}[group]
    fn = _define(src)
    _check(src, _sizes(fn, *shape), rng, options)


@pytest.mark.gpu
def test_no_contiguous_dimension_on_gpu(rng):
    src = ("def f(float16(K, M, Bt) A, float16(K, N, Bt) B) -> (C) "
           "{ C(b, m, n) +=! A(k, m, b) * B(k, n, b) }")
    _check(src, {"K": 33, "M": 17, "N": 7, "Bt": 3}, rng)


@pytest.mark.gpu
@pytest.mark.parametrize("sizes", [(7, 15, 17), (33, 30, 100), (1, 1, 1)])
def test_fused_linear_at_awkward_sizes_on_gpu(sizes, rng):
    src = """
def lin(float16(B, K) I, float16(N, K) W, float16(N) bias) -> (O) {
    O(b, n) +=! I(b, k) * W(n, k)
    O(b, n) = O(b, n) + bias(n)
    O(b, n) = fmax(O(b, n), 0)
}"""
    b, k, n = sizes
    _check(src, {"B": b, "K": k, "N": n}, rng)


@pytest.mark.gpu
@pytest.mark.parametrize("layout", ["nn", "tt"])
@pytest.mark.parametrize("shape", [(33, 17, 40), (100, 64, 64)])
def test_unaligned_device_inputs_on_gpu(layout, shape, rng):
    """Inputs one element into their allocation (not 16-byte aligned): element loads."""
    torch = pytest.importorskip("torch")
    if not torch.cuda.is_available():
        pytest.skip("torch without CUDA")
    fn = _define(LAYOUTS[layout])
    arrays = _inputs(fn, _sizes(fn, *shape), rng)
    views = []
    for x in arrays:
        buf = torch.empty(x.size + 1, dtype=torch.float16, device="cuda")
        buf[1:] = torch.from_numpy(x.ravel()).cuda()
        views.append(buf[1:].view(*x.shape))
    assert all(v.data_ptr() % 16 for v in views)
    got = fn(*views).cpu().numpy()
    want = tc.define(LAYOUTS[layout], target="numpy")(*arrays)
    np.testing.assert_allclose(got.astype(np.float64), np.asarray(want, np.float64), rtol=1e-2)
