"""The operand copies of tensor-core kernels, run on the host: the LLVM IR that
`codegen/gpu_mma.MmaEmitter.load_stage` emits for one ring slot, with the address spaces
dropped and ``cp.async`` replaced by a host function that checks its alignment and zero-fills
past its source size, JIT-compiled and run for every thread of the block; the slot must then
hold the swizzled tile of the operand (`mma_layout.swizzled_offset`), zero past every end.

So the copy widths, the partial copies at the edges, the element loads of odd strides, index
groups, batch offsets and TF32's two 16-bit units per element are checked on the CPU for the
code the GPU runs (the fragment reads are `tests/test_mma.py`'s simulator)."""

from __future__ import annotations

import ctypes
import dataclasses
from dataclasses import dataclass, field
from typing import Any

import llvmlite.binding as llvm
import numpy as np
import pytest
from llvmlite import ir

import tcmlir as tc
from tcmlir.codegen.gpu_mma import MmaEmitter
from tcmlir.codegen.gpu_wgmma import WgmmaEmitter
from tcmlir.codegen.host import host_target_machine
from tcmlir.codegen.mma_ir import I32, I64, IntV
from tcmlir.codegen.mma_layout import swizzled_offset
from tcmlir.poly.contraction import MmaMark, contraction_plan

_COPY_WIDTHS = (4, 8, 16)
_VIOLATIONS: list[tuple[int, int, int, int]] = []  # cp.async calls misaligned or oversized


def _emulated_copy(width: int):
    def copy(dst: int, src: int, nbytes: int) -> None:
        if dst % width or src % width or not 0 <= nbytes <= width:
            _VIOLATIONS.append((dst, src, nbytes, width))
        ctypes.memset(dst, 0, width)
        if nbytes:
            ctypes.memmove(dst, src, nbytes)
    return ctypes.CFUNCTYPE(None, ctypes.c_void_p, ctypes.c_void_p, ctypes.c_int32)(copy)


_CALLBACKS = {w: _emulated_copy(w) for w in _COPY_WIDTHS}
for _w, _cb in _CALLBACKS.items():
    llvm.add_symbol(f"emu_cp_async_{_w}", ctypes.cast(_cb, ctypes.c_void_p).value)

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
    text = str(mod).replace(" addrspace(3)", "").replace(" addrspace(1)", "")
    for cache in ("cg", "ca"):
        for w in _COPY_WIDTHS:
            text = text.replace(f'"llvm.nvvm.cp.async.{cache}.shared.global.{w}.s"',
                                f'"emu_cp_async_{w}"')
    text = text.replace("internal global", "global")  # the ring: read back by name
    module = llvm.parse_assembly(text)
    module.verify()
    engine = llvm.create_mcjit_compiler(module, host_target_machine())
    engine.finalize_object()
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
    del _VIOLATIONS[:]
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
    assert not _VIOLATIONS, f"misaligned or oversized cp.async: {_VIOLATIONS[:4]}"
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


def test_copies_of_batch_entries_and_operands_without_a_contiguous_dimension():
    batched = ("def f(float16(Bt, N, K) X, float16(Bt, M, K) Y) -> (Z) "
               "{ Z(b, n, m) +=! X(b, n, k) * Y(b, m, k) }")
    _check_copies(batched, {"K": 30, "M": 17, "N": 9, "Bt": 3},
                  lambda a, b: {"X": a["X"][b], "Y": a["Y"][b]}, batches=(0, 2))
    strided = ("def f(float16(K, M, Bt) A, float16(K, N, Bt) B) -> (C) "
               "{ C(b, m, n) +=! A(k, m, b) * B(k, n, b) }")
    _check_copies(strided, {"K": 33, "M": 17, "N": 7, "Bt": 3},
                  lambda a, b: {"A": a["A"][:, :, b].T, "B": a["B"][:, :, b].T}, batches=(0, 2))


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
