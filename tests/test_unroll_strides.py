"""`unroll` on loops given to threads: every instance runs once, whatever the stride.

A point loop mapped to threads by ``v mod B = tx`` takes every B-th value. Strip-mining it by a
factor below B used to put one iteration per thread in each strip, and isl (islpy 2026.2.2)
builds a wrong AST for some of those strips: a 2048^3 matmul tuned on the H100 got candidates
(tile 16x128x256, 32 threads along n, unroll 16) whose initialisation kernel wrote a quarter of
C; the tuner's check rejected them, a user passing those options got NaNs. `unroll_band` now
strip-mines by ``factor`` iterations *of a thread* (``factor * stride`` values).
"""

from __future__ import annotations

import dataclasses

import islpy as isl
import mma_emulator as emu
import numpy as np
import pytest
from tcmlir.passes.unroll import member_stride, unroll_band

import tcmlir as tc
from tcmlir.binding import bind_sizes
from tcmlir.simulate import _expr


def _run(node: isl.AstNode, env: dict[str, int], hits: list[int]) -> None:
    """Walk an isl AST of one statement ``S(n)``, appending each ``n`` it runs."""
    kind = node.get_type()
    if kind == isl.ast_node_type.block:
        children = node.block_get_children()
        for i in range(children.n_ast_node()):
            _run(children.get_at(i), env, hits)
    elif kind == isl.ast_node_type.for_:
        name = node.for_get_iterator().get_id().get_name()
        env = dict(env)
        env[name] = _expr(node.for_get_init(), env)
        while _expr(node.for_get_cond(), env):
            _run(node.for_get_body(), env, hits)
            env[name] += _expr(node.for_get_inc(), env)
    elif kind == isl.ast_node_type.if_:
        if _expr(node.if_get_cond(), env):
            _run(node.if_get_then_node(), env, hits)
        elif node.if_has_else_node():
            _run(node.if_get_else_node(), env, hits)
    elif kind == isl.ast_node_type.mark:
        _run(node.mark_get_node(), env, hits)
    else:
        call = node.user_get_expr()
        hits.append(_expr(call.get_op_arg(1), env))


def _thread_loop(extent: int, block: int) -> isl.ScheduleNode:
    """``for n < extent`` with ``n mod block = tx``: the band a point loop becomes in
    `map-to-threads`."""
    dom = isl.UnionSet(f"[tx] -> {{ S[n] : 0 <= n < {extent} and 0 <= tx < {block} }}")
    node = isl.ScheduleNode.from_domain(dom).child(0)
    node = node.insert_filter(isl.UnionSet(f"[tx] -> {{ S[n] : (n - tx) mod {block} = 0 }}"))
    return node.child(0).insert_partial_schedule(isl.MultiUnionPwAff("[tx] -> [{ S[n] -> [(n)] }]"))


def test_isl_drops_instances_of_a_strip_narrower_than_the_thread_stride():
    # the isl behaviour the pass works around (if isl is fixed, this fails: the note in
    # passes/unroll.py can go, the pass stays right either way)
    dom = isl.UnionSet("[tx] -> { S[n] : 0 <= n <= 127 and (n - tx) mod 32 = 0 and 0 <= tx <= 31 }")
    node = isl.ScheduleNode.from_domain(dom).child(0).insert_partial_schedule(
        isl.MultiUnionPwAff("[tx] -> [{ S[n] -> [(floor((n)/16))] }]"))
    ast = isl.AstBuild.from_context(isl.Set("[tx] -> { : 0 <= tx <= 31 }")) \
        .node_from_schedule(node.get_schedule())
    hits: list[int] = []
    _run(ast, {"tx": 5}, hits)
    assert hits == [5]  # of 5, 37, 69, 101


@pytest.mark.parametrize("block", [8, 16, 32])
@pytest.mark.parametrize("extent", [48, 64, 128, 256])
@pytest.mark.parametrize("factor", [2, 4, 8, 16])
def test_unrolled_thread_loops_run_every_instance_once(block, extent, factor):
    node = _thread_loop(extent, block)
    assert member_stride(node) == block
    unrolled = unroll_band(node, factor)
    ast = isl.AstBuild.from_context(isl.Set(f"[tx] -> {{ : 0 <= tx < {block} }}")) \
        .node_from_schedule(unrolled.get_schedule())
    for tx in range(block):
        hits: list[int] = []
        _run(ast, {"tx": tx}, hits)
        assert hits == list(range(tx, extent, block)), (tx, ast.to_C_str())


def test_a_dense_loop_strips_by_the_factor():
    dom = isl.UnionSet("{ S[n] : 0 <= n < 20 }")
    node = isl.ScheduleNode.from_domain(dom).child(0).insert_partial_schedule(
        isl.MultiUnionPwAff("[{ S[n] -> [(n)] }]"))
    assert member_stride(node) == 1
    ast = isl.AstBuild.from_context(isl.Set("{ : }")).node_from_schedule(
        unroll_band(node, 8).get_schedule())
    hits: list[int] = []
    _run(ast, {}, hits)
    assert hits == list(range(20))
    assert ast.to_C_str().count("S(") == 8  # eight copies in the strip loop's body


MATMUL = "def mm(float(M,K) A, float(K,N) B) -> (C) { C(m,n) +=! A(m,k) * B(k,n) }"


@pytest.mark.parametrize("unroll", [4, 16])
def test_the_tuner_candidate_that_wrote_a_quarter_of_c(unroll):
    # the H100 candidate (block 16x16 normalised to 32x2, register tile 8x4), run on the host
    # machine that executes the emitted LLVM IR (tests/mma_emulator.py)
    opts = dataclasses.replace(
        tc.MappingOptions.naive().tile(16, 128, 256).map_to_threads(16, 16).map_to_blocks(128)
        .unroll(unroll), register_tile=(8, 4), use_shared_memory=True, use_private_memory=True,
        copy_transposed=True, fusion="min")
    fn = tc.define(MATMUL, target="cuda")
    rng = np.random.default_rng(0)
    a = rng.standard_normal((32, 512)).astype(np.float32)
    b = rng.standard_normal((512, 256)).astype(np.float32)
    kernel = fn.compile(a, b, target="cuda", arch="sm_90", options=opts)
    arrays = {"A": a.copy(), "B": b.copy(), "C": np.full((32, 256), np.nan, np.float32)}
    emu.run_kernel(kernel, arrays, bind_sizes(fn.ir, [a.shape, b.shape]))
    np.testing.assert_allclose(arrays["C"], a.astype(np.float64) @ b, rtol=1e-4, atol=1e-3)
