"""Tensor-core kernel pieces run on the host, as the code generator emits them.

* The operand copies: the LLVM IR that `codegen/gpu_mma.MmaEmitter.load_stage` (and
  `WgmmaEmitter`'s) emits for one ring slot, with the address spaces dropped and ``cp.async``
  replaced by a host function that checks its alignment and zero-fills past its source size,
  JIT-compiled and run for every thread of the block; the slot must then hold the swizzled
  tile of the operand (`mma_layout.swizzled_offset`), zero past every end. So copy widths,
  partial copies at the edges, element loads of odd strides, index groups, batch offsets and
  TF32's two 16-bit units per element are checked for the code the GPU runs.
* The warps' reduction step: `MmaEmitter.compute` (16-bit and TF32 fragments) run by every
  thread of a block at once, ``ldmatrix`` and ``mma`` emulated by the documented layouts
  across the 32 lanes of each warp; the accumulators must be the tile's exact product.
* Whole kernels: what ``fn.compile(..., target="cuda", arch="sm_90")`` produces, every block
  run on the host machine of `tests/mma_emulator.py`, against the reference interpreter —
  every layout, bf16 with a float32 output, batches, index groups, strided operands, fused
  epilogues, TF32, unaligned inputs, awkward sizes.

Planted bugs (a copy too wide, a missing zero-fill, a wrong fragment address, a wrong
accumulator layout in the epilogue) fail them."""

from __future__ import annotations

import ctypes
import dataclasses
from dataclasses import dataclass, field
from typing import Any

import mma_emulator as emu
import numpy as np
import pytest
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st
from llvmlite import ir

import tcmlir as tc
from tcmlir.codegen.gpu_mma import MmaEmitter
from tcmlir.codegen.gpu_wgmma import WgmmaEmitter
from tcmlir.codegen.mma_ir import F32, I32, I64, IntV
from tcmlir.codegen.mma_layout import a_element_tf32, c_element, lane_row_address, swizzled_offset
from tcmlir.compiler import compile_kernel
from tcmlir.poly.contraction import MmaMark, contraction_plan
from tcmlir.signature import ArgSpec, Signature, pointer_alignment

_COPY_FN = ctypes.CFUNCTYPE(None, ctypes.c_int32, ctypes.c_int64, ctypes.c_int64, ctypes.c_int64,
                            ctypes.c_int32, ctypes.c_int64, ctypes.c_void_p, ctypes.c_void_p)


@dataclass
class _Owner:
    aligned: frozenset[str]
    kernel_shared_bytes: int = 0
    needs_sm90a: bool = False


@dataclass
class _Walker:  # what MmaEmitter reads of the NVPTX walker
    fn: Any
    llfn: Any
    builder: ir.IRBuilder
    entry: ir.IRBuilder
    owner: _Owner
    pointers: dict[str, ir.Value] = field(default_factory=dict)

    def pointer(self, name: str) -> ir.Value:
        return self.pointers[name]


def _copy_kernel(src: str, sizes: dict[str, int], tile, warps, stages, tf32: bool, aligned: bool,
                 edit=None, wgmma=False):
    """JIT ``copy(tid, kt, m0, n0, stage, batch, a, b)``: one thread's copies of step ``kt``
    (``edit``: a change to the plan, for planted bugs)."""
    fn = tc.define(src, target="cuda")
    plan = contraction_plan(fn.ir, sizes, tf32=tf32)
    assert not isinstance(plan, str), plan
    plan = edit(plan) if edit else plan
    mod = ir.Module("copies")
    glob = ir.PointerType(addrspace=1)
    llfn = ir.Function(mod, ir.FunctionType(ir.VoidType(), [I32, I64, I64, I64, I32, I64, glob, glob]),
                       "copy")
    entry = ir.IRBuilder(llfn.append_basic_block("entry"))
    body = llfn.append_basic_block("body")
    b = ir.IRBuilder(body)
    tid, kt, m0, n0, stage, batch, pa, pb = llfn.args
    names = (plan.a.tensor, plan.b.tensor)
    walker = _Walker(fn.ir, llfn, b, entry, _Owner(frozenset(names) if aligned else frozenset()),
                     {names[0]: pa, names[1]: pb})
    emitter = WgmmaEmitter if wgmma else MmaEmitter
    em = emitter(walker, plan, MmaMark(0, tile, warps, stages, (1, 1, 1), wgmma, tf32))
    em.tid = IntV(b, tid)
    em.batch_offsets(batch)
    em.load_stage(stage, kt, m0, n0)
    b.ret_void()
    entry.branch(body)  # (after the allocas the emitter put in the entry block)
    engine = emu.jit(emu.host_ir(str(mod)))
    return fn, plan, em, engine


def _slot(logical: np.ndarray, k_major: bool, r0: int, k0: int, buf, units: int) -> np.ndarray:
    """The 16-bit units a ring slot must hold: ``logical[rows][K]``'s tile, zero past the ends,
    stored ``[rows][k]`` (k-major) or ``[k][rows]``, swizzled (wgmma's MN-major tiles: in
    atoms of ``buf.atom`` columns, one after the other, each swizzled as its own tile)."""
    cols = buf.row_len // units
    tile = np.zeros((buf.rows, cols), logical.dtype)
    rows, k_ext = logical.shape
    for s in range(buf.rows):
        for c in range(cols):
            r, k = (r0 + s, k0 + c) if k_major else (r0 + c, k0 + s)
            if r < rows and k < k_ext:
                tile[s, c] = logical[r, k]
    units16 = tile.view(np.uint16).reshape(buf.rows, buf.row_len)
    flat = np.zeros(buf.rows * buf.row_len, np.uint16)
    for s in range(buf.rows):
        for c in range(buf.row_len):
            if buf.atom:
                at = (c // buf.atom) * buf.rows * buf.atom + swizzled_offset(s, c % buf.atom, buf.atom)
            else:
                at = swizzled_offset(s, c, buf.row_len)
            flat[at] = units16[s, c]
    return flat


def _check_copies(src, sizes, logical, *, tile=(64, 64, 32), warps=(2, 2), stages=2, tf32=False,
                  aligned=True, batches=(0,), rng=None, edit=None, wgmma=False):
    """Every tile of every block at reduction steps 0 and 1 (and the last): the ring slots
    against `_slot`; no misaligned or oversized cp.async."""
    rng = rng or np.random.default_rng(0)
    fn, plan, em, engine = _copy_kernel(src, sizes, tile, warps, stages, tf32, aligned, edit, wgmma)
    dtype = np.float32 if tf32 else np.float16
    arrays = {t.name: rng.integers(1, 100, tuple(s.evaluate(sizes) for s in t.shape)).astype(dtype)
              for t in fn.ir.inputs}  # no zeros: a missing zero-fill shows
    copy = _COPY_FN(engine.get_function_address("copy"))
    ring_at = engine.get_global_value_address("copy.mma_ring")
    total = stages * sum(buf.elems for buf in em.bufs)
    ring = np.frombuffer((ctypes.c_uint16 * total).from_address(ring_at), np.uint16)
    bm, bn, bk = tile
    steps = -(-plan.extent(plan.k) // bk)
    del emu.VIOLATIONS[:]
    for batch in batches:
        mats = logical(arrays, batch)
        for tm in range(-(-plan.extent(plan.m) // bm)):
            for tn in range(-(-plan.extent(plan.n) // bn)):
                for kt in sorted({0, min(1, steps - 1), steps - 1}):
                    ctypes.memset(ring_at, 0xAB, total * 2)
                    for tid in range(32 * warps[0] * warps[1]):
                        copy(tid, kt, tm * bm, tn * bn, kt % stages, batch,
                             arrays[plan.a.tensor].ctypes.data, arrays[plan.b.tensor].ctypes.data)
                    start = 0
                    for buf, r0 in zip(em.bufs, (tm * bm, tn * bn), strict=True):
                        want = _slot(mats[buf.operand.tensor], buf.operand.k_major, r0, kt * bk,
                                     buf, em.units)
                        at = start + (kt % stages) * buf.elems
                        got = ring[at:at + buf.elems]
                        assert np.array_equal(got, want), (
                            f"{buf.operand.tensor}: tile {tm},{tn}, step {kt}, batch {batch}: "
                            f"units {np.flatnonzero(got != want)[:8]} differ")
                        start += stages * buf.elems
    assert not emu.VIOLATIONS, f"misaligned or oversized cp.async: {emu.VIOLATIONS[:4]}"
    return plan


NN = "def f(float16(M, K) A, float16(K, N) B) -> (C) { C(m, n) +=! A(m, k) * B(k, n) }"
TT = "def f(float16(K, M) A, float16(N, K) B) -> (C) { C(m, n) +=! A(k, m) * B(n, k) }"
LOGICAL = {  # each operand as [rows][K]
    NN: lambda a, _: {"A": a["A"], "B": a["B"].T},
    TT: lambda a, _: {"A": a["A"].T, "B": a["B"]},
}
SIZES = [(7, 15, 17), (100, 33, 30), (64, 36, 20), (1, 1, 1), (70, 72, 72), (33, 100, 15)]


@pytest.mark.parametrize("src", [NN, TT], ids=["nn", "tt"])
@pytest.mark.parametrize("mnk", SIZES)
@pytest.mark.parametrize("aligned", [True, False])
def test_copies_of_awkward_sizes(src, mnk, aligned):
    m, n, k = mnk
    _check_copies(src, {"M": m, "N": n, "K": k}, LOGICAL[src], aligned=aligned)


@pytest.mark.parametrize("src", [NN, TT], ids=["nn", "tt"])
@pytest.mark.parametrize("mnk", [(7, 15, 17), (100, 33, 30), (70, 72, 130)])
def test_wgmma_copies(src, mnk):
    m, n, k = mnk
    _check_copies(src, {"M": m, "N": n, "K": k}, LOGICAL[src], tile=(64, 64, 64), warps=(4, 1),
                  stages=3, wgmma=True)


@pytest.mark.parametrize("src", [NN, TT], ids=["nn", "tt"])
@pytest.mark.parametrize("mnk", [(7, 15, 17), (100, 33, 30), (70, 72, 72)])
def test_tf32_copies(src, mnk):
    m, n, k = mnk
    f32 = src.replace("float16", "float")
    _check_copies(f32, {"M": m, "N": n, "K": k}, lambda a, b: LOGICAL[src](a, b), tf32=True)


def test_copies_of_index_groups():
    xw = ("def f(float16(M, N0, N1, R) X, float16(D, R) W) -> (XW) "
          "{ XW(m, n0, n1, d) +=! X(m, n0, n1, r) * W(d, r) }")
    plan = _check_copies(xw, {"M": 3, "N0": 5, "N1": 7, "R": 30, "D": 33},
                         lambda a, _: {"X": a["X"].reshape(-1, 30), "W": a["W"]})
    assert plan.members(plan.m) == ("m", "n0", "n1")
    two_k = ("def f(float16(M, K0, K1) A, float16(K0, K1, N) B) -> (C) "
             "{ C(m, n) +=! A(m, k0, k1) * B(k0, k1, n) }")
    plan = _check_copies(two_k, {"M": 33, "N": 17, "K0": 3, "K1": 11},
                         lambda a, _: {"A": a["A"].reshape(33, -1), "B": a["B"].reshape(-1, 17).T})
    assert plan.members(plan.k) == ("k0", "k1")


def test_copies_of_reduction_indices_apart_in_memory():
    src = ("def f(float16(M, K0, K1) A, float16(K0, N, K1) B) -> (C) "
           "{ C(m, n) +=! A(m, k0, k1) * B(k0, n, k1) }")
    plan = _check_copies(src, {"M": 33, "N": 17, "K0": 3, "K1": 11}, lambda a, _: {
        "A": a["A"].reshape(33, -1), "B": a["B"].transpose(1, 0, 2).reshape(17, -1)})
    assert plan.b.k_scattered and plan.b.copy == 1
    src = ("def f(float16(M, K0, K1) A, float16(K1, K0, N) B) -> (C) "
           "{ C(m, n) +=! A(m, k0, k1) * B(k1, k0, n) }")
    plan = _check_copies(src, {"M": 33, "N": 24, "K0": 3, "K1": 11}, lambda a, _: {
        "A": a["A"].reshape(33, -1), "B": a["B"].transpose(1, 0, 2).reshape(-1, 24).T})
    assert plan.b.k_scattered and plan.b.copy == 8  # rows of B stay 16-byte copies


def test_copies_of_batch_entries_and_operands_without_a_contiguous_dimension():
    batched = ("def f(float16(Bt, N, K) X, float16(Bt, M, K) Y) -> (Z) "
               "{ Z(b, n, m) +=! X(b, n, k) * Y(b, m, k) }")
    _check_copies(batched, {"K": 30, "M": 17, "N": 9, "Bt": 3},
                  lambda a, b: {"X": a["X"][b], "Y": a["Y"][b]}, batches=(0, 2))
    strided = ("def f(float16(K, M, Bt) A, float16(K, N, Bt) B) -> (C) "
               "{ C(b, m, n) +=! A(k, m, b) * B(k, n, b) }")
    _check_copies(strided, {"K": 33, "M": 17, "N": 7, "Bt": 3},
                  lambda a, b: {"A": a["A"][:, :, b].T, "B": a["B"][:, :, b].T}, batches=(0, 2))


def _im2col(x: np.ndarray, channels_last: bool, k: int, stride: int) -> np.ndarray:
    """[n, h, w][c, kh, kw] (NCHW) or [n, h, w][kh, kw, c] (NHWC) windows of ``x``, built
    by numpy (not from the plan)."""
    axes = (1, 2) if channels_last else (2, 3)
    win = np.lib.stride_tricks.sliding_window_view(x, (k, k), axis=axes)
    win = win[:, ::stride, ::stride] if channels_last else win[:, :, ::stride, ::stride]
    win = win.transpose(0, 1, 2, 4, 5, 3) if channels_last else win.transpose(0, 2, 3, 1, 4, 5)
    return win.reshape(win.shape[0] * win.shape[1] * win.shape[2], -1)


CONV = ("def conv(float16(N, C, H, W) I, float16(M, C, KH, KW) Wt) -> (O) "
        "{ O(n, m, h, w) +=! I(n, c, h + kh, w + kw) * Wt(m, c, kh, kw) }")
CONV_NHWC = ("def conv(float16(N, H, W, C) I, float16(M, KH, KW, C) Wt) -> (O) "
             "{ O(n, h, w, m) +=! I(n, h + kh, w + kw, c) * Wt(m, kh, kw, c) }")


@pytest.mark.parametrize("src, c, k, stride, w, widths", [
    (CONV, 5, 3, 1, 9, (1, 1)), (CONV, 12, 1, 1, 8, (4, 8)),  # 1x1: rows (h, w) runs of 7 x 8
    (CONV, 5, 3, 1, 12, (1, 1)), (CONV_NHWC, 5, 3, 1, 12, (1, 1)),  # runs of 10 and 15
    (CONV.replace("h + kh, w + kw", "2 * h + kh, 2 * w + kw"), 5, 3, 2, 9, (1, 1)),
    (CONV_NHWC, 16, 3, 1, 9, (8, 8)), (CONV_NHWC, 12, 3, 1, 9, (4, 4)),
    (CONV_NHWC, 6, 1, 1, 9, (2, 2)),
    (CONV_NHWC.replace("h + kh, w + kw", "2 * h + kh, 2 * w + kw"), 8, 3, 2, 9, (8, 8)),
], ids=["nchw", "nchw-1x1", "nchw-w12", "nhwc-w12", "nchw-stride2", "nhwc", "nhwc-c12", "nhwc-1x1",
        "nhwc-stride2"])
def test_copies_of_convolutions(src, c, k, stride, w, widths):
    """Implicit-GEMM tiles (rows n, h, w; steps over the window): every slot holds the
    numpy-built im2col tile, zero past the last row and step (nothing past them read)."""
    last = "(N, H, W, C) I" in src
    sizes = {"N": 2, "C": c, "H": 7, "W": w, "M": 6, "KH": k, "KW": k}
    plan = _check_copies(src, sizes, lambda a, _: {
        "I": _im2col(a["I"], last, k, stride), "Wt": a["Wt"].reshape(6, -1)}, tile=(64, 32, 16),
        warps=(2, 1))
    assert plan.members(plan.m if plan.a.tensor == "I" else plan.n) == ("n", "h", "w")
    ops = {op.tensor: op for op in (plan.a, plan.b)}
    assert (ops["Wt"].copy, ops["I"].copy) == widths


@pytest.mark.parametrize("src, c, channels_last", [(CONV, 5, False), (CONV_NHWC, 16, True)],
                         ids=["nchw", "nhwc"])
def test_wgmma_copies_of_convolutions(src, c, channels_last):
    """wgmma's tiles (the input's rows, contiguous along w in NCHW: MN-major atoms)."""
    _check_copies(src, {"N": 2, "C": c, "H": 7, "W": 12, "M": 6, "KH": 3, "KW": 3},
                  lambda a, _: {"I": _im2col(a["I"], channels_last, 3, 1), "Wt": a["Wt"].reshape(6, -1)},
                  tile=(64, 64, 64), warps=(4, 1), stages=3, wgmma=True)


def test_a_copy_too_wide_for_the_strides_is_caught():
    """A planted bug: 16-byte copies of rows 60 bytes apart (K = 30) misalign."""
    def wide(plan):
        return dataclasses.replace(plan, a=dataclasses.replace(plan.a, copy=8))

    with pytest.raises(AssertionError, match="misaligned"):
        _check_copies(NN, {"M": 16, "N": 16, "K": 30}, LOGICAL[NN], edit=wide)


def test_a_missing_zero_fill_is_caught(monkeypatch):
    """A planted bug: copies that always read their full width (no shorter source size at
    the end of a row) put the next row's elements where zeros belong."""
    real = MmaEmitter.copy_chunk

    def full_rows(self, buf, c, r0, k0, stage):
        sizes = self.sizes
        self.sizes = {**sizes, self.plan.k: -(-sizes[self.plan.k] // 8) * 8}
        try:
            real(self, buf, c, r0, k0, stage)
        finally:
            self.sizes = sizes

    monkeypatch.setattr(MmaEmitter, "copy_chunk", full_rows)
    with pytest.raises(AssertionError, match="differ"):
        _check_copies(NN, {"M": 16, "N": 16, "K": 12}, LOGICAL[NN])


# ---------------------------------------------------------------- the warps' reduction step
#
# `MmaEmitter.compute` for one ring slot, run on the host by every thread of a block at once
# (one OS thread each): ``ldmatrix`` and ``mma`` become calls into Python that wait for the
# 32 lanes of the warp, then give each lane its registers by the documented layouts
# (`mma_layout`: `ldmatrix_element`, `a_element`, `b_element`, `c_element` and the TF32 ones).

def _compute_kernel(src, sizes, tile, warps, tf32):
    """JIT ``compute(tid, stage, out)``: one thread's reduction step on ring slot ``stage``
    from zero accumulators, which it then writes to ``out[tid * n + i]``."""
    fn = tc.define(src, target="cuda")
    plan = contraction_plan(fn.ir, sizes, tf32=tf32)
    assert not isinstance(plan, str), plan
    mod = ir.Module("compute")
    llfn = ir.Function(mod, ir.FunctionType(ir.VoidType(), [I32, I32, ir.PointerType()]), "compute")
    entry = ir.IRBuilder(llfn.append_basic_block("entry"))
    body = llfn.append_basic_block("body")
    b = ir.IRBuilder(body)
    tid, stage, out = llfn.args
    walker = _Walker(fn.ir, llfn, b, entry, _Owner(frozenset()), {})
    em = MmaEmitter(walker, plan, MmaMark(0, tile, warps, 2, (1, 1, 1), False, tf32))
    em.tid = IntV(b, tid)
    em.lane = em.tid % 32
    n = em.mi * em.ni * 4
    em.acc = entry.alloca(F32, size=n)
    for i in range(n):
        b.store(ir.Constant(F32, 0.0), em.slot_acc(i))
    em.compute(IntV(b, stage))
    base = b.mul(tid, ir.Constant(I32, n))
    for i in range(n):
        at = b.gep(out, [b.add(base, ir.Constant(I32, i))], source_etype=F32)
        b.store(b.load(em.slot_acc(i), typ=F32), at)
    b.ret_void()
    entry.branch(body)
    engine = emu.jit(emu.host_ir(str(mod)))
    return fn, plan, em, engine


def _check_compute(src, tile, warps, tf32=False, rng=None):
    rng = rng or np.random.default_rng(1)
    bm, bn, bk = tile
    sizes = {"M": bm, "N": bn, "K": bk}
    _, _, em, engine = _compute_kernel(src, sizes, tile, warps, tf32)
    dtype = np.float32 if tf32 else np.float16
    if "bfloat16" in src:
        dtype = pytest.importorskip("ml_dtypes").bfloat16
    a = rng.integers(-8, 8, (bm, bk)).astype(dtype)   # [rows][K], small integers: exact
    bt = rng.integers(-8, 8, (bn, bk)).astype(dtype)
    ring_at = engine.get_global_value_address("compute.mma_ring")
    stage, start = 1, 0
    for buf, mat in zip(em.bufs, (a, bt), strict=True):
        slot = _slot(mat, buf.operand.k_major, 0, 0, buf, em.units)
        at = ring_at + 2 * (start + stage * buf.elems)
        ctypes.memmove(at, slot.ctypes.data, slot.nbytes)
        start += 2 * buf.elems  # (two stages)
    threads = 32 * warps[0] * warps[1]
    n = em.mi * em.ni * 4
    out = np.full(threads * n, np.nan, np.float32)
    run = ctypes.CFUNCTYPE(None, ctypes.c_int32, ctypes.c_int32, ctypes.c_void_p)(
        engine.get_function_address("compute"))
    emu.run_threads(emu.Block(threads), lambda t: run(t, stage, out.ctypes.data))
    want = a.astype(np.float64) @ bt.astype(np.float64).T
    got = np.full((bm, bn), np.nan)
    wm_rows, wn_cols = bm // warps[0], bn // warps[1]
    for t in range(threads):
        wm, wn = divmod(t // 32, warps[1])
        for mi in range(em.mi):
            for ni in range(em.ni):
                for reg in range(4):
                    r, c = c_element(t % 32, reg)
                    got[wm * wm_rows + mi * 16 + r, wn * wn_cols + ni * 8 + c] = \
                        out[t * n + (mi * em.ni + ni) * 4 + reg]
    np.testing.assert_array_equal(got, want)


NT = "def f(float16(M, K) A, float16(N, K) B) -> (C) { C(m, n) +=! A(m, k) * B(n, k) }"
TN = "def f(float16(K, M) A, float16(K, N) B) -> (C) { C(m, n) +=! A(k, m) * B(k, n) }"


@pytest.mark.parametrize("src", [NN, NT, TN, TT], ids=["nn", "nt", "tn", "tt"])
@pytest.mark.parametrize("precision", ["half", "tf32"])
def test_reduction_step_on_host_warps(src, precision):
    tf32 = precision == "tf32"
    _check_compute(src.replace("float16", "float") if tf32 else src, (64, 32, 32), (2, 1), tf32)


def test_reduction_step_bf16_on_host_warps():
    src = NN.replace("float16", "bfloat16").replace("-> (C)", "-> (float(M, N) C)")
    _check_compute(src, (32, 32, 16), (1, 2))


@pytest.mark.parametrize("precision", ["half", "tf32"])
@pytest.mark.parametrize("src", [NN, TT], ids=["nn", "tt"])
def test_a_wrong_fragment_address_is_caught(src, precision, monkeypatch):
    """A planted bug: the A fragment's lanes point at each other's rows (k-major: ldmatrix
    addresses; TF32 row-major: the elements each lane reads)."""
    from tcmlir.codegen import gpu_mma, mma_tf32

    def wrong(lane, operand, k_major):
        r, c = lane_row_address(lane, operand, k_major)
        return (r ^ 1, c) if operand == "a" else (r, c)

    monkeypatch.setattr(gpu_mma, "lane_row_address", wrong)
    monkeypatch.setattr(mma_tf32, "lane_row_address", wrong)
    monkeypatch.setattr(mma_tf32, "a_element_tf32", lambda lane, reg: a_element_tf32(lane, reg ^ 1))
    tf32 = precision == "tf32"
    with pytest.raises(AssertionError, match="not equal"):
        _check_compute(src.replace("float16", "float") if tf32 else src, (64, 32, 32), (2, 1), tf32)


# ---------------------------------------------------------------- whole kernels

# (test_mma_shapes' programs) every layout and form, groups, fused epilogues, TF32
NT = "def f(float16(M, K) A, float16(N, K) B) -> (C) { C(m, n) +=! A(m, k) * B(n, k) }"
KERNELS = {
    "nn": NN, "nt": NT, "tn": TN, "tt": TT,
    "bf16-f32out": NN.replace("float16", "bfloat16").replace("-> (C)", "-> (float(M, N) C)"),
    "batched": "def f(float16(Bt, N, K) X, float16(Bt, M, K) Y) -> (Z) "
               "{ Z(b, n, m) +=! X(b, n, k) * Y(b, m, k) }",
    "rows": "def f(float16(M, N0, N1, K) X, float16(N, K) W) -> (XW) "
            "{ XW(m, n0, n1, d) +=! X(m, n0, n1, r) * W(d, r) }",
    "two-k": "def f(float16(M, K0, K) A, float16(K0, K, N) B) -> (C) "
             "{ C(m, n) +=! A(m, k0, k1) * B(k0, k1, n) }",
    "cols-t": "def f(float16(K, M) A, float16(K, N0, N) B) -> (C) "
              "{ C(m, n0, n1) +=! A(k, m) * B(k, n0, n1) }",
    "strided": "def f(float16(K, M, Bt) A, float16(K, N, Bt) B) -> (C) "
               "{ C(b, m, n) +=! A(k, m, b) * B(k, n, b) }",
    "linear": """def lin(float16(M, K) I, float16(N, K) W, float16(N) bias) -> (O) {
    O(b, n) +=! I(b, k) * W(n, k)
    O(b, n) = O(b, n) + bias(n)
    O(b, n) = fmax(O(b, n), 0)
}""",
    "linear-f32": """def lin(bfloat16(M, K) I, bfloat16(K, N) W, float(N) bias, float(M) s) -> (float(M, N) O) {
    O(i, j) +=! I(i, k) * W(k, j)
    O(i, j) = O(i, j) * s(i) + bias(j)
}""",
    "k-swapped": "def f(float16(M, K0, K) A, float16(K, K0, N) B) -> (C) "
                 "{ C(m, n) +=! A(m, k0, k1) * B(k1, k0, n) }",
    "k-apart": "def f(float16(M, K0, K) A, float16(K0, N, K) B) -> (C) "
               "{ C(m, n) +=! A(m, k0, k1) * B(k0, n, k1) }",
    "k-neither": "def f(float16(K, M, K0) A, float16(K0, N, K) B) -> (C) "
                 "{ C(m, n) +=! A(k1, m, k0) * B(k0, n, k1) }",
    "tf32-k-apart": "def f(float(M, K0, K) A, float(K0, N, K) B) -> (C) "
                    "{ C(m, n) +=! A(m, k0, k1) * B(k0, n, k1) }",
    "tf32-nn": NN.replace("float16", "float"), "tf32-tt": TT.replace("float16", "float"),
    "tf32-nt": NT.replace("float16", "float"), "tf32-tn": TN.replace("float16", "float"),
}
MMA_SYNC = tc.MappingOptions.naive().tensor_cores((64, 32, 16), (2, 1), 3)


def _run_on_host(src, mnk, options=MMA_SYNC, offset=0, rng=None):
    """Compile for sm_90, run every block on the host machine, compare with the reference
    (small integers: every sum exact). ``offset``: inputs start that many elements into
    their buffers (not 16-byte aligned: element loads)."""
    rng = rng or np.random.default_rng(3)
    m, n, k = mnk
    fn = tc.define(src, target="cuda")
    values = {"M": m, "N": n, "K": k, "Bt": 2, "N0": 3, "N1": 5, "K0": 2}
    sizes = {s: values[s] for s in fn.ir.sizes}
    inputs = []
    for t in fn.ir.inputs:
        shape = tuple(s.evaluate(sizes) for s in t.shape)
        x = rng.integers(-3, 4, shape).astype(t.dtype.numpy)
        if offset:
            buf = np.empty(x.size + offset, x.dtype)
            buf[offset:] = x.ravel()
            x = buf[offset:].reshape(shape)
        inputs.append(x)
    tf32 = "float(" in src.split("->")[0] and "float16" not in src
    opts = options.tensor_cores(options.mma_tile, options.mma_warps, options.mma_stages,
                                precision="tf32" if tf32 else "half")
    if offset:  # the call's signature records the inputs' alignment
        signature = Signature(tuple(
            ArgSpec(x.shape, t.dtype.value, tuple(s // x.itemsize for s in x.strides),
                    pointer_alignment(x.ctypes.data)) for t, x in zip(fn.ir.inputs, inputs, strict=True)))
        kernel = compile_kernel(fn, "cuda", opts, signature, sizes, "sm_90")
    else:
        kernel = fn.compile(*inputs, target="cuda", arch="sm_90", options=opts)
    assert "mma S0" in kernel.schedule
    arrays = {t.name: x for t, x in zip(fn.ir.inputs, inputs, strict=True)}
    for t in fn.ir.tensors:
        arrays.setdefault(t.name, np.zeros(tuple(s.evaluate(sizes) for s in t.shape), t.dtype.numpy))
    emu.run_kernel(kernel, arrays, sizes)
    want = tc.define(src, target="numpy")(*inputs)
    want = want if isinstance(want, tuple) else (want,)
    for t, w in zip(fn.ir.outputs, want, strict=True):
        np.testing.assert_array_equal(arrays[t.name].astype(np.float64), np.asarray(w, np.float64),
                                      err_msg=f"{t.name} of {src}")
    return kernel


@pytest.mark.parametrize("name, mnk", [(name, (33, 17, 40)) for name in KERNELS]
                         + [(name, (1, 7, 15)) for name in ("nn", "tt", "rows", "two-k", "tf32-nn",
                                                            "linear", "k-neither")])
def test_kernels_on_the_host_machine(name, mnk):
    if "bfloat16" in KERNELS[name]:
        pytest.importorskip("ml_dtypes")
    _run_on_host(KERNELS[name], mnk)


@pytest.mark.parametrize("name", ["nn", "tt", "tf32-nn"])
def test_unaligned_inputs_on_the_host_machine(name):
    kernel = _run_on_host(KERNELS[name], (17, 24, 32), offset=1)
    assert "cp.async.cg" not in kernel.ptx  # (float32: 4-byte copies; halves: element loads)


def test_staged_epilogue_and_several_tiles_on_the_host_machine():
    """Sizes the tiles divide (the output leaves through shared memory) and several tiles
    per block (grid smaller than the tiles), default-like 2 x 2 warps."""
    opts = tc.MappingOptions.naive().tensor_cores((64, 64, 32), (2, 2), 2)
    _run_on_host(KERNELS["nn"], (128, 64, 64), opts)
    _run_on_host(KERNELS["linear"], (64, 128, 96), opts)


def test_a_wrong_accumulator_layout_is_caught(monkeypatch):
    """A planted bug: the epilogue reads the accumulators' rows the wrong way round."""
    from tcmlir.codegen import mma_epilogue

    monkeypatch.setenv("TCMLIR_ALWAYS_COMPILE", "1")  # neither a cached kernel nor caching this one
    monkeypatch.setattr(mma_epilogue, "c_element", lambda lane, reg: c_element(lane, reg ^ 2))
    with pytest.raises(AssertionError, match="Arrays are not equal"):
        _run_on_host(KERNELS["nt"], (33, 17, 40))


@st.composite
def _contractions(draw):
    """A random contraction: one or two row, column and reduction indices, maybe a batch
    index, each tensor's indices in a random order, small sizes."""
    ms = [f"m{i}" for i in range(draw(st.integers(1, 2)))]
    ns = [f"n{i}" for i in range(draw(st.integers(1, 2)))]
    ks = [f"k{i}" for i in range(draw(st.integers(1, 2)))]
    bs = ["b"] * draw(st.integers(0, 1))
    x = draw(st.permutations(ms + ks + bs))
    y = draw(st.permutations(ns + ks + bs))
    lhs = draw(st.permutations(bs + ms + ns))
    sizes = {i: draw(st.sampled_from([1, 2, 3, 5, 8, 13, 17, 24])) for i in ms + ns + ks + bs}
    dtype = draw(st.sampled_from(["float16", "bfloat16", "float"]))
    out = "(C)" if dtype == "float16" else f"(float({', '.join(i.upper() for i in lhs)}) C)"

    def decl(name, idx):
        return f"{dtype}({', '.join(i.upper() for i in idx)}) {name}"

    src = (f"def f({decl('X', x)}, {decl('Y', y)}) -> {out} "
           f"{{ C({', '.join(lhs)}) +=! X({', '.join(x)}) * Y({', '.join(y)}) }}")
    return src, {i.upper(): v for i, v in sizes.items()}


@settings(max_examples=10, deadline=None, derandomize=True,
          suppress_health_check=[HealthCheck.too_slow])
@given(case=_contractions())
@example(case=(  # float32 operand with no contiguous dimension: 4-byte copies along a stride
    "def f(float(M0, K0) X, float(N1, K0, N0) Y) -> (float(M0, N0, N1) C) "
    "{ C(m0, n0, n1) +=! X(m0, k0) * Y(n1, k0, n0) }", {"M0": 1, "N0": 2, "N1": 1, "K0": 2}))
def test_random_contractions_on_the_host_machine(case):
    src, sizes = case
    if "bfloat16" in src:
        pytest.importorskip("ml_dtypes")
    fn = tc.define(src, target="cuda")
    plan = contraction_plan(fn.ir, sizes, tf32=True)
    assert not isinstance(plan, str), (src, plan)
    rng = np.random.default_rng(5)
    inputs = [rng.integers(-3, 4, tuple(s.evaluate(sizes) for s in t.shape)).astype(t.dtype.numpy)
              for t in fn.ir.inputs]
    opts = MMA_SYNC.tensor_cores(MMA_SYNC.mma_tile, MMA_SYNC.mma_warps, MMA_SYNC.mma_stages,
                                 precision="tf32" if plan.dtype.name == "FLOAT32" else "half")
    kernel = fn.compile(*inputs, target="cuda", arch="sm_90", options=opts)
    arrays = {t.name: x for t, x in zip(fn.ir.inputs, inputs, strict=True)}
    for t in fn.ir.tensors:
        arrays.setdefault(t.name, np.zeros(tuple(s.evaluate(sizes) for s in t.shape), t.dtype.numpy))
    emu.run_kernel(kernel, arrays, sizes)
    want = tc.define(src, target="numpy")(*inputs)
    np.testing.assert_array_equal(arrays["C"].astype(np.float64), np.asarray(want, np.float64),
                                  err_msg=src)
