"""Reductions mapped to threads (`map-reduction`) and their block combine on NVPTX.

Without a GPU: the default cuda pipeline maps the reduction of a row sum, a row max, a full
reduction and softmax's reductions (the ``reduction S<k> threads=B`` mark is in the tree, which
re-parses; coverage is proved), the PTX has warp shuffles and barriers and passes ptxas; a
matmul (two members on threads) keeps its mapping. With a GPU (``gpu`` mark): every operator x
dtype on awkward shapes against numpy itself (float sums to their rounding-error bound, min/max
and integers exactly, integer products with no zero factor), and the corpus programs tagged
"reduction" against their independent oracles; a few of the same checks on the CPU.
"""

from __future__ import annotations

import islpy as isl
import numpy as np
import pytest
from corpus import assert_outputs_close, run_program
from corpus.programs import CASES, case_by_name

import tcmlir as tc
from tcmlir.codegen.ptx_tools import find_ptxas, ptxas_check
from tcmlir.compiler import lower
from tcmlir.poly.gpu_mapping import check_coverage, kernel_marks

ROWSUM = "def f({t}(N, D) X) -> (S) {{ S(n) {op}=! X(n, d) }}"
FULL = "def f({t}(N) A) -> (s) {{ s {op}=! A(i) }}"
OPS = ("+", "*", "min", "max")
DTYPES = {"float": np.float32, "double": np.float64, "int32": np.int32, "int64": np.int64}


@pytest.fixture(autouse=True)
def _fresh(monkeypatch):
    monkeypatch.setenv("TCMLIR_ALWAYS_COMPILE", "1")


def _ptx(kernel: tc.Kernel) -> str:
    if find_ptxas() is not None:
        ptxas_check(kernel.ptx, "sm_90")
    return kernel.ptx


def _compile(src: str, *inputs, options=None) -> tc.Kernel:
    return tc.define(src).compile(*inputs, target="cuda", arch="sm_90", options=options)


@pytest.mark.parametrize(("name", "src", "shape", "threads"), [
    ("rowsum", ROWSUM.format(t="float", op="+"), (300, 4099), 32),
    ("rowmax", ROWSUM.format(t="float", op="max"), (7, 33), 32),
    ("full", FULL.format(t="float", op="+"), (1000,), 32),
    ("full-short", FULL.format(t="int32", op="*"), (5,), 4),
])
def test_reduction_mapped_ptx(name, src, shape, threads):
    x = np.zeros(shape, np.int32 if "int32" in src else np.float32)
    kernel = _compile(src, x, options=tc.MappingOptions.naive())  # map-reduction, not map-rows
    assert f"reduction S0 threads={threads}" in kernel.schedule
    assert f"block={threads},1,1" in kernel.schedule
    ptx = _ptx(kernel)
    assert "shfl.sync.bfly" in ptx and "bar.sync" in ptx
    # the tree re-parses: the mark survives and the text is a fixed point after one round
    ctx = isl.Context()
    once = str(isl.Schedule.read_from_str(ctx, kernel.schedule))
    assert f"reduction S0 threads={threads}" in once
    assert str(isl.Schedule.read_from_str(ctx, once)) == once


def test_reduction_mark_in_loops_and_coverage():
    fn = tc.define(ROWSUM.format(t="float", op="+"))
    state = lower(fn.ir, {"N": 300, "D": 4099}, tc.MappingOptions(), "cuda")
    check_coverage(state.schedule, state.scop.domain, state.scop.context)
    (_, km), = kernel_marks(state.schedule)
    assert km.block == (32, 1, 1)
    from tcmlir.poly.loops import build_ast, format_loops

    loops = format_loops(build_ast(state))
    mark_line = next(i for i, line in enumerate(loops.splitlines()) if "reduction S0" in line)
    lines = loops.splitlines()
    # every thread reaches the combine: no `_tx` above the mark except thread 0's own guard
    # around the initialisation, which runs before it as a sibling (not around the mark)
    above = [line for i, line in enumerate(lines[:mark_line])
             if not ("if (_tx == 0)" in line and "S0_init(" in lines[i + 1])]
    assert all("_tx" not in line for line in above)
    assert "c2 += 32" in loops  # the whole row is strided over the block


def test_wide_block_uses_shared_memory():
    opts = tc.MappingOptions().map_to_threads(256)
    kernel = _compile(ROWSUM.format(t="double", op="min"), np.zeros((3, 1000)), options=opts)
    assert "reduction S0 threads=256" in kernel.schedule
    ptx = _ptx(kernel)
    assert ".shared" in ptx and "bar.sync" in ptx and "shfl.sync.bfly" in ptx


@pytest.mark.parametrize("op", OPS)
@pytest.mark.parametrize("t", list(DTYPES))
def test_every_operator_and_dtype_compiles(op, t):
    opts = tc.MappingOptions().map_to_threads(128)
    kernel = _compile(ROWSUM.format(t=t, op=op), np.zeros((7, 1000), DTYPES[t]), options=opts)
    assert "reduction S0 threads=128" in kernel.schedule
    assert "shfl.sync.bfly" in _ptx(kernel)


def test_matmul_keeps_its_thread_mapping():
    case = case_by_name("matmul")
    kernel = _compile(case.source, *case.make_inputs(np.random.default_rng(0), **case.sizes[0]))
    assert "reduction S" not in kernel.schedule
    assert "shfl" not in _ptx(kernel)


def test_softmax_reductions_mapped():
    case = case_by_name("softmax_temporaries")
    inputs = case.make_inputs(np.random.default_rng(0), **case.sizes[-1])
    kernel = _compile(case.source, *inputs)
    assert "reduction S" in kernel.schedule
    assert "shfl.sync.bfly" in _ptx(kernel)


def test_length_one_reduction_is_not_mapped():
    kernel = _compile(ROWSUM.format(t="float", op="+"), np.zeros((300, 1), np.float32))
    assert "reduction S" not in kernel.schedule
    _ptx(kernel)


# ---------------------------------------------------------------- against numpy
#
# The oracle is numpy itself (never tcmlir's reference interpreter, which shares the IR, the
# type rules and the reduction identities with the compiler): float sums and products in
# float64, held per output element to a rounding-error bound in units of eps * sum|x| that
# grows with the length (`numpy_reduction`); min and max exactly; integers
# exactly. Integer products are not vacuous: the factors are +-1 with a few +-2 per row, never
# 0, and at most ``_INT_PRODUCT_TWOS`` of them, so the product neither vanishes nor overflows.

_NUMPY_REDUCE = {"+": np.sum, "*": np.prod, "min": np.min, "max": np.max}
_INT_PRODUCT_TWOS = {np.dtype(np.int32): 24, np.dtype(np.int64): 48}


def _values(rng, shape, dtype, op):
    dtype = np.dtype(dtype)
    if dtype.kind == "f":
        lo, hi = (0.99, 1.01) if op == "*" else (-1.0, 1.0)
        return rng.uniform(lo, hi, size=shape).astype(dtype)
    if op != "*":
        return rng.integers(-1000, 1000, size=shape).astype(dtype)
    rows = int(np.prod(shape[:-1], dtype=np.int64))
    n = shape[-1]
    x = rng.choice(np.array([-1, 1], dtype=dtype), size=(rows, n))
    twos = min(n, _INT_PRODUCT_TWOS[dtype])
    for r in range(rows):
        where = rng.choice(n, size=rng.integers(0, twos, endpoint=True), replace=False)
        x[r, where] *= 2
    return x.reshape(shape)


def numpy_reduction(x: np.ndarray, op: str) -> tuple[np.ndarray, np.ndarray | None]:
    """(the reduction over the last axis in numpy, its absolute error bound or None: exact)."""
    if x.dtype.kind != "f":
        wide = _NUMPY_REDUCE[op](x.astype(np.int64), axis=-1)
        info = np.iinfo(x.dtype)
        assert np.all((wide >= info.min) & (wide <= info.max)), "the test's inputs overflow"
        return wide.astype(x.dtype), None
    if op in ("min", "max"):
        return _NUMPY_REDUCE[op](x, axis=-1), None
    x64 = x.astype(np.float64)
    exact = _NUMPY_REDUCE[op](x64, axis=-1)
    n = x.shape[-1]
    eps = float(np.finfo(x.dtype).eps)
    # Each partial result is rounded with a relative error of at most u = eps / 2, so the
    # error is at most (n - 1) u sum|x| for a sum in any order ((n - 1) u |prod| for a
    # product). That worst case needs every rounding error to have the same sign; for the
    # random inputs here they behave as a random walk, ~sqrt(n) u, so 8 sqrt(n) eps is many
    # standard deviations out yet small enough to see one lost term of a 4099-long row.
    scale = np.abs(x64).sum(axis=-1) if op == "+" else np.abs(exact)
    bound = (min(n, 8 * np.sqrt(n)) + 1) * eps * scale + float(np.finfo(x.dtype).tiny)
    return exact.astype(x.dtype), bound


def assert_reduction_matches(got: np.ndarray, x: np.ndarray, op: str, context: str) -> None:
    want, bound = numpy_reduction(x, op)
    got = np.asarray(got)
    assert got.shape == want.shape and got.dtype == want.dtype, (
        f"{context}: got {got.dtype}{got.shape}, want {want.dtype}{want.shape}")
    if bound is None:
        bad = got != want
    else:
        exact = _NUMPY_REDUCE[op](x.astype(np.float64), axis=-1)
        bad = ~(np.abs(got.astype(np.float64) - exact) <= bound)
    assert not bad.any(), (
        f"{context}: {int(bad.sum())} of {bad.size} differ from numpy; first at "
        f"{np.argwhere(bad)[0].tolist()}: got {got[bad].ravel()[0]!r}, want {want[bad].ravel()[0]!r}")


def test_integer_products_are_not_vacuous():
    rng = np.random.default_rng(0)
    for dtype in (np.int32, np.int64):
        x = _values(rng, (300, 4099), dtype, "*")
        assert not (x == 0).any()
        want, _ = numpy_reduction(x, "*")
        assert np.count_nonzero(np.abs(want) > 1) > 250 and (want < 0).any() and (want > 0).any()


def test_the_numpy_oracle_sees_a_wrong_identity():
    # what a wrong ``max=`` identity (0 instead of -inf) does to rows of negatives
    x = -np.abs(np.random.default_rng(1).uniform(0.5, 1, size=(7, 1))).astype(np.float32)
    with pytest.raises(AssertionError, match="differ from numpy"):
        assert_reduction_matches(np.maximum(x.max(-1), 0), x, "max", "planted")
    y = np.ones((3, 5), np.float32)
    with pytest.raises(AssertionError):  # one element dropped from a sum of ones
        assert_reduction_matches(y.sum(-1) - np.array([0, 1, 0], np.float32), y, "+", "planted")


CPU_SHAPES = [(1, 1), (7, 33)]


@pytest.mark.parametrize("shape", CPU_SHAPES, ids=[f"{r}x{c}" for r, c in CPU_SHAPES])
@pytest.mark.parametrize("op", OPS)
@pytest.mark.parametrize("t", ["float", "int32"])
def test_rowsum_on_cpu(t, op, shape, rng):
    src = ROWSUM.format(t=t, op=op)
    x = _values(rng, shape, DTYPES[t], op)
    for target in ("cpu", "numpy"):
        (got,) = run_program(tc.define(src, target=target), [x])
        assert_reduction_matches(got, x, op, f"{src} {shape} on {target}")


# ---------------------------------------------------------------- on the GPU


GPU_SHAPES = [(r, c) for r in (1, 7, 300) for c in (1, 31, 33, 1000, 4099)]


@pytest.mark.gpu
@pytest.mark.parametrize("shape", GPU_SHAPES, ids=[f"{r}x{c}" for r, c in GPU_SHAPES])
@pytest.mark.parametrize("op", OPS)
@pytest.mark.parametrize("t", list(DTYPES))
def test_rowsum_on_gpu(t, op, shape, rng):
    src = ROWSUM.format(t=t, op=op)
    x = _values(rng, shape, DTYPES[t], op)
    for opts in (tc.MappingOptions(), tc.MappingOptions().map_to_threads(256)):
        (got,) = run_program(tc.define(src, target="cuda"), [x], options=opts)
        assert_reduction_matches(got, x, op, f"{src} {shape} {opts}")


@pytest.mark.gpu
@pytest.mark.parametrize("n", (1, 31, 33, 1000, 4099, 100_003))
@pytest.mark.parametrize("op", OPS)
@pytest.mark.parametrize("t", list(DTYPES))
def test_full_reduction_on_gpu(t, op, n, rng):
    src = FULL.format(t=t, op=op)
    x = _values(rng, (n,), DTYPES[t], op)
    for opts in (tc.MappingOptions(), tc.MappingOptions().map_to_threads(1024)):
        (got,) = run_program(tc.define(src, target="cuda"), [x], options=opts)
        assert_reduction_matches(got, x, op, f"{src} n={n} {opts}")


REDUCTION_CASES = [c for c in CASES if "reduction" in c.tags]


@pytest.mark.gpu
@pytest.mark.parametrize("block", [(32, 8), (256,), (7,)], ids=str)
@pytest.mark.parametrize("case", REDUCTION_CASES, ids=[c.name for c in REDUCTION_CASES])
def test_corpus_reductions_on_gpu(case, block, rng):
    """Against the corpus's own numpy oracle (`Case.expected`), not the reference interpreter."""
    opts = tc.MappingOptions().map_to_threads(*block)
    for sizes in case.sizes:
        inputs = case.make_inputs(rng, **sizes)
        expected = case.expected(*[np.copy(x) for x in inputs])
        got = run_program(tc.define(case.source, name=case.entry, target="cuda"), inputs,
                          options=opts)
        assert_outputs_close(got, expected, case.rtol, context=f"{case.name} {sizes} block={block}")


@pytest.mark.parametrize("n", (1000, 1002, 4096 * 3, 511), ids=str)
@pytest.mark.parametrize("op", ("+", "max"))
def test_full_reduction_reads_vector_lanes_simulated(n, op, rng):
    """A full reduction with 128-bit access: each thread reads 4 adjacent floats per stride
    when 4 divides the extent (1000, 12288), else one (1002, 511); the simulator checks that
    every thread of every block reaches the combine."""
    from tcmlir.simulate import simulate_call

    fn = tc.define(FULL.format(t="float", op=op))
    opts = tc.MappingOptions(fusion="max").map_rows(32).map_to_blocks(4).vector_access(16)
    x = rng.standard_normal(n).astype(np.float32)
    (got,) = simulate_call(fn.ir, [x], opts)
    want = x.sum(dtype=np.float64) if op == "+" else x.max()
    np.testing.assert_allclose(got, want, rtol=1e-5)
    kernel = fn.compile(x, target="cuda", arch="sm_90", options=opts)
    assert ("4 * _tx" in kernel.loops) == (n % 4 == 0)
    assert "atomic" in kernel.schedule


def test_full_sum_default_reads_128_bits_without_minctasm():
    fn = tc.define(FULL.format(t="float", op="+"))
    kernel = fn.compile(np.zeros(1 << 20, np.float32), target="cuda", arch="sm_90")
    assert "ld.global.nc.v4" in kernel.ptx
    assert ".minnctapersm" not in kernel.ptx  # measured: 32 registers cost it 6%


def test_map_reduction_leaves_a_kernel_it_would_not_cover_alone():
    # tiles (1, 1, 2) under a (2, 1, 1) block: map-to-threads pins x in the reduction's padded
    # point band to 0, which map-reduction did not undo, so thread 1's half of k never ran; the
    # coverage proof refused the compile (a tuner candidate). The kernel keeps its mapping now.
    from tcmlir.simulate import simulate_call

    fn = tc.define("def mm(float(M,K) A, float(K,N) B) -> (C) { C(m,n) +=! A(m,k) * B(k,n) }")
    opts = tc.MappingOptions.naive().map_to_threads(2, 1, 1).map_to_blocks(1, 128)
    opts = tc.MappingOptions.from_dict({**opts.to_dict(), "tile_sizes": [], "unroll_factor": 2})
    rng = np.random.default_rng(3)
    a, b = rng.standard_normal((12, 16)).astype(np.float32), rng.standard_normal((16, 10)).astype(np.float32)
    (got,) = simulate_call(fn.ir, [a, b], opts)
    np.testing.assert_allclose(got, a @ b, rtol=1e-5, atol=1e-5)


FULL_WHERE = "def f(float(N) A) -> (S) { S(z) +=! A(i) where z in 0:1 }"


@pytest.mark.parametrize("src", (FULL_WHERE, "def f(float(N) A) -> (S) { S(z) max=! A(i) where z in 3:4 }"))
def test_reduction_into_one_element_is_a_full_reduction(src, rng):
    """``S(z) +=! A(i) where z in 0:1`` is ``s +=! A(i)`` written otherwise: the same
    grid-wide atomic kernel, not one block of 32 threads walking 2^24 values (51 ms on an H100
    against 0.08 for the scalar form)."""
    from tcmlir.simulate import simulate_call

    n = 1 << 16
    fn = tc.define(src)
    kernel = fn.compile(np.zeros(n, np.float32), target="cuda", arch="sm_90")
    assert "atomic" in kernel.schedule
    grid = [m.grid for _, m in kernel_marks(isl.Schedule.read_from_str(isl.Context(), kernel.schedule))]
    assert max(g[0] for g in grid) > 1
    x = rng.standard_normal(n).astype(np.float32)
    (got,) = simulate_call(fn.ir, [x], tc.MappingOptions.default_for(fn, "cuda", {"N": n}))
    want = x.sum(dtype=np.float64) if "+=" in src else x.max()
    lo = 3 if "3:4" in src else 0
    assert got.shape[0] == lo + 1
    np.testing.assert_allclose(got[lo], want, rtol=1e-4)


@pytest.mark.gpu
def test_reduction_into_one_element_on_gpu(rng):
    x = rng.standard_normal(100_003).astype(np.float32)
    (got,) = run_program(tc.define(FULL_WHERE, target="cuda"), [x])
    np.testing.assert_allclose(got[0], x.sum(dtype=np.float64), rtol=1e-4)


@pytest.mark.parametrize("shape", [(8192, 3000), (5, 7), (300, 33), (1, 4096)], ids=str)
def test_two_dimensional_full_sum_spreads_rows_over_blocks(shape, rng):
    """``s +=! X(n, d)``: blocks along n when d alone gives fewer blocks than SMs (2 blocks for
    d = 3000, every thread walking all 8192 rows, before)."""
    from tcmlir.simulate import simulate_call

    fn = tc.define("def f(float(N, D) X) -> (s) { s +=! X(n, d) }")
    x = rng.standard_normal(shape).astype(np.float32)
    opts = tc.MappingOptions.default_for(fn, "cuda", {"N": shape[0], "D": shape[1]})
    kernel = fn.compile(x, target="cuda", arch="sm_90", options=opts)
    grids = [m.grid[0] for _, m in kernel_marks(isl.Schedule.read_from_str(isl.Context(), kernel.schedule))]
    assert max(grids) >= min(shape[0], 132)
    if x.size <= 10_000:
        (got,) = simulate_call(fn.ir, [x], opts)
        np.testing.assert_allclose(got, x.sum(dtype=np.float64), rtol=1e-4)


@pytest.mark.parametrize("t", ("float", "double", "int32", "int64"))
def test_full_sum_folds_its_blocks_with_a_reduction_not_a_cas_loop(t):
    """The blocks of a full sum fold their totals by ``atomicrmw add`` (``red.global.add``,
    done in L2), not a compare-and-swap loop: 264 blocks finishing together each waited for
    a round trip per lost race (64 MB in 81 us on an H100 where eager takes 29)."""
    fn = tc.define(FULL.format(t=t, op="+"))
    kernel = fn.compile(np.zeros(1 << 20, DTYPES[t]), target="cuda", arch="sm_90")
    assert "atomic" in kernel.schedule
    ptx = _ptx(kernel)
    assert "atom.global.add" in ptx or "red.global.add" in ptx
    assert ".cas." not in ptx


@pytest.mark.parametrize("op", ("min", "max"))
def test_full_min_max_skips_the_cas_when_the_total_changes_nothing(op, rng):
    """A block whose total would not change the value seen does no compare-and-swap (a min or
    max only moves away from it); the emulated kernel still finds the extreme."""
    import mma_emulator as emu

    src = FULL.format(t="float", op=op)
    kernel = tc.define(src).compile(np.zeros(1 << 20, np.float32), target="cuda", arch="sm_90")
    assert "red.cas.swap" in kernel.llvm_ir and ".cas." in _ptx(kernel)
    x = rng.standard_normal(9_001).astype(np.float32)  # 8 blocks of 1024 threads (5 s emulated)
    kernel = tc.define(src).compile(x, target="cuda", arch="sm_90")
    arrays = {"A": x, "s": np.full((), np.nan, np.float32)}
    emu.run_kernel(kernel, arrays, {"N": x.size})
    assert arrays["s"] == (x.min() if op == "min" else x.max())
