"""Partial tiles beside full ones, both unrolled by LLVM (issue 31, `poly.partial_tiles`).

At sizes the tiles do not divide, the register tiles and k strips at the matrix's edges are
partial. isl used to unroll those bands (one AST per partial shape: ~1,000 statement calls per
kernel, 8-15 s of compile time for a 3000x1000x2000 or 4095x4093x4097 matmul); now the subtree
of each ``unroll`` mark is split into its full tiles (constant trip counts, no guard: the same
code as at a size the tiles divide) and its partial ones (an ``unroll-partial`` mark: loops of
a constant largest trip count, each iteration guarded, unrolled where they index registers).
"""

from __future__ import annotations

import re

import islpy as isl
import numpy as np
import pytest

import tcmlir as tc
from tcmlir import compiler
from tcmlir.codegen import ast_loops
from tcmlir.poly import loops
from tcmlir.poly.llvm_unroll import PARTIAL_MARK, UNROLL_MARK, trip_bound, trip_count
from tcmlir.poly.loops import build_ast, format_loops
from tcmlir.poly.tree import leaf_band_paths, node_at
from tcmlir.simulate import simulate_call

MO = tc.MappingOptions
MM = "def mm(float(M,K) A, float(K,N) B) -> (C) { C(m,n) +=! A(m,k) * B(k,n) }"


@pytest.fixture(autouse=True)
def _fresh_compiles(monkeypatch):
    monkeypatch.setenv("TCMLIR_ALWAYS_COMPILE", "1")


def _cuda(m: int, k: int, n: int, options: tc.MappingOptions | None = None):
    a, b = np.zeros((m, k), np.float32), np.zeros((k, n), np.float32)
    return tc.define(MM).compile(a, b, target="cuda", arch="sm_90", options=options)


def _widest_fma_block(ptx: str) -> int:
    """The most ``fma`` instructions in one basic block of ``ptx`` (straight-line code)."""
    best = run = 0
    for line in ptx.splitlines():
        s = line.strip()
        if s.endswith(":") or s.startswith(("bra", "@")) or s.startswith("ret"):
            best, run = max(best, run), 0
        elif s.startswith("fma.rn.f32"):
            run += 1
    return max(best, run)


@pytest.mark.parametrize("sizes", [(4095, 4093, 4097), (3000, 1000, 2000), (1000, 1000, 1000)],
                         ids=lambda s: "x".join(map(str, s)))
def test_the_default_matmul_at_ragged_sizes_has_few_statement_calls(sizes):
    """The AST of a default matmul at sizes the tiles do not divide calls each statement a few
    times (full tiles, partial tiles), not once per register and k step of every partial
    shape; no band is left to isl's unrolling."""
    m, k, n = sizes
    fn = tc.define(MM)
    values = {"M": m, "K": k, "N": n}
    state = compiler.lower(fn.ir, values, MO.default_for(fn, "cuda", values), "cuda")
    text = format_loops(build_ast(state))
    assert f"// {PARTIAL_MARK}" in text and f"// {UNROLL_MARK}\n" in text
    assert text.count("S0(") <= 2, text
    for copy in ("cpinit_C_reg0(", "cpout_C_reg0("):
        assert text.count(copy) <= 2, text


def test_full_tiles_keep_the_straight_line_code_of_a_size_the_tiles_divide():
    """The inner loop of a full tile is the same straight-line block of multiply-adds on
    registers at 4095x4093x4097 as at 4096^3 (the partial tiles add guarded code beside it),
    and no register spills to local memory; both under 4096^3's default, 128 x 128 tiles of
    8 x 8 (4095x4093x4097's own default has 128 x 64 tiles: the 8 x 8 kernel takes 157
    registers there, one block per SM)."""
    whole = _cuda(4096, 4096, 4096)
    ragged = _cuda(4095, 4093, 4097, whole.options).ptx
    whole = whole.ptx
    assert _widest_fma_block(whole) == _widest_fma_block(ragged) == 16 * 8 * 8
    assert "__local_depot" not in ragged and "ld.local" not in ragged


@pytest.mark.parametrize("sizes", [(13, 11, 17), (37, 21, 45), (5, 3, 7)],
                         ids=lambda s: "x".join(map(str, s)))
@pytest.mark.parametrize("interleave", [0, 2])
def test_partial_tiles_compute_the_product_on_the_simulator(sizes, interleave, rng):
    """The split AST (full and partial tiles, register copies included) runs every instance
    once, in order, registers in bounds (the simulator checks), and gives the product."""
    opts = (MO.cuda_contraction().tile(16, 16, 8).register_tiling(4, 4).map_to_blocks(3, 3)
            .interleave_registers(0, interleave).unroll(8))
    m, k, n = sizes
    fn = tc.define(MM, target="numpy")
    state = compiler.lower(fn.ir, {"M": m, "K": k, "N": n}, opts, "cuda")
    assert f"// {PARTIAL_MARK}" in format_loops(build_ast(state))
    a = rng.standard_normal((m, k)).astype(np.float32)
    b = rng.standard_normal((k, n)).astype(np.float32)
    (c,) = simulate_call(fn.ir, [a, b], opts)
    np.testing.assert_allclose(c, a.astype(np.float64) @ b, rtol=1e-4, atol=1e-5)


def test_guarded_loops_run_the_iterations_their_bounds_allow(monkeypatch, rng):
    """The code generator's form of a partial tile's loop (`GroupWalker.guarded_loop`: its
    largest trip count, each iteration guarded by the loop's condition), checked for numbers
    on the host: a tiled matmul whose point loops (``min`` bounds at 13x11x7 with 8x4x8 tiles)
    go under an ``unroll-partial`` mark and count as indexing registers."""
    build_from = loops._build_from

    def marked(context, schedule, fn, promotion):
        for path in reversed(leaf_band_paths(schedule)):
            node = node_at(schedule, path)
            schedule = node.insert_mark(isl.Id(PARTIAL_MARK, user=path,
                                               context=node.get_ctx())).get_schedule()
        return build_from(context, schedule, fn, promotion)

    monkeypatch.setattr(loops, "_build_from", marked)
    monkeypatch.setattr(ast_loops, "indexes_registers", lambda loop, registers: True)
    a = rng.standard_normal((13, 11)).astype(np.float32)
    b = rng.standard_normal((11, 7)).astype(np.float32)
    kernel = tc.define(MM).compile(a, b, target="cpu", options=MO.naive().tile(8, 4, 8))
    assert f"// {PARTIAL_MARK}" in kernel.loops and "min(7," in kernel.loops
    assert len(re.findall(r"for\.c\d+\.guard:", kernel.llvm_ir)) == 3
    out = kernel.launch(a, b)
    c = out[0] if isinstance(out, (tuple, list)) else out
    np.testing.assert_allclose(c, a.astype(np.float64) @ b, rtol=1e-5, atol=1e-5)


def _loop(domain: str) -> isl.AstNode:
    """isl's for-node over statement ``S[i]`` of ``domain`` (parameter ``P`` in 0..100)."""
    root = isl.Schedule.from_domain(isl.UnionSet(domain)).get_root()
    schedule = root.child(0).insert_partial_schedule(
        isl.MultiUnionPwAff("[P] -> [{ S[i] -> [(i)] }]")).get_schedule()
    return isl.AstBuild.from_context(isl.Set("[P] -> { : 0 <= P <= 100 }")) \
        .node_from_schedule(schedule)


def test_trip_bound_of_a_partial_tile_loop():
    ast = _loop("[P] -> { S[i] : 0 <= i <= 7 and i <= P }")
    assert ast.get_type() == isl.ast_node_type.for_
    assert "min(7, P)" in ast.to_C_str()
    assert trip_count(ast) is None and trip_bound(ast) == 8
    full = _loop("[P] -> { S[i] : P <= i <= P + 7 }")
    assert trip_count(full) == trip_bound(full) == 8
    unbounded = _loop("[P] -> { S[i] : 0 <= i <= P }")
    assert trip_count(unbounded) is None and trip_bound(unbounded) is None


FC = """def fc_relu(float(B, M) I, float(N, M) W, float(N) bias) -> (O) {
    O(b, n) +=! I(b, m) * W(n, m)
    O(b, n) = fmax(O(b, n) + bias(n), 0)
}"""


def test_one_element_per_thread_is_not_a_partial_tile():
    """The split-K epilogue of fc + bias + relu runs one element per thread (``n = 16 * _bx +
    _tx``): every thread takes one value of its band, a different one (its position), which is
    a full tile (values are compared relative to their least at each prefix), so the kernel
    keeps its ``unroll`` marks and the code it had."""
    fn = tc.define(FC)
    values = {"B": 1024, "M": 2048, "N": 1024}
    state = compiler.lower(fn.ir, values, MO.default_for(fn, "cuda", values), "cuda")
    text = format_loops(build_ast(state))
    assert text.count("// kernel") == 2 and "S2(" in text
    assert f"// {UNROLL_MARK}\n" in text and PARTIAL_MARK not in text, text


# tuning candidates of the benchmark's matmul that took 15 s and 5 s of CPU to compile
# (`tools/fuzz_compile.py --suite bench`, seed 0, candidates 60 and 96): one thread per block
ONE_THREAD_REGISTERS = {
    "block": [16, 16], "copy_bytes": 16, "double_buffer": True, "fusion": "preserve3coincident",
    "grid": [1024, 1024], "register_interleave": [0, 4], "register_tile": [8, 8],
    "tile_sizes": [128, 8, 8], "unroll_copy_shared": True, "unroll_factor": 16,
    "use_private_memory": True, "use_shared_memory": True}
FEW_THREADS_SPLIT_K = {
    "block": [2, 32, 8], "copy_transposed": True, "double_buffer": True, "fusion": "min",
    "grid": [1024, 1, 8], "register_interleave": [4, 4], "register_tile": [8, 4], "split_k": 2,
    "tile_sizes": [64, 4, 256], "unroll_copy_shared": True, "unroll_factor": 2,
    "use_private_memory": True, "use_shared_memory": True}


def _loops_of(options: dict, m: int = 256, k: int = 256, n: int = 256) -> str:
    fn = tc.define(MM)
    opts = MO.from_dict({**MO.cuda_contraction().to_dict(), **options})
    state = compiler.lower(fn.ir, {"M": m, "K": k, "N": n}, opts, "cuda")
    return format_loops(build_ast(state))


def test_a_statement_of_some_iterations_keeps_llvm_unrolling():
    """A register tile below which the accumulators' initialisation runs at the first k step
    only (``if (c2 == 0) S0_init(...)``) stays loops under its ``unroll`` mark, the guard in
    each unrolled copy (isl's unrolling kept the same guards: 512 calls of each statement)."""
    text = _loops_of(ONE_THREAD_REGISTERS)
    assert "block=1,1,1" in text and f"// {UNROLL_MARK}\n" in text
    assert text.count("S0(") == text.count("S0_init(") == 1, text


def test_a_block_of_few_threads_keeps_its_shared_copy_loops():
    """isl unrolls shared-memory copies of at most `MAX_UNROLLED_COPIES` per thread: a block
    of one thread copying a 4x256 tile keeps its loop (it got 1,024 copy statements)."""
    from tcmlir.passes.promote_shared import MAX_UNROLLED_COPIES

    text = _loops_of(FEW_THREADS_SPLIT_K)
    assert "block=1,1,1" in text
    assert len(re.findall(r"cp(v?in|v?next)_\w+\(", text)) <= 2 * MAX_UNROLLED_COPIES, text
