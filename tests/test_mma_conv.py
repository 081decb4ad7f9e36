"""Convolutions as implicit GEMMs on tensor cores: operands read at affine indices
(``I(n, c, h + kh, w + kw)``, ``I(n, c, 2 * h + kh, ...)``), planned with one stride per index
(`poly/contraction.py`) and groups addressed run by run where they are not one dimension of a
tensor (`ContractionPlan.segments`).

* Plans: which indices form M, N and K, which operand is scattered, the copy widths (the
  issue's target convolution among them), and what still does not qualify.
* Whole kernels on the host machine of `tests/mma_emulator.py` against the reference
  interpreter (small integers: exact), NCHW and NHWC, fp16 and bf16, half and float outputs,
  KH = KW = 1 and 3, stride 2, dilation 2, odd H and W, C not a multiple of 8, and random
  ones (hypothesis: layouts, filter layouts, strides, dilations, sizes): every input sits between
  NaNs and every output between sentinels, so a read past an operand's end that feeds a stored
  output (a step past the last) or a store past the output's shows. (Rows past the end feed
  only outputs never stored: `test_mma_host.test_copies_of_convolutions` checks their tiles,
  zero-filled.) Planted bugs fail them.
* PTX of the convolutions assembles with ptxas (sm_90, and sm_90a for wgmma).
* On the GPU (``-m gpu``, for a machine with one): the same programs and the issue's target
  sizes against the reference.
"""

from __future__ import annotations

import shutil

import mma_emulator as emu
import numpy as np
import pytest
from conftest import ptxas_verbose
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import tcmlir as tc
from tcmlir.codegen.gpu_mma import MmaEmitter
from tcmlir.poly.contraction import Segment, contraction_plan, segments

needs_ptxas = pytest.mark.skipif(shutil.which("ptxas") is None, reason="ptxas not installed")

NCHW = ("def conv(float16(N, C, H, W) I, float16(M, C, KH, KW) Wt) -> (O) "
        "{ O(n, m, h, w) +=! I(n, c, h + kh, w + kw) * Wt(m, c, kh, kw) }")
NHWC = ("def conv(float16(N, H, W, C) I, float16(M, KH, KW, C) Wt) -> (O) "
        "{ O(n, h, w, m) +=! I(n, h + kh, w + kw, c) * Wt(m, kh, kw, c) }")
CONVS = {
    "nchw": NCHW,
    "nhwc": NHWC,
    "nchw-stride2": NCHW.replace("h + kh, w + kw", "2 * h + kh, 2 * w + kw"),
    "nhwc-stride2": NHWC.replace("h + kh, w + kw", "2 * h + kh, 2 * w + kw"),
    # the filter as HWIO: its rows (m) contiguous, stored row-major in shared memory
    "nhwc-hwio": ("def conv(float16(N, H, W, C) I, float16(KH, KW, C, M) Wt) -> (O) "
                  "{ O(n, h, w, m) +=! I(n, h + kh, w + kw, c) * Wt(kh, kw, c, m) }"),
    # a true convolution (the filter flipped: negative coefficients, a constant term)
    "nchw-flipped": ("def conv(float16(N, C, H, W) I, float16(M, C, KH, KW) Wt) -> (O) "
                     "{ O(n, m, h, w) +=! I(n, c, h + kh, w + kw) * Wt(m, c, KH - 1 - kh, KW - 1 - kw) }"),
    # float outputs (sized by a per-position bias, fused into the store), bf16 operands
    "nchw-f32out": ("def conv(float16(N, C, H, W) I, float16(M, C, KH, KW) Wt, float(M, OH, OW) B) "
                    "-> (float(N, M, OH, OW) O) {\n"
                    "    O(n, m, h, w) +=! I(n, c, h + kh, w + kw) * Wt(m, c, kh, kw)\n"
                    "    O(n, m, h, w) = O(n, m, h, w) + B(m, h, w)\n}"),
    "nhwc-bf16-f32out": ("def conv(bfloat16(N, H, W, C) I, bfloat16(M, KH, KW, C) Wt, "
                         "float(OH, OW, M) B) -> (float(N, OH, OW, M) O) {\n"
                         "    O(n, h, w, m) +=! I(n, h + kh, w + kw, c) * Wt(m, kh, kw, c)\n"
                         "    O(n, h, w, m) = O(n, h, w, m) + B(h, w, m)\n}"),
    "nchw-bf16": NCHW.replace("float16", "bfloat16"),
    "nchw-dilated": NCHW.replace("h + kh, w + kw", "h + 2 * kh, w + 2 * kw"),
}
# N, C, H, W, M, KH(=KW): odd H and W, C not a multiple of 8 (or of 16), 1x1 and 3x3
SHAPES = {
    "3x3": (2, 5, 7, 9, 6, 3),
    "3x3-c16": (2, 16, 7, 9, 24, 3),
    "3x3-c24": (1, 24, 6, 10, 40, 3),
    "1x1": (2, 12, 5, 8, 6, 1),
    "1x1-odd": (3, 7, 5, 3, 9, 1),
    "3x3-wide": (2, 5, 6, 12, 6, 3),  # runs of 10 (w) and 15 (kw, c): one boundary per chunk
}


def _sizes(src: str, shape) -> dict[str, int]:
    n, c, h, w, m, k = shape
    sizes = {"N": n, "C": c, "H": h, "W": w, "M": m, "KH": k, "KW": k}
    stride = 2 if "2 * h" in src else 1
    sizes["OH"], sizes["OW"] = (h - k) // stride + 1, (w - k) // stride + 1
    fn = tc.define(src, target="cuda")
    return {s: sizes[s] for s in fn.ir.sizes}


def _plan(src: str, sizes: dict[str, int]):
    plan = contraction_plan(tc.define(src, target="cuda").ir, sizes)
    assert not isinstance(plan, str), plan
    return plan


# ---------------------------------------------------------------- plans


def test_segments_are_the_runs_of_a_group_in_memory():
    ext = {"n": 2, "h": 5, "w": 7, "c": 4, "u": 1}
    # I(n, c, h + kh, w + kw) of a 2x4x7x9 input: h and w do not flatten (W = 9, OW = 7)
    strides = {"n": 252, "c": 63, "h": 9, "w": 1, "u": 1000}
    assert segments(("n", "h", "w"), strides, ext) == (
        Segment(1, 7, 1), Segment(7, 5, 9), Segment(35, 2, 252))
    # one flattened dimension: one run; members of extent 1 are always 0 (left out)
    assert segments(("n", "h", "u", "w"), {"n": 35, "h": 7, "w": 1, "u": 3}, ext) == (Segment(1, 70, 1),)
    assert segments(("u",), {"u": 5}, ext) == (Segment(1, 1, 5),)


def test_the_im2col_groups_of_a_convolution():
    plan = _plan(NCHW, _sizes(NCHW, (2, 5, 7, 9, 6, 3)))
    # the output is contiguous along w: the filter is the A operand (rows m), the input B
    assert (plan.a.tensor, plan.b.tensor) == ("Wt", "I")
    assert plan.members(plan.n) == ("n", "h", "w") and plan.members(plan.m) == ("m",)
    assert plan.members(plan.k) == ("c", "kh", "kw") and plan.batch == ()
    assert plan.b.stride("w") == 1 and plan.b.stride("kw") == 1 and plan.b.stride("h") == 9
    assert plan.b.row_scattered and plan.b.k_scattered
    assert not plan.a.row_scattered and not plan.a.k_scattered and plan.a.k_major
    # NCHW: an output row (n, h, w) is 7 contiguous w, then the next h, then the next image
    assert [(s.extent, s.stride) for s in plan.segments(plan.n, plan.out_strides)] == [(35, 1), (2, 210)]


@pytest.mark.parametrize("name, shape, widths, k_major", [
    ("nchw", (2, 5, 7, 9, 6, 3), (1, 1), (True, False)),      # Wt: 45-element rows; I: kw odd
    ("nchw", (64, 128, 28, 28, 128, 3), (8, 1), (True, False)),  # the target
    ("nhwc", (64, 128, 28, 28, 128, 3), (8, 8), (True, True)),   # runs of 128 channels
    ("nhwc", (2, 5, 7, 9, 6, 3), (1, 1), (True, True)),
    ("nhwc", (2, 12, 7, 9, 6, 3), (4, 4), (True, True)),       # runs of 12: 8-byte copies
    ("nhwc-hwio", (2, 16, 7, 9, 24, 3), (8, 8), (False, True)),  # filter rows (m) contiguous
    ("nchw", (2, 12, 5, 8, 6, 1), (4, 8), (True, False)),      # 1x1: I's rows runs of 40
    ("nchw-stride2", (2, 16, 9, 11, 8, 3), (8, 1), (True, True)),  # w stride 2: along kw
])
def test_copy_widths_of_convolutions(name, shape, widths, k_major):
    src = CONVS[name]
    plan = _plan(src, _sizes(src, shape))
    ops = {op.tensor: op for op in (plan.a, plan.b)}
    assert (ops["Wt"].copy, ops["I"].copy) == widths
    assert (ops["Wt"].k_major, ops["I"].k_major) == k_major


def test_the_target_convolution_runs_on_tensor_cores_by_default():
    """The issue's fp16 3x3 convolution 64x128x28x28 -> 128 channels (valid: 26x26): an
    implicit GEMM of M = 128 (filters), N = 64*26*26 = 43264, K = 128*9 = 1152."""
    for src in (NCHW, NHWC):
        sizes = _sizes(src, (64, 128, 28, 28, 128, 3))
        plan = _plan(src, sizes)
        extents = sorted(plan.extent(d) for d in (plan.m, plan.n))
        assert extents == [128, 43264] and plan.extent(plan.k) == 1152
        opts = tc.MappingOptions.default_for(tc.define(src, target="cuda"), "cuda", sizes)
        assert opts.mma_tile, opts


def test_what_stays_refused_among_convolutions():
    cases = {  # (the reason, sizes)
        # depthwise: the filter has no output index of its own
        "def dw(float16(N, C, H, W) I, float16(C, KH, KW) Wt) -> (O) "
        "{ O(n, c, h, w) +=! I(n, c, h + kh, w + kw) * Wt(c, kh, kw) }": "matrix-vector",
        # a dilation by a product of indices, a window read through a table
        "def f(float16(N, C, H) I, float16(M, C, KH) Wt) -> (O) "
        "{ O(n, m, h) +=! I(n, c, h * kh) * Wt(m, c, kh) where h in 0:2 }": "affine indices",
        "def f(float16(N, C, H) I, float16(M, C, KH) Wt, int32(KH) P) -> (O) "
        "{ O(n, m, h) +=! I(n, c, h + P(kh)) * Wt(m, c, kh) where h in 0:2 }": "affine indices",
        # float32 without TF32 on request
        "def f(float(N, C, H) I, float(M, C, KH) Wt) -> (O) "
        "{ O(n, m, h) +=! I(n, c, h + kh) * Wt(m, c, kh) }": "precision='tf32'",
    }
    for src, why in cases.items():
        fn = tc.define(src, target="cuda")
        plan = contraction_plan(fn.ir, {s: 3 for s in fn.ir.sizes})
        assert isinstance(plan, str) and why in plan, (src, plan)


# ---------------------------------------------------------------- whole kernels, host machine

MMA_SYNC = tc.MappingOptions.naive().tensor_cores((64, 32, 16), (2, 1), 3)
GUARD = 64  # elements of NaN (inputs) or sentinel (outputs) on each side: 128-byte aligned


def _guarded(shape, dtype, fill) -> tuple[np.ndarray, np.ndarray]:
    size = int(np.prod(shape))
    buf = np.full(size + 2 * GUARD, fill, dtype)
    return buf, buf[GUARD:GUARD + size].reshape(shape)


def _run_on_host(src, sizes, options=MMA_SYNC, seed=7):
    """Compile for sm_90 and run every block on the host machine against the reference,
    with NaN before and after every input and a sentinel around every output."""
    rng = np.random.default_rng(seed)
    fn = tc.define(src, target="cuda")
    inputs, bufs = [], {}
    for t in fn.ir.inputs:
        shape = tuple(s.evaluate(sizes) for s in t.shape)
        bufs[t.name], view = _guarded(shape, t.dtype.numpy, np.nan)
        view[...] = rng.integers(-3, 4, shape).astype(t.dtype.numpy)
        inputs.append(view)
    kernel = fn.compile(*inputs, target="cuda", arch="sm_90", options=options)
    assert "mma S0" in kernel.schedule
    arrays = {t.name: x for t, x in zip(fn.ir.inputs, inputs, strict=True)}
    for t in fn.ir.tensors:
        if t.name not in arrays:
            bufs[t.name], arrays[t.name] = _guarded(tuple(s.evaluate(sizes) for s in t.shape),
                                                   t.dtype.numpy, 77)
    emu.run_kernel(kernel, arrays, sizes)
    want = tc.define(src, target="numpy")(*inputs)
    want = want if isinstance(want, tuple) else (want,)
    for t, w in zip(fn.ir.outputs, want, strict=True):
        np.testing.assert_array_equal(arrays[t.name].astype(np.float64), np.asarray(w, np.float64),
                                      err_msg=f"{t.name} of {src}")
        guard = bufs[t.name]
        assert (guard[:GUARD] == 77).all() and (guard[-GUARD:] == 77).all(), "a store past the output"
    return kernel


CASES = [("nchw", s) for s in SHAPES] + [("nhwc", s) for s in SHAPES] + [
    ("nchw-stride2", "3x3"), ("nchw-stride2", "3x3-c16"), ("nhwc-stride2", "3x3-c16"),
    ("nhwc-hwio", "3x3-c16"), ("nchw-flipped", "3x3"), ("nchw-f32out", "3x3"),
    ("nhwc-bf16-f32out", "3x3-c16"), ("nchw-bf16", "1x1-odd"), ("nchw-dilated", "3x3-wide")]


@pytest.mark.filterwarnings("ignore::tcmlir.PreconditionWarning")
@pytest.mark.parametrize("name, shape", CASES)
def test_convolutions_on_the_host_machine(name, shape):
    src = CONVS[name]
    if "bfloat16" in src:
        pytest.importorskip("ml_dtypes")
    _run_on_host(src, _sizes(src, SHAPES[shape]))


@st.composite
def _random_convs(draw):
    """A random valid convolution: layout, filter layout, stride, dilation, dtype, sizes."""
    last = draw(st.booleans())
    s, d = draw(st.sampled_from([1, 2])), draw(st.sampled_from([1, 2]))
    k = draw(st.sampled_from([1, 2, 3]))
    dtype = draw(st.sampled_from(["float16", "bfloat16"]))
    hw = f"{s} * h + {d} * kh, {s} * w + {d} * kw"
    inp = f"I(n, {hw}, c)" if last else f"I(n, c, {hw})"
    wt = draw(st.sampled_from(["Wt(m, c, kh, kw)", "Wt(m, kh, kw, c)", "Wt(kh, kw, c, m)"]))
    dims = {"m": "M", "c": "C", "kh": "KH", "kw": "KW"}
    wdims = ", ".join(dims[i] for i in wt[3:-1].split(", "))
    idims = "N, H, W, C" if last else "N, C, H, W"
    out = "O(n, h, w, m)" if last else "O(n, m, h, w)"
    src = (f"def conv({dtype}({idims}) I, {dtype}({wdims}) Wt) -> (O) "
           f"{{ {out} +=! {inp} * {wt} }}")
    span = d * (k - 1) + 1
    sizes = {"N": draw(st.integers(1, 2)), "C": draw(st.integers(1, 17)), "M": draw(st.integers(1, 40)),
             "H": span + draw(st.integers(0, 8)), "W": span + draw(st.integers(0, 12)), "KH": k, "KW": k}
    return src, sizes


@settings(max_examples=16, deadline=None, derandomize=True,
          suppress_health_check=[HealthCheck.too_slow])
@given(case=_random_convs())
def test_random_convolutions_on_the_host_machine(case):
    src, sizes = case
    if "bfloat16" in src:
        pytest.importorskip("ml_dtypes")
    _run_on_host(src, sizes)


def test_default_like_tiles_and_several_tiles_per_block_on_the_host_machine():
    """128 x 64 tiles of 2 x 2 warps over a 3x3 NHWC convolution whose rows (n, h, w) and
    steps (kh, kw, c) the tiles cut across images and filter rows; the staged epilogue."""
    opts = tc.MappingOptions.naive().tensor_cores((128, 64, 32), (2, 2), 2)
    _run_on_host(NHWC, _sizes(NHWC, (2, 16, 9, 10, 64, 3)), opts)


def test_a_read_past_the_last_reduction_step_is_caught(monkeypatch):
    """A planted bug: copies that take the steps past the last (c, kh, kw) = K as real ones
    read the next filter's weights, and past the input's end its NaN guard. (Rows past the
    end are zero-filled too: `test_mma_host.test_copies_of_convolutions` checks the tiles.)"""
    real = MmaEmitter.copy_chunk

    def unguarded(self, buf, c, r0, k0, stage):
        sizes = self.sizes
        self.sizes = {**sizes, self.plan.k: sizes[self.plan.k] + 16}
        try:
            real(self, buf, c, r0, k0, stage)
        finally:
            self.sizes = sizes

    monkeypatch.setenv("TCMLIR_ALWAYS_COMPILE", "1")
    monkeypatch.setattr(MmaEmitter, "copy_chunk", unguarded)
    with pytest.raises(AssertionError, match="not equal"):
        _run_on_host(NCHW, _sizes(NCHW, SHAPES["3x3"]))


def test_a_group_taken_for_one_dimension_is_caught(monkeypatch):
    """A planted bug: the input's rows (n, h, w) addressed as if they were one flattened
    dimension (only their innermost run's stride)."""
    from tcmlir.poly import contraction

    def one_run(self, index, strides):
        return segments(self.members(index), dict(strides), dict(self.extents))[:1]

    monkeypatch.setenv("TCMLIR_ALWAYS_COMPILE", "1")
    monkeypatch.setattr(contraction.ContractionPlan, "segments", one_run)
    with pytest.raises(AssertionError, match="not equal"):
        _run_on_host(NHWC, _sizes(NHWC, SHAPES["3x3-c16"]))


def test_one_tensor_read_as_both_operands_in_a_batch_on_the_host_machine():
    """``X`` times its own transpose per batch entry: each operand's batch offset is its own
    (they once shared one entry, keyed by the tensor, which took the batch stride twice)."""
    src = ("def gram(float16(Bt, N, K) X) -> (Z) "
           "{ Z(b, n, m) +=! X(b, n, k) * X(b, m, k) }")
    _run_on_host(src, {"Bt": 3, "N": 9, "K": 24})


# ---------------------------------------------------------------- PTX


@needs_ptxas
@pytest.mark.filterwarnings("ignore::tcmlir.PreconditionWarning")
@pytest.mark.parametrize("name, shape", [
    ("nchw", (64, 128, 28, 28, 128, 3)), ("nhwc", (64, 128, 28, 28, 128, 3)),
    ("nchw-stride2", (2, 5, 9, 11, 6, 3)), ("nhwc-hwio", (2, 16, 7, 9, 24, 3)),
    ("nchw-f32out", (2, 5, 7, 9, 6, 1)), ("nhwc-bf16-f32out", (2, 12, 7, 9, 24, 3))])
@pytest.mark.parametrize("engine", ["default", "mma.sync", "wgmma"])
def test_convolutions_assemble(name, shape, engine, tmp_path):
    src = CONVS[name]
    fn = tc.define(src, target="cuda")
    sizes = _sizes(src, shape)
    options = {"default": tc.MappingOptions.default_for(fn, "cuda", sizes),
               "mma.sync": tc.MappingOptions.naive().tensor_cores((128, 128, 32), (2, 2), 4),
               "wgmma": tc.MappingOptions.naive().tensor_cores((128, 128, 64), (8, 1), 3, wgmma=True)}
    kernel = _compile_at(fn, sizes, options[engine])
    assert "mma S0" in kernel.schedule
    wgmma = "wgmma.mma_async" in kernel.ptx
    assert wgmma == (engine == "wgmma") or engine == "default"
    info = ptxas_verbose(tmp_path, kernel.ptx, name, arch="sm_90a" if wgmma else "sm_90")
    assert " 0 bytes spill stores" in info, info


def _compile_at(fn, sizes, options):
    inputs = [np.zeros(tuple(s.evaluate(sizes) for s in t.shape), t.dtype.numpy) for t in fn.ir.inputs]
    return fn.compile(*inputs, target="cuda", arch="sm_90", options=options)


# ---------------------------------------------------------------- on the GPU


def _check_on_gpu(src, sizes, rng, options=None):
    fn = tc.define(src, target="cuda")
    arrays = [rng.integers(-3, 4, tuple(s.evaluate(sizes) for s in t.shape)).astype(t.dtype.numpy)
              for t in fn.ir.inputs]
    kernel = fn.compile(*arrays, options=options)
    assert "mma S0" in kernel.schedule, "planned on tensor cores"
    got = fn(*arrays, options=options)
    want = tc.define(src, target="numpy")(*arrays)
    # integer-valued inputs: the float32 sums are exact; one rounding to the output type
    np.testing.assert_allclose(np.asarray(got, np.float64), np.asarray(want, np.float64),
                               rtol=1e-2 if np.asarray(got).dtype != np.float32 else 1e-6)


@pytest.mark.gpu
@pytest.mark.filterwarnings("ignore::tcmlir.PreconditionWarning")
@pytest.mark.parametrize("name, shape", CASES)
@pytest.mark.parametrize("engine", ["default", "mma.sync", "wgmma"])
def test_convolutions_on_gpu(name, shape, engine, rng):
    src = CONVS[name]
    if "bfloat16" in src:
        pytest.importorskip("ml_dtypes")
    options = {"default": None, "mma.sync": MMA_SYNC,
               "wgmma": tc.MappingOptions.naive().tensor_cores((128, 128, 64), (8, 1), 3, wgmma=True)}
    _check_on_gpu(src, _sizes(src, SHAPES[shape]), rng, options[engine])


@pytest.mark.gpu
@pytest.mark.parametrize("src", [NCHW, NHWC], ids=["nchw", "nhwc"])
def test_target_convolution_on_gpu(src, rng):
    """The issue's fp16 3x3 convolution, 64x128x28x28 -> 128 channels, default options,
    against numpy's im2col product (float32: exact for these small integers)."""
    fn = tc.define(src, target="cuda")
    sizes = _sizes(src, (64, 128, 28, 28, 128, 3))
    i, w = (rng.integers(-3, 4, tuple(s.evaluate(sizes) for s in t.shape)).astype(np.float16)
            for t in fn.ir.inputs)
    kernel = fn.compile(i, w)
    assert "mma S0" in kernel.schedule, "planned on tensor cores"
    got = np.asarray(fn(i, w), np.float64)
    last = src == NHWC
    win = np.lib.stride_tricks.sliding_window_view(i.astype(np.float32), (3, 3),
                                                   axis=(1, 2) if last else (2, 3))
    # NCHW windows [n, c, h, w, kh, kw] with Wt [m, c, kh, kw]; NHWC [n, h, w, c, kh, kw]
    # with Wt [m, kh, kw, c]
    want = (np.einsum("nhwcij,mijc->nhwm", win, w.astype(np.float32), optimize=True) if last
            else np.einsum("nchwij,mcij->nmhw", win, w.astype(np.float32), optimize=True))
    np.testing.assert_allclose(got, want.astype(np.float16).astype(np.float64), rtol=1e-3)
