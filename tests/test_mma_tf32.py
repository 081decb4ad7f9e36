"""TF32 tensor cores for float32 contractions, on request only: options, plans, the fragment
layouts (simulated), PTX for every layout (ptxas-checked) and (GPU) results."""

from __future__ import annotations

import shutil

import numpy as np
import pytest
from conftest import ptxas_verbose

import tcmlir as tc
from tcmlir.codegen.mma_layout import simulate_warp_tile_tf32
from tcmlir.errors import OptionsError, PipelineError
from tcmlir.poly.contraction import contraction_plan

needs_ptxas = pytest.mark.skipif(shutil.which("ptxas") is None, reason="ptxas not installed")

LAYOUTS = {
    "nn": "def f(float(M, K) A, float(K, N) B) -> (C) { C(m, n) +=! A(m, k) * B(k, n) }",
    "nt": "def f(float(M, K) A, float(N, K) B) -> (C) { C(m, n) +=! A(m, k) * B(n, k) }",
    "tn": "def f(float(K, M) A, float(K, N) B) -> (C) { C(m, n) +=! A(k, m) * B(k, n) }",
    "tt": "def f(float(K, M) A, float(N, K) B) -> (C) { C(m, n) +=! A(k, m) * B(n, k) }",
    "batched": "def f(float(Bt, N, K) X, float(Bt, M, K) Y) -> (Z) "
               "{ Z(b, n, m) +=! X(b, n, k) * Y(b, m, k) }",
}
TF32 = tc.MappingOptions.naive().tensor_cores((64, 64, 32), (2, 2), 3, precision="tf32")


def _sizes(fn, m, n, k):
    values = {"M": m, "N": n, "K": k, "Bt": 3}
    return {s: values[s] for s in fn.ir.sizes}


def _inputs(fn, sizes, rng, integers=True):
    out = []
    for t in fn.ir.inputs:
        shape = tuple(s.evaluate(sizes) for s in t.shape)
        x = rng.integers(-3, 4, shape) if integers else rng.standard_normal(shape)
        out.append(x.astype(np.float32))
    return out


@pytest.mark.parametrize("a_k_major", [True, False])
@pytest.mark.parametrize("b_k_major", [True, False])
def test_tf32_fragment_layouts_compute_a_warp_tile(a_k_major, b_k_major, rng):
    a = rng.integers(-8, 8, (16, 8)).astype(np.float32)
    b = rng.integers(-8, 8, (8, 16)).astype(np.float32)
    got = simulate_warp_tile_tf32(a, b, a_k_major, b_k_major)
    np.testing.assert_array_equal(got, a.astype(np.float64) @ b)


@pytest.mark.parametrize("swap", [(0, 1), (1, 2), (2, 3)])
@pytest.mark.parametrize("a_k_major", [True, False])
def test_planted_tf32_register_swap_is_caught(swap, a_k_major, rng):
    a = rng.integers(-8, 8, (16, 8)).astype(np.float32)
    b = rng.integers(-8, 8, (8, 16)).astype(np.float32)
    got = simulate_warp_tile_tf32(a, b, a_k_major, True, swap=swap)
    assert not np.array_equal(got, a.astype(np.float64) @ b)


def test_tf32_is_only_on_request():
    fn = tc.define(LAYOUTS["nn"], target="cuda")
    sizes = {"M": 64, "N": 64, "K": 64}
    plan = contraction_plan(fn.ir, sizes)
    assert isinstance(plan, str) and "precision='tf32'" in plan
    assert not tc.MappingOptions.default_for(fn, "cuda", sizes).mma_tile
    plan = contraction_plan(fn.ir, sizes, tf32=True)
    assert not isinstance(plan, str) and plan.dtype.name == "FLOAT32"
    assert (plan.a.copy, plan.b.copy) == (4, 4)  # 16-byte copies of four floats
    odd = contraction_plan(fn.ir, {"M": 7, "N": 15, "K": 17}, tf32=True)
    assert not isinstance(odd, str) and (odd.a.copy, odd.b.copy) == (1, 1)  # 4-byte copies


def test_tf32_options():
    assert TF32.allow_tf32 and tc.MappingOptions.from_json(TF32.to_json()) == TF32
    assert "map-mma{tile=64,64,32,warps=2,2,stages=3,tf32=true}" in TF32.to_pipeline("cuda")
    assert "allow_tf32" not in tc.MappingOptions.naive().tensor_cores().to_json()
    assert not TF32.tensor_cores(()).allow_tf32
    with pytest.raises(OptionsError, match="precision"):
        tc.MappingOptions.naive().tensor_cores(precision="fp8")
    fn = tc.define(LAYOUTS["nn"], target="cuda")  # a permission: FMA without mma_tile
    a = np.ones((16, 16), np.float32)
    kernel = fn.compile(a, a, target="cuda", arch="sm_90",
                        options=tc.MappingOptions(allow_tf32=True))
    assert "mma" not in kernel.ptx


def test_tf32_refuses_wgmma_and_half_operands_still_plan(rng):
    fn = tc.define(LAYOUTS["nn"], target="cuda")
    a = np.zeros((128, 64), np.float32)
    opts = tc.MappingOptions.naive().tensor_cores((128, 128, 64), (8, 1), 3, wgmma=True,
                                                  precision="tf32")
    with pytest.raises(PipelineError, match=r"TF32 runs on mma\.sync"):
        fn.compile(a, a.T.copy(), target="cuda", arch="sm_90", options=opts)
    half = tc.define(LAYOUTS["nn"].replace("float(", "float16("), target="cuda")
    x = np.zeros((64, 64), np.float16)
    kernel = half.compile(x, x, target="cuda", arch="sm_90", options=TF32)
    assert "m16n8k16" in kernel.ptx


@needs_ptxas
@pytest.mark.parametrize("layout", list(LAYOUTS))
@pytest.mark.parametrize("shape", [(264, 136, 40), (7, 15, 17), (1, 1, 1), (100, 33, 64)])
def test_tf32_ptx(layout, shape, tmp_path, rng):
    fn = tc.define(LAYOUTS[layout], target="cuda")
    kernel = fn.compile(*_inputs(fn, _sizes(fn, *shape), rng), target="cuda", arch="sm_90",
                        options=TF32)
    assert "mma.sync.aligned.m16n8k8.row.col.f32.tf32.tf32.f32" in kernel.ptx
    assert "cvt.rna.tf32.f32" in kernel.ptx
    info = ptxas_verbose(tmp_path, kernel.ptx, layout)
    assert " 0 bytes spill stores" in info


@pytest.mark.gpu
@pytest.mark.parametrize("layout", list(LAYOUTS))
@pytest.mark.parametrize("shape", [(264, 136, 40), (1, 7, 15), (17, 33, 100), (100, 1, 7),
                                   (15, 100, 1), (33, 17, 33)])
def test_tf32_exact_on_integers_on_gpu(layout, shape, rng):
    fn = tc.define(LAYOUTS[layout], target="cuda")
    arrays = _inputs(fn, _sizes(fn, *shape), rng)  # small integers: exact in TF32
    got = fn(*arrays, options=TF32)
    want = tc.define(LAYOUTS[layout], target="numpy")(*arrays)
    np.testing.assert_allclose(np.asarray(got, np.float64), np.asarray(want, np.float64), rtol=1e-6)


@pytest.mark.gpu
@pytest.mark.parametrize("layout", ["nn", "tt"])
def test_tf32_tolerance_on_gpu(layout, rng):
    """Random operands: each rounded to TF32 (relative error <= 2^-11), products summed in
    float32: within (2^-10 + K 2^-24) sum_k |a||b| of the float64 result (docs/gpu.md)."""
    fn = tc.define(LAYOUTS[layout], target="cuda")
    m, n, k = 300, 200, 520
    arrays = _inputs(fn, _sizes(fn, m, n, k), rng, integers=False)
    a, b = (x.astype(np.float64) for x in arrays)
    a, b = (a, b) if layout == "nn" else (a.T, b.T)   # tt: A(K, M), B(N, K)
    got = np.asarray(fn(*arrays, options=TF32), np.float64)
    bound = (2.0**-10 + k * 2.0**-24) * (np.abs(a) @ np.abs(b))
    assert np.all(np.abs(got - a @ b) <= bound)
    assert not np.array_equal(got, np.asarray(fn(*arrays), np.float64)), "TF32 took effect"
