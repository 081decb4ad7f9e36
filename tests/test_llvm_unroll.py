"""Register tiles and unrolled strips stay loops for LLVM to unroll (issue 31, `poly.llvm_unroll`).

isl used to unroll them (an 8x8 register tile below a 16-step strip: 1024 statement calls in
the AST, each with its own access expressions and LLVM IR); now they are loops of constant trip
counts under an ``unroll`` mark, emitted with ``llvm.loop.unroll.full``. The PTX must keep the
same instruction mix (registers, no local memory, the same multiply-adds and loads); partial
tiles (sizes the tiles do not divide) go beside the full ones (tests/test_partial_tiles.py).
"""

from __future__ import annotations

import re

import islpy as isl
import numpy as np
import pytest

import tcmlir as tc
from tcmlir import compiler
from tcmlir.poly import llvm_unroll
from tcmlir.poly.llvm_unroll import PARTIAL_MARK, UNROLL_MARK, WALK_MARK, trip_count
from tcmlir.poly.loops import build_ast, format_loops

MO = tc.MappingOptions
MM = "def mm(float(M,K) A, float(K,N) B) -> (C) { C(m,n) +=! A(m,k) * B(k,n) }"
TMM = "def tmm(float(M,K) A, float(N,K) B) -> (C) { C(m,n) +=! A(m,k) * B(n,k) }"
GCONV = """def gconv(float(N,G,C,H,W) I, float(G,F,C,KH,KW) W1) -> (O) {
    O(n,g,f,h,w) +=! I(n,g,c,h+kh,w+kw) * W1(g,f,c,kh,kw)
}"""
FC = """def fc_relu(float(B, M) I, float(N, M) W, float(N) bias) -> (O) {
    O(b, n) +=! I(b, m) * W(n, m)
    O(b, n) = fmax(O(b, n) + bias(n), 0)
}"""
CASES = {  # name: (source, input shapes)
    "mm 256": (MM, [(256, 256), (256, 256)]),
    "mm 200x64x136": (MM, [(200, 64), (64, 136)]),  # a thread guard above the register loops
    "tmm 128x256x512": (TMM, [(128, 512), (256, 512)]),
    "gconv": (GCONV, [(4, 4, 16, 16, 16), (4, 16, 16, 3, 3)]),
    "fc relu": (FC, [(128, 256), (256, 256), (256,)]),
}


@pytest.fixture(autouse=True)
def _fresh_compiles(monkeypatch):
    monkeypatch.setenv("TCMLIR_ALWAYS_COMPILE", "1")  # no kernel of the other way from a cache


def _kernel(source: str, shapes: list[tuple[int, ...]], options: tc.MappingOptions | None = None):
    inputs = [np.zeros(s, np.float32) for s in shapes]
    return tc.define(source).compile(*inputs, target="cuda", arch="sm_90", options=options)


def _isl_unrolls_all(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(llvm_unroll, "for_llvm", lambda schedule, ranks=None, keep=frozenset(): (schedule, []))


def _mix(ptx: str) -> dict[str, int]:
    ops = ("fma.rn.f32", "ld.shared", "ld.global", "st.global", "cp.async", "ld.local",
           "st.local")
    return {op: len(re.findall(rf"^\s*{re.escape(op)}", ptx, re.M)) for op in ops}


@pytest.mark.parametrize("case", sorted(CASES))
def test_the_ptx_keeps_the_instruction_mix_of_isl_unrolling(case, monkeypatch):
    source, shapes = CASES[case]
    ours = _kernel(source, shapes)
    with monkeypatch.context() as m:
        _isl_unrolls_all(m)
        theirs = _kernel(source, shapes)
    assert f"// {UNROLL_MARK}" not in theirs.loops
    assert f"// {UNROLL_MARK}" in ours.loops
    assert _mix(ours.ptx) == _mix(theirs.ptx)
    assert "__local_depot" not in ours.ptx  # the register tiles stayed registers


def _unroll_loops(ast: isl.AstNode) -> list[isl.AstNode]:
    found = []

    def walk(n: isl.AstNode, below: bool) -> None:
        kind = n.get_type()
        if kind == isl.ast_node_type.mark:
            walk(n.mark_get_node(), below or n.mark_get_id().get_name() == UNROLL_MARK)
        elif kind == isl.ast_node_type.for_:
            if below:
                found.append(n)
            walk(n.for_get_body(), below)
        elif kind == isl.ast_node_type.if_:
            walk(n.if_get_then_node(), below)
            if n.if_has_else_node():
                walk(n.if_get_else_node(), below)
        elif kind == isl.ast_node_type.block:
            kids = n.block_get_children()
            for i in range(kids.n_ast_node()):
                walk(kids.get_at(i), below)

    walk(ast, False)
    return found


def test_the_default_matmul_register_tile_is_loops_of_constant_trip_counts():
    sizes = {"M": 4096, "N": 4096, "K": 4096}
    fn = tc.define(MM)
    state = compiler.lower(fn.ir, sizes, MO.default_for(fn, "cuda", sizes), "cuda")
    ast = build_ast(state)
    trips = sorted(trip_count(loop) for loop in _unroll_loops(ast))
    # k strip 16; registers 8 rows x (2 groups x 4 columns), for S0, cpinit and cpout
    assert trips == sorted([16, 8, 2, 4] + [8, 2, 4] * 2)
    text = format_loops(ast)
    assert text.count("S0(") == 1  # not 1024 calls
    assert text.count("cpinit_C_reg0(") == text.count("cpout_C_reg0(") == 1  # not 64 each


def test_partial_tiles_are_loops_beside_the_full_ones(monkeypatch):
    """Register tiles cut by the matrix's edge (8x8 registers of 128x128 tiles at 203x139):
    the register loops' bounds depend on the tile, so the partial tiles go under an
    ``unroll-partial`` mark beside the full ones (`poly.partial_tiles`, tests/test_partial_tiles.py)
    instead of isl's unrolling; no register spills to local memory either way."""
    big = MO.cuda_contraction((128, 128, 16), (8, 8))
    source, shapes = MM, [(203, 72), (72, 139)]
    ours = _kernel(source, shapes, big)
    assert f"// {UNROLL_MARK}\n" in ours.loops and f"// {PARTIAL_MARK}" in ours.loops
    assert ours.loops.count("S0(") <= 2
    with monkeypatch.context() as m:
        _isl_unrolls_all(m)
        theirs = _kernel(source, shapes, big)
    assert theirs.loops.count("S0(") >= 64  # an 8x8 register tile per k step, unrolled by isl
    assert "__local_depot" not in ours.ptx and "__local_depot" not in theirs.ptx


def test_loops_carry_the_full_unroll_request():
    fn = tc.define(MM)
    kernel = fn.compile(np.zeros((256, 256), np.float32), np.zeros((256, 256), np.float32),
                        target="cuda", arch="sm_90", options=MO.cuda_contraction((128, 128, 16), (8, 8)))
    ir_text = kernel.llvm_ir
    ids = re.findall(r"!llvm\.loop (!\d+)", ir_text)
    assert ids  # one distinct, self-referential loop id per unrolled loop
    for ident in ids:
        assert re.search(rf"^{ident} = distinct !{{ ?{ident}, !\d+ ?}}", ir_text, re.M), ident
    assert '!"llvm.loop.unroll.full"' in ir_text


def test_register_copies_start_at_zero_and_stay_loops():
    """tmm's accumulators (a register tile per thread): their initialisation and store are
    loops from 0 (shifted by the thread's first element), not one call per register."""
    source, shapes = CASES["tmm 128x256x512"]
    loops = _kernel(source, shapes).loops
    for copy in ("cpinit_", "cpout_"):
        assert loops.count(copy) == 1, loops
    assert re.search(r"// unroll\n\s+for \(int (c\d+) = 0; \1 <= \d; \1 \+= 1\)\n"
                     r"\s+for \(int (c\d+) = 0; \2 <= \d; \2 \+= 1\)\n\s+cpinit_\w+\(.*\+ \1, .*\+ \2\);",
                     loops), loops


SOFTMAX = """def softmax(float(N, D) X) -> (O) {
    mx(n) max=! X(n, d)
    e(n, d) = exp(X(n, d) - mx(n))
    s(n) +=! e(n, d)
    O(n, d) = e(n, d) / s(n)
}"""
LAYERNORM = """def layernorm(float(N, D) X) -> (O) {
    mean(n) +=! X(n, d) / D
    c(n, d) = X(n, d) - mean(n)
    var(n) +=! c(n, d) * c(n, d) / D
    O(n, d) = c(n, d) * rsqrt(var(n) + 1e-5)
}"""


@pytest.mark.parametrize("source", [SOFTMAX, LAYERNORM], ids=["softmax", "layernorm"])
def test_row_kernels_walk_their_lanes_in_the_code_generator(source, monkeypatch):
    """A row kernel's stride loops (one statement call per element a thread holds, which the
    row code generator takes one by one) are loops under an ``unroll-walk`` mark, which the
    code generator unrolls: isl's unrolling of them took 80% of a softmax's compile. The PTX
    is the same as isl's unrolling gave, byte for byte."""
    shapes = [(4096, 4096)]
    ours = _kernel(source, shapes)
    assert f"// {WALK_MARK}" in ours.loops and f"// {UNROLL_MARK}\n" not in ours.loops
    assert len(re.findall(r"S\d\(", ours.loops)) <= 6  # not 64 per phase
    with monkeypatch.context() as m:
        _isl_unrolls_all(m)
        theirs = _kernel(source, shapes)
    assert f"// {WALK_MARK}" not in theirs.loops
    assert ours.ptx == theirs.ptx
