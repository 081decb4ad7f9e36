"""Tensor cores: fragment layouts (simulated), which contractions qualify, PTX for every layout,
and (GPU) results against float64 references."""

from __future__ import annotations

import re
import shutil

import numpy as np
import pytest
from conftest import ptxas_verbose
from hypothesis import given, settings
from hypothesis import strategies as st

import tcmlir as tc
from tcmlir.codegen.mma_layout import simulate_warp_tile
from tcmlir.errors import OptionsError, PipelineError
from tcmlir.poly.contraction import contraction_plan

needs_ptxas = pytest.mark.skipif(shutil.which("ptxas") is None, reason="ptxas not installed")

# (source, sizes, operand layouts) of contractions in every layout and batch form
FORMS = {
    "nn": ("def f(float16(M, K) A, float16(K, N) B) -> (C) { C(m, n) +=! A(m, k) * B(k, n) }",
           ("k-major", "row-major")),
    "nt": ("def f(float16(M, K) A, float16(N, K) B) -> (C) { C(m, n) +=! A(m, k) * B(n, k) }",
           ("k-major", "k-major")),
    "tn": ("def f(float16(K, M) A, float16(K, N) B) -> (C) { C(m, n) +=! A(k, m) * B(k, n) }",
           ("row-major", "row-major")),
    "tt": ("def f(float16(K, M) A, float16(N, K) B) -> (C) { C(m, n) +=! A(k, m) * B(n, k) }",
           ("row-major", "k-major")),
    "bf16-f32out": ("def f(bfloat16(M, K) A, bfloat16(K, N) B) -> (float(M, N) C) "
                    "{ C(m, n) +=! A(m, k) * B(k, n) }", ("k-major", "row-major")),
    "batched": ("def f(float16(Bt, N, K) X, float16(Bt, M, K) Y) -> (Z) "
                "{ Z(b, n, m) +=! X(b, n, k) * Y(b, m, k) }", ("k-major", "k-major")),
    "broadcast-b": ("def f(float16(Bt, M, K) A, float16(K, N) B) -> (C) "
                    "{ C(b, m, n) +=! A(b, m, k) * B(k, n) }", ("k-major", "row-major")),
}


def _sizes(fn, m, n, k, batch=3):
    names = set(fn.ir.sizes)
    out = {"M": m, "N": n, "K": k}
    if "Bt" in names:
        out["Bt"] = batch
    return {s: out[s] for s in names}


def _inputs(fn, sizes, rng, dtype=None):
    arrays = []
    for t in fn.ir.inputs:
        shape = tuple(s.evaluate(sizes) for s in t.shape)
        x = rng.integers(-3, 4, shape).astype(np.float32)  # exact in half precision
        arrays.append(x.astype(np.float16) if t.dtype.name == "FLOAT16" else _bf16(x))
    return arrays


def _bf16(x):
    ml = pytest.importorskip("ml_dtypes")
    return x.astype(ml.bfloat16)


@pytest.mark.parametrize("a_k_major", [True, False])
@pytest.mark.parametrize("b_k_major", [True, False])
def test_fragment_layouts_compute_a_warp_tile(a_k_major, b_k_major, rng):
    a = rng.integers(-8, 8, (16, 16)).astype(np.float64)
    b = rng.integers(-8, 8, (16, 16)).astype(np.float64)
    np.testing.assert_array_equal(simulate_warp_tile(a, b, a_k_major, b_k_major), a @ b)


@pytest.mark.parametrize("swap", [(0, 1), (1, 2), (2, 3)])
def test_planted_register_swap_is_caught(swap, rng):
    a = rng.integers(-8, 8, (16, 16)).astype(np.float64)
    b = rng.integers(-8, 8, (16, 16)).astype(np.float64)
    assert not np.array_equal(simulate_warp_tile(a, b, True, False, swap=swap), a @ b)


@pytest.mark.parametrize("form", list(FORMS))
def test_every_layout_is_a_contraction(form):
    src, (a_layout, b_layout) = FORMS[form]
    fn = tc.define(src, target="cuda")
    plan = contraction_plan(fn.ir, _sizes(fn, 64, 64, 64))
    assert not isinstance(plan, str), plan
    assert ("k-major" if plan.a.k_major else "row-major") == a_layout
    assert ("k-major" if plan.b.k_major else "row-major") == b_layout
    opts = tc.MappingOptions.default_for(fn, "cuda", _sizes(fn, 64, 64, 64))
    assert opts.mma_tile, "a half-precision contraction gets tensor cores by default"


@pytest.mark.parametrize("src, why", [
    ("def f(float(M, K) A, float(K, N) B) -> (C) { C(m, n) +=! A(m, k) * B(k, n) }", "float16"),
    ("def f(float16(M, K) A, float16(K) x) -> (y) { y(m) +=! A(m, k) * x(k) }", "matrix-vector"),
    ("def f(float16(M, K) A, float16(K, N) B) -> (C) { C(m, n) +=! A(m, k) * B(k, n) + 1 }",
     "product"),
    ("def f(float16(M, K) A, float16(K, N) B) -> (C) { C(m, n) max=! A(m, k) * B(k, n) }", "+=!"),
])
def test_what_is_not_a_tensor_core_contraction(src, why):
    fn = tc.define(src, target="cuda")
    plan = contraction_plan(fn.ir, {s: 64 for s in fn.ir.sizes})
    assert isinstance(plan, str) and why in plan


def test_options_round_trip_and_refusals():
    opts = tc.MappingOptions.naive().tensor_cores((64, 128, 32), (2, 2), 4)
    assert tc.MappingOptions.from_json(opts.to_json()) == opts
    assert "map-mma{tile=64,128,32,warps=2,2,stages=4}" in opts.to_pipeline("cuda")
    assert "mma" not in tc.MappingOptions.naive().to_json()  # old cache keys unchanged
    with pytest.raises(OptionsError):
        tc.MappingOptions(mma_tile=(128, 128, 32), mma_warps=(2,), mma_stages=3)
    fn = tc.define("def f(float(M, K) A, float(K, N) B) -> (C) { C(m, n) +=! A(m, k) * B(k, n) }",
                   target="cuda")
    a = np.zeros((64, 64), np.float32)
    with pytest.raises(PipelineError, match="not a tensor-core contraction"):
        fn.compile(a, a, target="cuda", arch="sm_90", options=opts)


def _compile(fn, sizes, rng, options=None):
    return fn.compile(*_inputs(fn, sizes, rng), target="cuda", arch="sm_90", options=options)


@needs_ptxas
@pytest.mark.parametrize("form", list(FORMS))
def test_ptx_of_every_layout(form, tmp_path, rng):
    fn = tc.define(FORMS[form][0], target="cuda")
    sizes = _sizes(fn, 264, 136, 40)  # tiles divide none of them
    kernel = _compile(fn, sizes, rng)
    info = ptxas_verbose(tmp_path, kernel.ptx, form)
    assert "mma.sync.aligned.m16n8k16.row.col.f32" in kernel.ptx
    assert "ldmatrix.sync.aligned.m8n8.x4" in kernel.ptx
    assert "cp.async.cg.shared.global" in kernel.ptx
    assert " 0 bytes spill stores" in info
    assert "mma S0" in kernel.schedule
    if form != "bf16-f32out":  # the half output's float32 accumulator never reaches memory
        assert len(re.findall(r"\.entry", kernel.ptx)) == 1


@needs_ptxas
@settings(max_examples=12, deadline=None)
@given(layout=st.sampled_from(["nn", "nt", "tn", "tt", "batched"]),
       m=st.sampled_from([8, 16, 24, 136]), n=st.sampled_from([8, 40, 264]),
       k=st.sampled_from([8, 16, 56]), tile=st.sampled_from([(64, 64, 32), (128, 64, 16),
                                                           (64, 128, 32)]),
       stages=st.sampled_from([2, 3]))
def test_generated_contractions_assemble(layout, m, n, k, tile, stages, tmp_path_factory):
    fn = tc.define(FORMS[layout][0], target="cuda")
    sizes = _sizes(fn, m, n, k)
    opts = tc.MappingOptions.naive().tensor_cores(tile, (2, 2), stages)
    kernel = _compile(fn, sizes, np.random.default_rng(0), opts)
    ptxas_verbose(tmp_path_factory.mktemp("mma"), kernel.ptx, layout)


# ---------------------------------------------------------------- on the GPU


@pytest.mark.gpu
@pytest.mark.parametrize("form", list(FORMS))
@pytest.mark.parametrize("shape", [(264, 136, 40), (8, 8, 8), (1000, 1000, 128), (128, 256, 520)])
def test_tensor_core_results_on_gpu(form, shape, rng):
    src = FORMS[form][0]
    fn = tc.define(src, target="cuda")
    sizes = _sizes(fn, *shape)
    arrays = _inputs(fn, sizes, rng)
    got = fn(*arrays)
    want = tc.define(src, target="numpy")(*arrays)
    # integer-valued inputs: the float32 sums are exact; one rounding to the output type
    np.testing.assert_allclose(np.asarray(got, np.float64), np.asarray(want, np.float64),
                               rtol=1e-2 if got.dtype != np.float32 else 1e-6)


@pytest.mark.gpu
@pytest.mark.parametrize("tile, warps, stages", [((64, 64, 32), (2, 2), 2), ((128, 64, 16), (4, 2), 4),
                                                 ((64, 128, 32), (1, 4), 3)])
def test_tensor_core_options_on_gpu(tile, warps, stages, rng):
    fn = tc.define(FORMS["nn"][0], target="cuda")
    a = rng.standard_normal((300, 72)).astype(np.float16)
    b = rng.standard_normal((72, 200)).astype(np.float16)
    got = fn(a, b, options=tc.MappingOptions.naive().tensor_cores(tile, warps, stages))
    want = a.astype(np.float64) @ b.astype(np.float64)
    np.testing.assert_allclose(got.astype(np.float64), want, rtol=2e-2, atol=2e-2)


# ---------------------------------------------------------------- wgmma (sm_90a)

WGMMA = tc.MappingOptions.naive().tensor_cores((128, 128, 64), (8, 1), 3, wgmma=True)


@needs_ptxas
@pytest.mark.parametrize("form", ["nt", "batched", "nn", "tn", "tt", "bf16-f32out"])
def test_wgmma_ptx(form, tmp_path, rng):
    fn = tc.define(FORMS[form][0], target="cuda")
    kernel = _compile(fn, _sizes(fn, 264, 136, 72), rng, WGMMA)
    assert ".target sm_90a" in kernel.ptx
    assert re.search(r"wgmma.mma_async.sync.aligned.m64n128k16.f32.b?f16.b?f16", kernel.ptx)
    assert "fence.proxy.async.shared::cta" in kernel.ptx
    info = ptxas_verbose(tmp_path, kernel.ptx, form, arch="sm_90a")
    assert " 0 bytes spill stores" in info
    assert kernel.runner.image.kernels[0].shared_bytes == 3 * 2 * 128 * 64 * 2


def test_wgmma_needs_a_k_tile_of_64(rng):
    fn = tc.define(FORMS["nn"][0], target="cuda")
    with pytest.raises(PipelineError, match="BK = 64"):
        _compile(fn, _sizes(fn, 128, 128, 64), rng, tc.MappingOptions.naive().tensor_cores(
            (128, 128, 32), (8, 1), 3, wgmma=True))


@pytest.mark.gpu
@pytest.mark.parametrize("form", ["nt", "batched", "nn", "tn", "tt", "bf16-f32out"])
@pytest.mark.parametrize("shape", [(264, 136, 72), (128, 128, 64), (1000, 520, 200)])
@pytest.mark.parametrize("tile, warps, stages", [((128, 128, 64), (8, 1), 3), ((64, 256, 64), (4, 1), 4)])
def test_wgmma_results_on_gpu(form, shape, tile, warps, stages, rng):
    src = FORMS[form][0]
    fn = tc.define(src, target="cuda")
    arrays = _inputs(fn, _sizes(fn, *shape), rng)
    got = fn(*arrays, options=tc.MappingOptions.naive().tensor_cores(tile, warps, stages, wgmma=True))
    want = tc.define(src, target="numpy")(*arrays)
    np.testing.assert_allclose(np.asarray(got, np.float64), np.asarray(want, np.float64), rtol=1e-2)


# ---------------------------------------------------------------- fused epilogues

LINEAR = """
def lin(float16(B, K) I, float16(N, K) W, float16(N) bias) -> (O) {
    O(b, n) +=! I(b, k) * W(n, k)
    O(b, n) = O(b, n) + bias(n)
    O(b, n) = fmax(O(b, n), 0)
}"""
LINEAR_F32 = """
def lin(bfloat16(B, K) I, bfloat16(K, N) W, float(N) bias, float(B) scale) -> (float(B, N) O) {
    O(i, j) +=! I(i, k) * W(k, j)
    O(i, j) = tanh(O(i, j) * scale(i) + bias(j))
}"""


@pytest.mark.parametrize("src", [LINEAR, LINEAR_F32])
def test_epilogue_statements_join_the_plan(src):
    fn = tc.define(src, target="cuda")
    plan = contraction_plan(fn.ir, {s: 64 for s in fn.ir.sizes})
    assert not isinstance(plan, str), plan
    assert plan.epilogue and plan.out == "O"


@pytest.mark.parametrize("extra, why", [
    ("O(b, n) = O(b, n) + I(b, n + 1)", "elsewhere"),
    ("O(b, n) += bias(r) where r in 0:2", "not a pointwise"),
])
def test_epilogues_that_cannot_fuse(extra, why):
    src = LINEAR.replace("    O(b, n) = fmax(O(b, n), 0)\n", f"    {extra}\n")
    fn = tc.define(src, target="cuda")
    plan = contraction_plan(fn.ir, {s: 64 for s in fn.ir.sizes})
    assert isinstance(plan, str) and why in plan, plan


@needs_ptxas
def test_fused_linear_is_one_kernel(tmp_path, rng):
    fn = tc.define(LINEAR, target="cuda")
    kernel = _compile(fn, {"B": 1000, "K": 256, "N": 520}, rng)
    assert len(kernel.runner.image.kernels) == 1
    assert "O_acc" in kernel.runner.image.on_chip
    ptxas_verbose(tmp_path, kernel.ptx, "lin", arch="sm_90a" if "sm_90a" in kernel.ptx else "sm_90")


@pytest.mark.gpu
@pytest.mark.parametrize("src", [LINEAR, LINEAR_F32])
@pytest.mark.parametrize("sizes", [(1000, 256, 520), (64, 64, 64), (8, 40, 24)])
@pytest.mark.parametrize("wgmma", [True, False])
def test_fused_epilogues_on_gpu(src, sizes, wgmma, rng):
    fn = tc.define(src, target="cuda")
    b, k, n = sizes
    arrays = _inputs(fn, {"B": b, "K": k, "N": n}, rng)
    if src is LINEAR_F32:  # float32 bias and scale
        arrays[2] = rng.standard_normal(n).astype(np.float32)
        arrays[3] = rng.standard_normal(b).astype(np.float32) * 0.01
    opts = (tc.MappingOptions.naive().tensor_cores((128, 128, 64), (8, 1), 3, wgmma=True) if wgmma
            else tc.MappingOptions.naive().tensor_cores((64, 64, 32), (2, 2), 3))
    got = fn(*arrays, options=opts)
    want = tc.define(src, target="numpy")(*arrays)
    np.testing.assert_allclose(np.asarray(got, np.float64), np.asarray(want, np.float64),
                               rtol=1e-2, atol=1e-2)


# ---------------------------------------------------------------- the tuner's space

def test_tuner_searches_tensor_core_mappings(tmp_path_factory):
    import random

    from tcmlir.tune.space import MMA_FIELDS, space_for

    fn = tc.define(FORMS["nn"][0], target="cuda")
    sizes = {"M": 264, "N": 136, "K": 40}
    space = space_for(fn.ir, "cuda", None, sizes)
    assert set(MMA_FIELDS) <= set(space.fields)
    assert not space_for(fn.ir, "cuda", None, None).tensor_cores  # parametric: no plan
    bad = tc.MappingOptions.naive().tensor_cores((128, 128, 64), (2, 2), 3, wgmma=True)
    assert "warps = (BM/16, 1)" in space.why_invalid(bad)
    big = tc.MappingOptions.naive().tensor_cores((128, 256, 64), (8, 1), 6, wgmma=True)
    assert "shared memory" in space.why_invalid(big)
    rng = random.Random(7)
    drawn = [space.sample(rng, tc.MappingOptions.default_for(fn, "cuda", sizes)) for _ in range(40)]
    with_tc = [o for o in drawn if o.mma_tile]
    assert with_tc and all(space.is_valid(o) for o in drawn)
    if shutil.which("ptxas"):
        arrays = _inputs(fn, sizes, np.random.default_rng(0))
        for opts in with_tc[:4]:  # what the tuner would time compiles and assembles
            kernel = fn.compile(*arrays, target="cuda", arch="sm_90", options=opts)
            arch = "sm_90a" if ".target sm_90a" in kernel.ptx else "sm_90"
            ptxas_verbose(tmp_path_factory.mktemp("space"), kernel.ptx, "cand", arch=arch)
