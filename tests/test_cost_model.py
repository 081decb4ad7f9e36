"""The cost model (`tcmlir.cost_model`) and the generic cuda mapping it chooses.

The model ranks mappings; these tests check the properties a mapping chosen by it must have
(no hardware dimension on a member of one value, the contiguous dimension on ``threadIdx.x``,
enough blocks for the SMs, a sequential reduction per thread only where the reduction is
short) on programs no specialised default claims, and the results against the reference
through the GPU simulator at awkward sizes. Speed is measured by tools/zoo.py, not here.
"""

from __future__ import annotations

import islpy as isl
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import tcmlir as tc
from tcmlir.cost_model import GPU, Access, KernelShape, generic_mapping, kernel_time
from tcmlir.options import MappingOptions as MO
from tcmlir.poly.gpu_mapping import kernel_marks
from tcmlir.reference import run as run_reference
from tcmlir.simulate import simulate_call

PERM4 = "def heads(float(B,H,S,D) X) -> (Y) { Y(b,s,h,d) = X(b,h,s,d) }"
KRON = ("def kron(float(M,N0,N1,N2) X, float(D,N2) Wt) -> (XW) "
        "{ XW(m,n0,n1,d) +=! X(m,n0,n1,r) * Wt(d,r) }")
BATCH_LAST = ("def bl(float(M,K,B) A, float(K,N,B) Bm) -> (C) "
              "{ C(m,n,b) +=! A(m,k,b) * Bm(k,n,b) }")
PERM3 = "def p3(float(A,B,C) X) -> (Y) { Y(c,a,b) = X(a,b,c) }"


def _grids(fn: tc.TCFunction, sizes: dict[str, int]) -> list[tuple[tuple[int, ...], tuple[int, ...]]]:
    kernel = fn.compile(*[np.zeros([sizes[str(d)] for d in t.shape], np.float32)
                          for t in fn.ir.inputs], target="cuda", arch="sm_90")
    schedule = isl.Schedule.read_from_str(isl.Context(), kernel.schedule)
    return [(km.grid, km.block) for _, km in kernel_marks(schedule)]


def test_a_strided_warp_access_costs_more_than_a_contiguous_one():
    def shape(stride):
        a = Access("X", 4, stride, 2**28)
        return KernelShape(blocks=4096, threads=256, instances=2**26, per_thread=64,
                           accesses=(a, Access("Y", 4, 1, 2**28, write=True)))
    contiguous, strided, broadcast = (kernel_time(shape(s)) for s in (1, 4096, 0))
    assert broadcast <= contiguous < strided


def test_few_blocks_cost_more_than_enough_blocks():
    acc = (Access("X", 4, 1, 2**24), Access("Y", 4, 1, 2**24, write=True))
    few = KernelShape(blocks=8, threads=256, instances=2**22, per_thread=2**11, accesses=acc)
    many = KernelShape(blocks=2**14, threads=256, instances=2**22, per_thread=1, accesses=acc)
    assert kernel_time(many) * 4 < kernel_time(few)


def test_the_permutation_maps_its_contiguous_dimension_to_x():
    sizes = {"B": 8, "H": 12, "S": 128, "D": 64}
    fn = tc.define(PERM4)
    opts = MO.default_for(fn, "cuda", sizes)
    assert opts.tile_sizes[:2] == (1, 1) and opts.tile_sizes[-1] >= 32
    ((grid, block),) = _grids(fn, sizes)
    assert block[0] >= 32 and block[0] % 32 == 0
    assert grid[0] * grid[1] * grid[2] >= GPU.sms


def test_kronecker_contraction_spreads_outputs_over_threads():
    sizes = {"M": 64, "N0": 32, "N1": 32, "N2": 32, "D": 32}
    fn = tc.define(KRON)
    g = generic_mapping(fn.ir, sizes)
    assert g is not None and g.tile_sizes[-1] == 0  # the reduction stays in each thread
    grids = _grids(fn, sizes)
    main = max(grids, key=lambda gb: np.prod(gb[0]) * np.prod(gb[1]))
    assert np.prod(main[0]) >= 2 * GPU.sms and np.prod(main[1]) >= 256


def test_batch_last_contraction_is_not_a_column_reduction():
    sizes = {"M": 64, "K": 32, "N": 48, "B": 64}
    fn = tc.define(BATCH_LAST)
    opts = MO.default_for(fn, "cuda", sizes)
    assert not opts.row_block  # not map-rows' column kernel: a thread per column walked M x N
    ((grid, _block),) = _grids(fn, sizes)
    assert np.prod(grid) >= GPU.sms


def test_fused_attention_prices_both_fusions():
    src = """def att(float(B,S,D) Q, float(B,S,D) K, float(B,S,D) V) -> (O) {
        P(b, i, j) +=! Q(b, i, d) * K(b, j, d)
        mx(b, i) max=! P(b, i, j)
        e(b, i, j) = exp(P(b, i, j) - mx(b, i))
        s(b, i) +=! e(b, i, j)
        O(b, i, d) +=! e(b, i, j) * V(b, j, d) / s(b, i)
    }"""
    g = generic_mapping(tc.define(src).ir, {"B": 32, "S": 128, "D": 64})
    # fused, the scores' j loop is sequential under the row maximum: 128 x 64 products per
    # thread; apart, every (b, i, j) is a thread
    assert g is not None and g.fusion == "min"


def test_no_sizes_no_model():
    assert generic_mapping(tc.define(PERM4).ir, None) is None
    assert MO.default_for(tc.define(PERM4), "cuda") == MO.naive()


@pytest.mark.parametrize("src,sizes", [
    (PERM4, {"B": 3, "H": 5, "S": 7, "D": 33}),
    (PERM3, {"A": 5, "B": 17, "C": 3}),
    (KRON, {"M": 3, "N0": 2, "N1": 5, "N2": 7, "D": 9}),
    (BATCH_LAST, {"M": 7, "K": 5, "N": 3, "B": 33}),
], ids=["perm4", "perm3", "kron", "batch-last"])
def test_generic_mapping_matches_the_reference(src, sizes, rng):
    fn = tc.define(src)
    opts = MO.default_for(fn, "cuda", sizes)
    inputs = [rng.standard_normal([sizes[str(d)] for d in t.shape]).astype(np.float32)
              for t in fn.ir.inputs]
    got = simulate_call(fn.ir, inputs, opts)
    want = run_reference(fn.ir, {t.name: x for t, x in zip(fn.ir.inputs, inputs, strict=True)},
                         sizes)
    for g, w in zip(got, want.values(), strict=True):
        np.testing.assert_allclose(g, w, rtol=1e-4, atol=1e-5)


def _at_most(extents: list[int], elements: int = 40_000) -> list[int]:
    """``extents`` with the largest halved until the tensor holds at most ``elements`` (the
    simulator walks every instance: 40^4 took two minutes)."""
    extents = list(extents)
    while np.prod(extents) > elements:
        i = int(np.argmax(extents))
        extents[i] = max(1, extents[i] // 2)
    return extents


@settings(max_examples=12, deadline=None)
@given(st.lists(st.integers(1, 40), min_size=4, max_size=4).map(_at_most),
       st.permutations(range(4)))
def test_generic_permutations_match(extents, perm):
    names = "abcd"
    lhs = ", ".join(names[p] for p in perm)
    src = f"def p(float(A,B,C,D) X) -> (Y) {{ Y({lhs}) = X(a, b, c, d) }}"
    sizes = dict(zip("ABCD", extents, strict=True))
    fn = tc.define(src)
    x = np.arange(np.prod(extents), dtype=np.float32).reshape(extents)
    (got,) = simulate_call(fn.ir, [x], MO.default_for(fn, "cuda", sizes))
    np.testing.assert_array_equal(got, np.transpose(x, perm))
