"""The contraction model (`tcmlir.contraction_model`) and the fp32 contraction defaults it
chooses (`cuda_defaults.contraction_choice`): its predictions against the H100 measurements it
was calibrated on and the ones it was not, the choices at the sizes of the tuning sweep and
the zoo, the register counts against ptxas, and every tiling it can choose run on the host
machine (`tests/mma_emulator.py`) at small awkward sizes, split and unsplit."""

from __future__ import annotations

import dataclasses
import os
import re
import shutil
import sys

import mma_emulator as emu
import numpy as np
import pytest

import tcmlir as tc
from tcmlir import cuda_defaults
from tcmlir.contraction_model import (
    REGISTERS,
    TILINGS,
    Problem,
    choose_tiling,
    resident_blocks,
    tiling_time,
)
from tcmlir.cuda_defaults import contraction_access
from tcmlir.options import MappingOptions as MO

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "tools"))
import zoo_workloads

MM = "def mm(float(M,K) A, float(K,N) B) -> (C) { C(m,n) +=! A(m,k) * B(k,n) }"
TMM = "def tmm(float(M,K) A, float(N,K) B) -> (C) { C(m,n) +=! A(m,k) * B(n,k) }"


def _mm(m: int, k: int, n: int, source: str = MM) -> MO:
    return MO.default_for(tc.define(source), "cuda", {"M": m, "K": k, "N": n})


def _ms(tile, reg, m, k, n, ways=1):
    aligned = all(e % 4 == 0 for e in (m, k, n))
    return tiling_time(tile, reg, (m, n), k, ways=ways, aligned=aligned).predicted_s * 1e3


# ---------------------------------------------------------------- the model's figures

@pytest.mark.parametrize("tile, reg, mkn, measured", [
    ((128, 128, 16), (8, 8), (4096, 4096, 4096), 2.916),   # calibration: two blocks per SM
    ((128, 128, 16), (8, 8), (3000, 1000, 2000), 0.569),   # calibration: 157 registers, one
    ((128, 64, 16), (8, 4), (2048, 2048, 2048), 0.535),    # not fitted: the A-through-registers
    ((128, 64, 16), (8, 4), (1536, 2048, 1536), 0.507),    # kernel, 4 and 3 blocks per SM
    ((64, 32, 16), (4, 2), (1000, 1000, 1000), 0.109),
])
def test_predictions_against_the_h100(tile, reg, mkn, measured):
    """Default-option times measured on the H100 on 2026-12-06 (tools/zoo.py, tools/tune_sweep.py):
    within 15%."""
    assert _ms(tile, reg, *mkn) == pytest.approx(measured, rel=0.15)


def test_the_8x8_tile_takes_one_block_per_sm_when_both_dimensions_end_partial():
    """ptxas gives the 8 x 8 kernel 157 registers once the rows and the columns both end in a
    partial tile (3000 x 2000): one block per SM, where 128 (full tiles) gave two."""
    full = tiling_time((128, 128, 16), (8, 8), (2048, 2048), 2048)
    ragged = tiling_time((128, 128, 16), (8, 8), (3000, 2000), 1000)
    assert (full.registers, full.resident) == (128, 2)
    assert (ragged.registers, ragged.resident) == (157, 1)
    assert resident_blocks((128, 64, 16), 80) == 3


@pytest.mark.parametrize("mkn, tile, ways", [
    ((2048, 2048, 2048), (128, 128, 16), 1),   # was 128 x 64 (0.535 ms): 256 blocks, one wave
    ((4096, 4096, 4096), (128, 128, 16), 1),
    ((3000, 1000, 2000), (128, 64, 16), 1),    # was 128 x 128 at one block per SM (0.568 ms)
    ((2047, 2049, 2051), (128, 64, 16), 1),    # was 128 x 128 at one block per SM (3.27 ms)
    ((1000, 1000, 1000), (64, 64, 16), 1),     # was 64 x 32 (0.109 ms)
])
def test_choices_at_the_sweep_sizes(mkn, tile, ways):
    opts = _mm(*mkn)
    assert (opts.tile_sizes, opts.split_k) == (tile, ways)
    assert opts == contraction_access(MO.cuda_contraction(tile, dict(TILINGS)[tile])
                                      .split_reduction(ways))


def test_a_skinny_contraction_is_split():
    """16 x 4096 x 4096 (zoo mm_skinny): the rule split-K used (rows a multiple of the tile's,
    written for the 2-D partial sums ``P(s*M + m, n)``) refused it; the 3-D partial sums need
    none, and the model splits its 64 column tiles over the reduction."""
    opts = _mm(16, 4096, 4096)
    assert opts.split_k >= 2
    best = tiling_time(opts.tile_sizes, opts.register_tile, (16, 4096), 4096, ways=opts.split_k)
    unsplit = choose_tiling([Problem((16, 4096), 4096)])
    assert best.blocks >= 132 and best.predicted_s < 0.5 * unsplit.predicted_s
    # its rows need not divide the tile's, nor its reduction the chunks' tile multiple
    assert _mm(16, 4096, 4096).tile_sizes[0] > 16


def test_split_k_pays_for_its_partial_sums():
    """More ways give more blocks, but each way writes and reads the whole output again and the
    fold is a second launch: a square the tiles fill is not split, and the model's time for
    16 ways exceeds 2 ways' there."""
    t = [tiling_time((128, 128, 16), (8, 8), (2048, 2048), 2048, ways=w).predicted_s
         for w in (1, 2, 16)]
    assert t[0] < t[1] < t[2]
    assert _mm(2048, 2048, 2048).split_k == 1


def test_the_operand_layout_counts_for_the_8x8_kernel():
    """fc's weights ``Wt(n, k)``: the 8 x 8 kernel copies them an element at a time; its
    measured split choice (128 x 64, 2 ways) stays."""
    fc = tc.define(next(w for w in zoo_workloads.ZOO if w.name == "linear_bias_relu").tc)
    opts = MO.default_for(fc, "cuda", {"B": 1024, "M": 2048, "N": 1024})
    assert (opts.tile_sizes, opts.register_tile, opts.split_k) == ((128, 64, 16), (8, 4), 2)
    assert cuda_defaults.contraction_problems(fc.ir.statements, {"B": 1, "M": 4, "N": 4})[0].b_k_major
    assert not cuda_defaults.contraction_problems(tc.define(MM).ir.statements,
                                                  {"M": 4, "K": 4, "N": 4})[0].b_k_major


BAG = "def bag(float(V,D) E, int32(B,L) idx) -> (O) { O(b,d) +=! E(idx(b,l),d) }"


def test_a_streamed_operand_asks_for_loads_in_flight():
    """An embedding bag reads its gathered rows at every (b, d, l): no tile reuses them. The
    model moves all of them and at a rate its resident warps allow: the 1024 x 256 x 32 bag
    gets 32 x 32 tiles (256 blocks, two per SM; 0.029 ms on the H100) rather than 64 x 32
    (128 blocks of 8 warps: 0.042 ms), and a matmul has no streamed operand."""
    fn = tc.define(BAG)
    sizes = {"V": 100_000, "D": 256, "B": 1024, "L": 32}
    (problem,) = cuda_defaults.contraction_problems(fn.ir.statements, sizes)
    assert problem.streamed == 1
    assert MO.default_for(fn, "cuda", sizes).tile_sizes == (32, 32, 16)
    assert cuda_defaults.contraction_problems(tc.define(MM).ir.statements,
                                              {"M": 4, "K": 4, "N": 4})[0].streamed == 0
    few = tiling_time((64, 32, 16), (4, 2), (1024, 256), 32, streamed=1)
    more = tiling_time((32, 32, 16), (2, 2), (1024, 256), 32, streamed=1)
    assert more.predicted_s < few.predicted_s
    assert more.predicted_s > tiling_time((32, 32, 16), (2, 2), (1024, 256), 32).predicted_s


def test_every_contraction_of_a_program_is_priced():
    """mlp2 (zoo, medium): 1024 x 1024 -> 4096 then 4096 -> 1024, one set of options for both;
    the second's 64 blocks of 128 x 128 would leave half the SMs idle for k = 4096."""
    w = next(w for w in zoo_workloads.ZOO if w.name == "mlp2")
    fn = tc.define(w.tc)
    problems = cuda_defaults.contraction_problems(fn.ir.statements, w.dims("medium"))
    assert [(p.extents, p.reduction) for p in problems] == [((1024, 4096), 1024),
                                                            ((1024, 1024), 4096)]
    tile, _, ways = cuda_defaults.contraction_choice(fn.ir, w.dims("medium"))
    assert ways == 1 and tile != (128, 128, 16)


@pytest.mark.parametrize("name, tile", [("bmm_scores", (0, 128, 128, 16)),
                                        ("kron3_1", (0, 0, 32, 32, 16)),
                                        ("tbmm", (1, 32, 32, 32))])
def test_lead_contractions_keep_their_tiles(name, tile):
    """The zoo's batched and Kronecker contractions at the medium size: what they had."""
    w = next(w for w in zoo_workloads.ZOO if w.name == name)
    assert MO.default_for(tc.define(w.tc), "cuda", w.dims("medium")).tile_sizes == tile


def test_unknown_sizes_keep_the_128x64_tile():
    opts = MO.default_for(tc.define(MM), "cuda")
    assert (opts.tile_sizes, opts.split_k) == ((128, 64, 16), 1)


# ---------------------------------------------------------------- registers against ptxas

@pytest.mark.skipif(shutil.which("ptxas") is None, reason="ptxas is not installed")
@pytest.mark.parametrize("reg, sizes, form", [
    ((8, 8), (256, 256, 256), 0), ((8, 8), (250, 256, 200), 1), ((8, 4), (131, 37, 67), 2),
])
def test_register_table_against_ptxas(tmp_path, reg, sizes, form):
    """`REGISTERS` is what ptxas gives the kernel (at most 8 more, at least 8 fewer: the
    occupancy the model derives rests on it)."""
    from conftest import ptxas_verbose

    from tcmlir import compiler
    from tcmlir.codegen.nvptx import compile_cuda

    tile = next(t for t, r in TILINGS if r == reg)
    m, k, n = sizes
    fn = tc.define(MM)
    state = compiler.lower(fn.ir, {"M": m, "K": k, "N": n},
                           contraction_access(MO.cuda_contraction(tile, reg)), "cuda")
    ptx = compile_cuda(state, "sm_90", aligned=tuple(t.name for t in fn.ir.tensors)).ptx
    info = ptxas_verbose(tmp_path, ptx, "mm")
    used = max(int(x) for x in re.findall(r"Used (\d+) registers", info))
    assert REGISTERS[reg][form] - 8 <= used <= REGISTERS[reg][form] + 8, info
    if reg == (8, 8):
        assert (used <= 128) == (form == 0), info  # two blocks per SM, or one


# ---------------------------------------------------------------- on the host machine

def _emulate(source: str, m: int, k: int, n: int, opts: MO, rng) -> None:
    fn = tc.define(source, target="cuda")
    a = rng.standard_normal((m, k)).astype(np.float32)
    b = rng.standard_normal((k, n) if source is MM else (n, k)).astype(np.float32)
    kernel = fn.compile(a, b, target="cuda", arch="sm_90", options=opts)
    sizes = {"M": m, "K": k, "N": n}
    arrays = {"A": a.copy(), "B": b.copy()}
    compiled = kernel.compiled_ir or fn.ir
    for t in compiled.tensors:
        if t.name not in arrays and t.name not in set(kernel.runner.image.on_chip):
            arrays[t.name] = np.full(tuple(s.evaluate(sizes) for s in t.shape), np.nan, np.float32)
    emu.run_kernel(kernel, arrays, sizes)
    want = a.astype(np.float64) @ (b if source is MM else b.T).astype(np.float64)
    np.testing.assert_allclose(arrays["C"], want, rtol=1e-5, atol=1e-5 * np.abs(want).max(),
                               err_msg=f"{opts.tile_sizes} {opts.register_tile} x{opts.split_k}")
    assert (kernel.compiled_ir is not None) == (opts.split_k > 1)


@pytest.fixture
def fresh(monkeypatch):
    monkeypatch.setenv("TCMLIR_ALWAYS_COMPILE", "1")


EMULATED = [
    # every tiling the model chooses, unsplit, with partial tiles and unaligned rows
    *[(MM, (t[0] + 3, 37, t[1] + 5), t, 1) for t, _ in TILINGS],
    # split: the 8 x 8 kernel, a k-major B, fewer rows than the tile (skinny), a remainder chunk
    (MM, (130, 100, 129), (128, 128, 16), 4),
    (TMM, (67, 96, 70), (64, 64, 16), 4),
    (MM, (16, 130, 70), (64, 64, 16), 4),
    (TMM, (16, 96, 35), (32, 32, 16), 8),
]


@pytest.mark.parametrize("source, mkn, tile, ways", EMULATED,
                         ids=[f"{'tmm' if c[0] is TMM else 'mm'}-{'x'.join(map(str, c[1]))}-"
                              f"{c[2][0]}x{c[2][1]}-w{c[3]}" for c in EMULATED])
def test_the_tilings_on_the_host_machine(fresh, source, mkn, tile, ways, rng):
    opts = contraction_access(MO.cuda_contraction(tile, dict(TILINGS)[tile]))
    _emulate(source, *mkn, opts.split_reduction(ways) if ways > 1 else opts, rng)


def test_a_skinny_default_on_the_host_machine(fresh, monkeypatch, rng):
    """The default itself for a 16-row contraction, its thresholds scaled down to a size the
    host machine runs (a reduction of 256 in chunks of 16, launches free): split, correct."""
    monkeypatch.setattr(cuda_defaults, "SPLIT_K_MIN_EXTENT", 64)
    monkeypatch.setattr(cuda_defaults, "SPLIT_K_MIN_CHUNK", 16)
    monkeypatch.setattr(cuda_defaults, "MODEL_GPU", dataclasses.replace(cuda_defaults.MODEL_GPU,
                                                                        launch_s=0.0))
    opts = _mm(16, 256, 64)
    assert opts.split_k > 1 and opts.tile_sizes[0] > 16
    _emulate(MM, 16, 256, 64, opts, rng)
