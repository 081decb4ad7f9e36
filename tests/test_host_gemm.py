"""The host's packed contraction kernel (`passes/host_contraction.py`, `codegen/host_gemm.py`).

Contractions in every operand layout, batched or not, float32 and float64, at sizes that no
block, panel, vector width or unroll step divides (1, primes), under small blockings that make
every loop of the kernel run more than once (several reduction slices, column slices, row blocks
and edge tiles); compared in float64 with ``np.einsum`` (an oracle that shares nothing with the
compiler), outputs of ``+=!`` poisoned with NaN so that a kernel reading them before its first
store shows.
"""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import tcmlir as tc
from tcmlir.errors import PipelineError
from tcmlir.poly.host_contraction import host_contraction

# (source, einsum, shapes of the inputs from the sizes)
LAYOUTS = {
    "nn": ("def f(float(M, K) A, float(K, N) B) -> (C) { C(m, n) +=! A(m, k) * B(k, n) }",
           "mk,kn->mn", lambda s: [(s["M"], s["K"]), (s["K"], s["N"])]),
    "tt": ("def f(float(K, M) A, float(N, K) B) -> (C) { C(m, n) +=! A(k, m) * B(n, k) }",
           "km,nk->mn", lambda s: [(s["K"], s["M"]), (s["N"], s["K"])]),
    "swapped": ("def f(float(K, N) B, float(M, K) A) -> (C) { C(m, n) +=! B(k, n) * A(m, k) }",
                "kn,mk->mn", lambda s: [(s["K"], s["N"]), (s["M"], s["K"])]),
    "batched": ("def f(float(P, M, K) X, float(P, K, N) Y) -> (Z) "
                "{ Z(p, m, n) +=! X(p, m, k) * Y(p, k, n) }",
                "pmk,pkn->pmn", lambda s: [(s["P"], s["M"], s["K"]), (s["P"], s["K"], s["N"])]),
    "shared-b": ("def f(float(P, M, K) X, float(K, N) Y) -> (Z) "
                 "{ Z(p, m, n) +=! X(p, m, k) * Y(k, n) }",
                 "pmk,kn->pmn", lambda s: [(s["P"], s["M"], s["K"]), (s["K"], s["N"])]),
    "accumulate": ("def f(float(M, K) A, float(K, N) B) -> (C) { C(m, n) += A(m, k) * B(k, n) }",
                   "mk,kn->mn", lambda s: [(s["M"], s["K"]), (s["K"], s["N"])]),
}


def _run(layout: str, sizes: dict, dtype, options: tc.MappingOptions | None, seed: int = 0):
    src, spec, shapes = LAYOUTS[layout]
    src = src.replace("float(", "double(") if dtype == np.float64 else src
    rng = np.random.default_rng(seed)
    inputs = [rng.standard_normal(shape).astype(dtype) for shape in shapes(sizes)]
    fn = tc.define(src, target="cpu")
    want = np.einsum(spec, *(x.astype(np.float64) for x in inputs))
    kernel = fn.compile(*inputs, options=options)
    assert "host-contraction" in kernel.options.to_pipeline("cpu")
    poison = None if layout == "accumulate" else np.full(want.shape, np.nan, dtype)
    got = fn(*inputs, options=options, outputs=poison) if poison is not None else fn(*inputs, options=options)
    got = got[0] if isinstance(got, tuple) else got
    scale = max(1.0, float(np.abs(want).max()))
    tol = 1e-5 if dtype == np.float32 else 1e-12
    assert np.abs(got.astype(np.float64) - want).max() <= tol * scale * max(1, sizes["K"]) ** 0.5


def _conv_reference(img: np.ndarray, wts: np.ndarray, stride: int, shift: int) -> np.ndarray:
    """``O(n, f, h, w) = sum I(n, c, stride*h + kh + shift, stride*w + kw) W(f, c, kh, kw)``."""
    kh, kw = wts.shape[2:]
    oh = (img.shape[2] - shift - kh) // stride + 1
    ow = (img.shape[3] - kw) // stride + 1
    out = np.zeros((img.shape[0], wts.shape[0], oh, ow))
    for i in range(kh):
        for j in range(kw):
            patch = img[:, :, shift + i: shift + i + stride * (oh - 1) + 1: stride,
                        j: j + stride * (ow - 1) + 1: stride].astype(np.float64)
            out += np.einsum("nchw,fc->nfhw", patch, wts[:, :, i, j].astype(np.float64))
    return out


CONVS = {  # (source, stride, shift of h)
    "conv": ("def conv(float(N, C, H, W) I, float(F, C, KH, KW) W1) -> (O) "
             "{ O(n, f, h, w) +=! I(n, c, h + kh, w + kw) * W1(f, c, kh, kw) }", 1, 0),
    "strided": ("def conv(float(N, C, H, W) I, float(F, C, KH, KW) W1) -> (O) "
                "{ O(n, f, h, w) +=! I(n, c, 2 * h + kh, 2 * w + kw) * W1(f, c, kh, kw) "
                "where h in 0:(H - KH) / 2 + 1, w in 0:(W - KW) / 2 + 1 }", 2, 0),
    "shifted": ("def conv(float(N, C, H, W) I, float(F, C, KH, KW) W1) -> (O) "
                "{ O(n, f, h, w) +=! I(n, c, h + kh + 1, w + kw) * W1(f, c, kh, kw) "
                "where h in 0:H - KH }", 1, 1),
}


@pytest.mark.parametrize("kind", sorted(CONVS))
@pytest.mark.parametrize("blocking", [None, (5, 13, 7, 3, 16)])
def test_convolution_as_an_implicit_gemm(kind, blocking):
    """``n = (h, w)`` and ``k = (c, kh, kw)`` flatten through offset tables; rows of ``w`` are
    packed in runs (a panel of 16 columns spans rows of 7 outputs)."""
    src, stride, shift = CONVS[kind]
    rng = np.random.default_rng(1)
    img = rng.standard_normal((2, 3, 17, 16)).astype(np.float32)
    wts = rng.standard_normal((5, 3, 3, 2)).astype(np.float32)
    fn = tc.define(src, target="cpu")
    opts = None if blocking is None else _blocked(*blocking, threads=2)
    kernel = fn.compile(img, wts, options=opts)
    assert "host-contraction" in kernel.options.to_pipeline("cpu")
    want = _conv_reference(img, wts, stride, shift)
    got = fn(img, wts, options=opts, outputs=np.full(want.shape, np.nan, np.float32))
    np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-4)


def _blocked(mc: int, nc: int, kc: int, mr: int, nr: int, threads: int = 1) -> tc.MappingOptions:
    return (tc.MappingOptions.naive().tile(mc, nc, kc).register_tiling(mr, nr)
            .with_threads(threads))


@pytest.mark.parametrize("layout", sorted(LAYOUTS))
@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_layouts_at_awkward_sizes(layout, dtype):
    sizes = {"M": 37, "N": 41, "K": 29, "P": 3}
    # 3 row blocks of 16 (the last partial), 3 column slices, 4 reduction slices of 8 (padded
    # to the unroll step), panels of 3 rows and 16 columns with edges in both directions
    _run(layout, sizes, dtype, _blocked(16, 17, 7, 3, 16, threads=2))


@pytest.mark.parametrize("layout", ["nn", "batched"])
def test_default_options_take_the_packed_kernel(layout):
    sizes = {"M": 67, "N": 131, "K": 73, "P": 2}
    _run(layout, sizes, np.float32, None)


@pytest.mark.parametrize("sizes", [{"M": 1, "N": 1, "K": 1}, {"M": 1, "N": 97, "K": 5},
                                   {"M": 97, "N": 1, "K": 300}, {"M": 2, "N": 3, "K": 1}])
def test_degenerate_extents(sizes):
    _run("nn", sizes, np.float32, None)
    _run("nn", sizes, np.float32, _blocked(4, 8, 4, 2, 8, threads=2))


@settings(max_examples=20, deadline=None, database=None)
@given(layout=st.sampled_from(sorted(LAYOUTS)), dtype=st.sampled_from([np.float32, np.float64]),
       m=st.integers(1, 40), n=st.integers(1, 40), k=st.integers(1, 40), p=st.integers(1, 3),
       mc=st.integers(1, 24), nc=st.integers(1, 48), kc=st.integers(1, 24),
       mr=st.integers(1, 6), nr=st.integers(1, 40), threads=st.integers(1, 3),
       seed=st.integers(0, 2**31))
def test_random_blockings(layout, dtype, m, n, k, p, mc, nc, kc, mr, nr, threads, seed):
    _run(layout, {"M": m, "N": n, "K": k, "P": p}, dtype,
         _blocked(mc, nc, kc, mr, nr, threads), seed)


def test_not_a_contraction_is_refused_with_the_reason():
    fn = tc.define("def f(float(N, M) A) -> (B) { B(n, m) = A(n, m) + 1.0 }", target="cpu")
    a = np.ones((4, 5), np.float32)
    with pytest.raises(PipelineError, match=r"no statement is a host contraction.*not a `\+=`"):
        fn.compile(a, options=_blocked(8, 8, 8, 2, 8))


@pytest.mark.parametrize("src, why", [
    ("def f(float(M, K) A, float(K) B) -> (C) { C(m) +=! A(m, k) * B(k) }",
     "matrix-vector"),
    ("def f(float(M, N, K) A, float(N, K) B) -> (C) { C(m, n) +=! A(m, n, k) * B(n, k) }",
     "read by both operands or neither"),
    ("def f(float(M, K) A, float(K, N) B) -> (C) { C(m, n) +=! A(m, k) * B(k, n) * 2.0 }",
     "not a product of two reads"),
    ("def f(int32(M, K) A, int32(K, N) B) -> (C) { C(m, n) +=! A(m, k) * B(k, n) }",
     "not all float32 or all float64"),
    ("def f(float(M, K) A, int32(K) P, float(K, N) B) -> (C) "
     "{ C(m, n) +=! A(m, P(k)) * B(k, n) }", "not read at affine indices"),
])
def test_plan_reasons(src, why):
    fn = tc.define(src, target="cpu")
    sizes = {s: 8 for s in fn.ir.sizes}
    plan = host_contraction(fn.ir, 0, sizes)
    assert isinstance(plan, str) and why in plan


def test_parametric_kernels_keep_isl_tiles():
    opts = _blocked(32, 64, 16, 4, 16).with_parametric()
    pipeline = opts.to_pipeline("cpu")
    assert "host-contraction" not in pipeline and "tile{sizes=32,64,16}" in pipeline
    fn = tc.define(LAYOUTS["nn"][0], target="cpu")
    a, b = np.ones((5, 3), np.float32), np.ones((3, 7), np.float32)
    np.testing.assert_allclose(fn(a, b, options=opts), a @ b)


@pytest.mark.parametrize("vector", [4, 8, 16])
@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_narrower_vector_widths(vector, dtype):
    """The widths an SSE/NEON (4 floats), AVX2 (8) or AVX-512 (16) host gets, each run here:
    NR is rounded up to a multiple of the width (3 -> one vector)."""
    from tcmlir.passes import PassManager, parse_pipeline

    from tcmlir.codegen.host import compile_host
    from tcmlir.poly.state import CompileState

    src = LAYOUTS["tt"][0].replace("float(", "double(" if dtype == np.float64 else "float(")
    fn = tc.define(src, target="cpu")
    sizes = {"M": 13, "N": 23, "K": 11}
    pipeline = (f"schedule,host-contraction{{tile=8,16,4,register=3,3,vector={vector}}},"
                "mark-parallel")
    state = PassManager(parse_pipeline(pipeline)).run(CompileState.initial(fn.ir, sizes))
    kernel = compile_host(state, threads=2)
    rng = np.random.default_rng(vector)
    a = rng.standard_normal((11, 13)).astype(dtype)
    b = rng.standard_normal((23, 11)).astype(dtype)
    c = np.full((13, 23), np.nan, dtype)
    kernel.run({"A": a, "B": b, "C": c}, sizes)
    assert f"vector={vector}" in kernel.llvm_ir or f"v{vector}f" in kernel.llvm_ir
    np.testing.assert_allclose(c, a.T.astype(np.float64) @ b.T.astype(np.float64),
                               rtol=1e-5, atol=1e-5)


MM_THEN_ROWS = """def f(float(M, K) A, float(K, N) B) -> (C, rs) {
    C(m, n) +=! A(m, k) * B(k, n)
    rs(m) +=! C(m, n)
}"""


@pytest.mark.parametrize("fusion", ["min", "max", "preserve3coincident"])
def test_a_contraction_kernel_owns_the_whole_product(fusion, rng):
    """With fusion=min the matmul's initialisation gets a loop nest of its own: it stays a
    zero fill (made a packed kernel too, it computed the product, and the update's kernel
    added it again: C came out as 2 A B). Fused with the row sum (max, preserve3coincident),
    the matmul sits inside their loops: no kernel there (one per (m, n) had added the whole
    product 21 times), a PipelineError that says why. Found by fuzzing options of the
    tuner's space on the cpu target."""
    a = rng.standard_normal((7, 13)).astype(np.float32)
    b = rng.standard_normal((13, 3)).astype(np.float32)
    opts = tc.MappingOptions.from_json(
        f'{{"fusion":"{fusion}","register_tile":[2,2],"tile_sizes":[128,32,8]}}')
    fn = tc.define(MM_THEN_ROWS, target="cpu")
    if fusion != "min":
        with pytest.raises(PipelineError, match="inside a loop of other statements"):
            fn(a, b, options=opts)
        return
    c, rs = fn(a, b, options=opts)
    want = a.astype(np.float64) @ b
    np.testing.assert_allclose(c, want, rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(rs, want.sum(1), rtol=1e-5, atol=1e-5)
