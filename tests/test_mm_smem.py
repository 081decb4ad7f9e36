"""The matmul memory hierarchy options: interleaved register tiles and 16-byte shared copies.

* Options: `interleave_registers` / `vector_copies` round-trip through JSON (absent when off),
  reach the pipeline, and bad values are `OptionsError` / `PipelineError`.
* isl helpers: `compute_box(interleave=True)` compresses an interleaved thread footprint;
  `split_footprint` cuts a footprint into vector leaders and a one-element rest, exactly.
* The CUDA simulator runs matmul (and a 1-D convolution, whose tiles have a ragged rest)
  under the options at awkward sizes against numpy; planted bugs (a dropped rest, an
  unaligned leader) are caught, so the tests cannot pass by accident.
* PTX: the 4096^3 matmul under the options assembles with ptxas without spills, with the
  expected shared loads and cp.async widths; tmm and fc compile; an unaligned input gets
  one-element copies. GPU tests (marked) compare the options with numpy on the device.
"""

from __future__ import annotations

import re
import shutil

import islpy as isl
import numpy as np
import pytest
from conftest import ptxas_verbose

import tcmlir as tc
from tcmlir import compiler
from tcmlir.errors import OptionsError, PipelineError
from tcmlir.poly.loops import build_ast, format_loops
from tcmlir.poly.promotion import compute_box, interleaved_groups
from tcmlir.poly.vector_copy import split_footprint
from tcmlir.simulate import SimulationError, simulate_call

MO = tc.MappingOptions
MM = "def mm(float(M,K) A, float(K,N) B) -> (C) { C(m,n) +=! A(m,k) * B(k,n) }"
TMM = "def tmm(float(M,K) A, float(N,K) B) -> (C) { C(m,n) +=! A(m,k) * B(n,k) }"
FC = """def fc_relu(float(B, M) I, float(N, M) W, float(N) bias) -> (O) {
    O(b, n) +=! I(b, m) * W(n, m)
    O(b, n) = fmax(O(b, n) + bias(n), 0)
}"""
CONV1 = "def conv1(float(N, L) I, float(KW) F) -> (O) { O(n, w) +=! I(n, w + kw) * F(kw) }"
BIG = MO.cuda_contraction((128, 128, 16), (8, 8))  # the 4096^3 default


def _ctx() -> isl.Context:
    return isl.Context()


# ---------------------------------------------------------------- options


def test_options_round_trip_and_reach_the_pipeline():
    o = BIG.interleave_registers(0, 4).vector_copies(16, transposed=True)
    assert MO.from_json(o.to_json()) == o
    assert o.register_interleave == (0, 4) and o.copy_bytes == 16 and o.copy_transposed
    for key in ("register_interleave", "copy_bytes", "copy_transposed"):
        assert key not in BIG.to_json()  # off: the JSON (and cache keys) of before
    assert BIG.interleave_registers(0, 4).interleave_registers() == BIG
    pipe = o.to_pipeline("cuda")
    assert "register-tile{sizes=8,8,interleave=0,4}" in pipe
    assert "copy-bytes=16,copy-transposed=true}" in pipe
    from tcmlir.passes.pipeline import parse_pipeline

    passes = parse_pipeline(pipe)
    assert parse_pipeline(",".join(map(str, passes))) == passes  # prints and re-parses
    by_name = {p.name: p for p in passes}
    assert by_name["register-tile"].interleave == (0, 4)
    assert by_name["promote-shared"].copy_bytes == 16 and by_name["promote-shared"].copy_transposed
    assert "interleave" not in BIG.interleave_registers(0, 0).to_pipeline("cuda")
    assert not BIG.vector_copies(0, transposed=True).copy_transposed


@pytest.mark.parametrize("bad, match", [
    (lambda: BIG.interleave_registers(3, 0).to_pipeline("cuda"), "does not divide"),
    (lambda: BIG.interleave_registers(4, 4, 4).to_pipeline("cuda"), "a register tile size per width"),
    (lambda: BIG.vector_copies(12), "copy_bytes"),
    (lambda: BIG.interleave_registers(-1), ">= 0"),
])
def test_bad_options_are_options_errors(bad, match):
    with pytest.raises(OptionsError, match=match):
        bad()


def test_bad_pass_options_are_pipeline_errors():
    from tcmlir.passes.pipeline import parse_pipeline

    with pytest.raises(PipelineError, match="does not divide"):
        parse_pipeline("register-tile{sizes=8,8,interleave=0,3}")
    with pytest.raises(PipelineError, match="copy-bytes"):
        parse_pipeline("promote-shared{copy-bytes=3}")


# ---------------------------------------------------------------- isl helpers


def test_interleaved_groups_of_offsets():
    ctx = _ctx()
    fp = isl.Map.read_from_str(ctx, "[t] -> { [p] -> C[a] : 0 <= t < 16 and "
                                    "exists g, v : 0 <= g < 2 and 0 <= v < 4 and a = 128p + 4t + 64g + v }")
    box = compute_box(fp, interleave=True)
    assert box.extent == (8,) and box.groups == ((64, 4),)
    assert compute_box(fp).extent == (68,) and compute_box(fp).groups == ()  # off by default
    low = fp.dim_min(0)
    contiguous = isl.Map.read_from_str(ctx, "[t] -> { [p] -> C[a] : 0 <= t < 16 and 8t <= a - 128p < 8t + 8 }")
    assert interleaved_groups(contiguous, 0, contiguous.dim_min(0), 8) is None
    ragged = isl.Map.read_from_str(ctx, "{ [p] -> C[a] : 0 <= a - 10p < 6 and a - 10p != 2 }")
    assert interleaved_groups(ragged, 0, ragged.dim_min(0), 6) is None  # {0,1,3,4,5}: no pattern
    assert interleaved_groups(fp, 0, low, 68) == (64, 4)


def test_split_footprint_covers_exactly_once():
    ctx = _ctx()
    # a 1-D convolution's input tile: 2 rows of columns 8p .. 8p + 9 (clipped at 24)
    fp = isl.Map.read_from_str(ctx, "{ [p] -> I[r, c] : 0 <= p < 3 and 0 <= r < 2 and "
                                    "8p <= c <= 8p + 9 and c < 24 }")
    leaders, rest = split_footprint(fp, 4)
    want_leaders = isl.Map.read_from_str(ctx, "{ [p] -> I[r, c] : 0 <= p < 3 and 0 <= r < 2 and "
                                              "(c = 8p or c = 8p + 4) }")
    assert leaders.is_equal(want_leaders)
    want_rest = isl.Map.read_from_str(ctx, "{ [p] -> I[r, c] : 0 <= p < 2 and 0 <= r < 2 and "
                                           "8p + 8 <= c <= 8p + 9 }")
    assert rest.is_equal(want_rest)


# ---------------------------------------------------------------- schedules and buffers


def _state(source: str, sizes: dict, opts: MO):
    return compiler.lower(tc.define(source).ir, sizes, opts, "cuda")


def test_interleaved_threads_own_groups_spread_over_the_tile():
    sizes = {"M": 256, "K": 32, "N": 256}
    state = _state(MM, sizes, BIG.interleave_registers(0, 4))
    bufs = {b.name: b for b in state.promotion.buffers}
    assert bufs["C_reg0"].box.extent == (8, 8) and bufs["C_reg0"].box.groups == (None, (64, 4))
    loops = format_loops(build_ast(state))
    # columns 4 _tx + 64 g + v, g < 2, v < 4: 4 _tx + {0..3, 64..67} (the register loops stay
    # loops, under an `unroll` mark: LLVM unrolls them, issue 31)
    cols = re.search(r"for \(int (c\d+) = 0; \1 <= 1; \1 \+= 1\)\n\s+"
                     r"for \(int (c\d+) = 0; \2 <= 3; \2 \+= 1\)\n\s+"
                     r"S0\(128 \* _by \+ 8 \* _ty \+ c\d+, 128 \* _bx \+ 4 \* _tx \+ 64 \* \1 \+ \2,", loops)
    assert cols is not None, loops
    both = {b.name: b for b in _state(MM, sizes, BIG.interleave_registers(4, 4)).promotion.buffers}
    assert both["C_reg0"].box.groups == ((64, 4), (64, 4))


def test_vector_copies_of_the_matmul_tiles():
    sizes = {"M": 256, "K": 32, "N": 256}
    bufs = {b.name: b for b in _state(MM, sizes, BIG.vector_copies(16)).promotion.buffers}
    assert bufs["B_sh0"].copy_lanes == 4 and not bufs["B_sh0"].copy_scatter
    assert bufs["A_sh0"].copy_lanes == 1  # stored k-major: not without `transposed`
    bufs = {b.name: b for b in _state(MM, sizes, BIG.vector_copies(16, True)).promotion.buffers}
    assert bufs["A_sh0"].copy_lanes == 4 and bufs["A_sh0"].copy_scatter
    # a row length that is no multiple of 4 floats: one-element copies
    odd = {b.name: b for b in _state(MM, {"M": 256, "K": 32, "N": 254},
                                     BIG.vector_copies(16)).promotion.buffers}
    assert odd["B_sh0"].copy_lanes == 1
    loops = format_loops(build_ast(_state(MM, sizes, BIG.vector_copies(16))))
    assert "cpvin_B_sh0" in loops and "cpvnext_B_sh0" in loops and "cpin_B_sh0" not in loops


# ---------------------------------------------------------------- the simulator


SIM = {
    "interleave-cols": MO.cuda_contraction().tile(16, 16, 8).register_tiling(4, 4).map_to_blocks(3, 3)
    .interleave_registers(0, 2),
    "interleave-both-cyclic": MO.cuda_contraction().tile(8, 16, 4).register_tiling(4, 4)
    .map_to_blocks(2, 3).interleave_registers(1, 2).double_buffering(False),
    "vector": MO.cuda_contraction().tile(16, 16, 8).register_tiling(2, 2).map_to_blocks(3, 3)
    .vector_copies(16),
    "vector-transposed-single": MO.cuda_contraction().tile(16, 16, 8).register_tiling(2, 2)
    .map_to_blocks(3, 3).vector_copies(16, True).double_buffering(False),
    "all-unrolled": MO.from_dict({**MO.cuda_contraction().tile(16, 16, 8).register_tiling(4, 4)
                                  .map_to_blocks(2, 2).interleave_registers(2, 2)
                                  .vector_copies(16, True).to_dict(), "unroll_copy_shared": True}),
}


@pytest.mark.parametrize("opts", list(SIM))
def test_matmul_on_the_simulator(opts, rng):
    # interleaving at prime sizes (ragged tiles everywhere); vector copies need rows of a
    # multiple of 4 floats (the last tiles are still ragged: 13 rows, 12 = 8 + 4 k, 20 = 16 + 4 n)
    m, k, n = (13, 11, 17) if opts.startswith("interleave") else (13, 12, 20)
    fn = tc.define(MM, target="numpy")
    a = rng.standard_normal((m, k)).astype(np.float32)
    b = rng.standard_normal((k, n)).astype(np.float32)
    (c,) = simulate_call(fn.ir, [a, b], SIM[opts])
    np.testing.assert_allclose(c, a.astype(np.float64) @ b, rtol=1e-4, atol=1e-5)


CONV_OPTS = MO.naive().tile(2, 8, 4).map_to_threads(4, 2).map_to_blocks(2, 2).shared_memory(True)


def _conv_inputs(rng, n=3, length=24, kw=7):
    return (rng.standard_normal((n, length)).astype(np.float32),
            rng.standard_normal((kw,)).astype(np.float32))


def _conv_ref(i, f):
    w = i.shape[1] - f.shape[0] + 1
    return np.stack([sum(i[:, x + k].astype(np.float64) * f[k] for k in range(f.shape[0]))
                     for x in range(w)], 1)


@pytest.mark.parametrize("double", [False, True], ids=["single", "double-buffered"])
def test_vector_copies_with_a_ragged_rest_on_the_simulator(double, rng):
    opts = CONV_OPTS.vector_copies(16).double_buffering(double)
    state = _state(CONV1, {"N": 3, "L": 24, "KW": 7}, opts)
    loops = format_loops(build_ast(state))
    assert "cpvin_I_sh0" in loops and "cpin_I_sh0" in loops  # leaders and the rest
    assert ("cpvnext_I_sh0" in loops) == double
    fn = tc.define(CONV1, target="numpy")
    i, f = _conv_inputs(rng)
    (o,) = simulate_call(fn.ir, [i, f], opts)
    np.testing.assert_allclose(o, _conv_ref(i, f), rtol=1e-4, atol=1e-5)


def test_planted_dropped_rest_is_caught(monkeypatch, rng):
    import tcmlir.passes.promote_shared as ps

    real = ps.split_footprint
    monkeypatch.setattr(ps, "split_footprint", lambda fp, lanes: (real(fp, lanes)[0], fp.subtract(fp)))
    fn = tc.define(CONV1, target="numpy")
    with pytest.raises(SimulationError, match="before anything wrote it"):
        simulate_call(fn.ir, list(_conv_inputs(rng)), CONV_OPTS.vector_copies(16))


def test_planted_unaligned_leader_is_caught(monkeypatch, rng):
    """Tiles 6 wide start off the lanes: the pass keeps one-element copies; claiming the
    leaders aligned anyway must be seen by the simulator."""
    import tcmlir.passes.promote_shared as ps

    opts = MO.naive().tile(2, 6, 4).map_to_threads(3, 2).map_to_blocks(2, 2).shared_memory(True) \
        .vector_copies(16)
    bufs = {b.name: b for b in _state(CONV1, {"N": 3, "L": 24, "KW": 7}, opts).promotion.buffers}
    assert bufs["I_sh0"].copy_lanes == 1
    fn = tc.define(CONV1, target="numpy")
    i, f = _conv_inputs(rng)
    (o,) = simulate_call(fn.ir, [i, f], opts)
    np.testing.assert_allclose(o, _conv_ref(i, f), rtol=1e-4, atol=1e-5)
    monkeypatch.setattr(ps, "leaders_aligned", lambda *a: True)
    with pytest.raises(SimulationError, match="not 4-aligned"):
        simulate_call(fn.ir, [i, f], opts)


# ---------------------------------------------------------------- PTX




def _registers(info: str) -> list[int]:
    return [int(x) for x in re.findall(r"Used (\d+) registers", info)]


needs_ptxas = pytest.mark.skipif(shutil.which("ptxas") is None, reason="ptxas is not installed")


@needs_ptxas
def test_big_matmul_ptx_under_the_options(tmp_path):
    fn = tc.define(MM)
    a = np.zeros((4096, 4096), np.float32)
    ptx = fn.compile(a, a, options=BIG.interleave_registers(0, 4).vector_copies(16),
                     target="cuda", arch="sm_90").ptx
    info = ptxas_verbose(tmp_path, ptx, "mm")
    assert "0 bytes spill stores" in info and ".local" not in ptx, info
    assert max(_registers(info)) <= 128, info  # two blocks of 256 threads per SM
    # 2 x 2 vector shared reads per k step, B's 2 (interleaved) 64 floats apart; B's copies
    # (first tile, next tile) 16 bytes each, A's (stored k-major) 4 bytes each
    loads = re.findall(r"ld\.shared\.v4\.b32\s+\{[^}]*\}, \[(%rd\d+)(\+-?\d+)?\]", ptx)
    assert len(loads) == 4
    assert len(re.findall(r"cp\.async\.cg\.shared\.global.*16;", ptx)) == 2
    assert len(re.findall(r"cp\.async\.ca\.shared\.global.*4;", ptx)) == 2
    by_base: dict[str, set[int]] = {}
    for base, off in loads:
        by_base.setdefault(base, set()).add(int(off[1:]) if off else 0)
    assert any(len(v) == 2 and max(v) - min(v) == 256 for v in by_base.values()), loads


@needs_ptxas
def test_unaligned_input_gets_element_copies(tmp_path):
    from tcmlir.codegen.nvptx import compile_cuda

    state = _state(MM, {"M": 256, "K": 64, "N": 256}, BIG.vector_copies(16, True))
    ptx = compile_cuda(state, "sm_90", aligned=()).ptx  # aligned: test_big_matmul_ptx_...
    assert "cp.async.cg" not in ptx and "ld.global.nc.v4" not in ptx
    assert "cp.async.ca.shared.global" in ptx  # B one element at a time, still one tile ahead
    ptxas_verbose(tmp_path, ptx, "unaligned")


@needs_ptxas
@pytest.mark.parametrize("source, sizes", [(TMM, {"M": 128, "K": 1024, "N": 1024}),
                                           (FC, {"B": 1024, "M": 2048, "N": 1024})],
                         ids=["tmm", "fc"])
def test_tmm_and_fc_compile_under_the_options(tmp_path, source, sizes):
    fn = tc.define(source)
    opts = MO.default_for(fn, "cuda", sizes).interleave_registers(0, 2).vector_copies(16, True)
    state = compiler.lower(fn.ir, sizes, opts, "cuda")
    from tcmlir.codegen.nvptx import compile_cuda

    ptx = compile_cuda(state, "sm_90", aligned=tuple(t.name for t in fn.ir.tensors)).ptx
    assert "ld.global.nc.v4" in ptx  # both operands stored k-major: read 16 bytes at once
    info = ptxas_verbose(tmp_path, ptx, "case")
    assert "0 bytes spill stores" in info, info


# ---------------------------------------------------------------- on the GPU


GPU_SETS = {
    "interleave": BIG.interleave_registers(0, 4),
    "interleave-rows": BIG.interleave_registers(4, 4),
    "vector": BIG.vector_copies(16),
    "both": BIG.interleave_registers(0, 4).vector_copies(16),
    "transposed": BIG.interleave_registers(0, 4).vector_copies(16, True),
    "single-buffer": BIG.interleave_registers(0, 4).vector_copies(16, True).double_buffering(False),
}


@pytest.mark.gpu
@pytest.mark.parametrize("shape", [(512, 256, 512), (257, 67, 260), (17, 11, 23), (300, 129, 1028)])
@pytest.mark.parametrize("opts", list(GPU_SETS))
def test_matmul_options_on_gpu(opts, shape, rng):
    m, k, n = shape
    a = rng.standard_normal((m, k)).astype(np.float32)
    b = rng.standard_normal((k, n)).astype(np.float32)
    got = tc.define(MM, target="cuda")(a, b, options=GPU_SETS[opts])
    np.testing.assert_allclose(got, a.astype(np.float64) @ b, rtol=1e-4, atol=1e-3)


@pytest.mark.gpu
@pytest.mark.parametrize("offset", [1, 2])
def test_matmul_vector_copies_of_misaligned_inputs_on_gpu(offset, rng):
    m, k, n = 256, 64, 256
    flat_a = rng.standard_normal(m * k + 4).astype(np.float32)
    flat_b = rng.standard_normal(k * n + 4).astype(np.float32)
    a = flat_a[offset:offset + m * k].reshape(m, k)
    b = flat_b[offset:offset + k * n].reshape(k, n)
    got = tc.define(MM, target="cuda")(a, b, options=GPU_SETS["transposed"])
    np.testing.assert_allclose(got, a.astype(np.float64) @ b, rtol=1e-4, atol=1e-3)


@pytest.mark.gpu
@pytest.mark.parametrize("double", [False, True])
def test_conv_vector_copies_on_gpu(double, rng):
    i, f = _conv_inputs(rng, n=64, length=1024, kw=7)
    opts = MO.naive().tile(8, 32, 4).map_to_threads(32, 8).shared_memory(True) \
        .vector_copies(16).double_buffering(double)
    got = tc.define(CONV1, target="cuda")(i, f, options=opts)
    np.testing.assert_allclose(got, _conv_ref(i, f), rtol=1e-4, atol=1e-4)


@pytest.mark.gpu
@pytest.mark.parametrize("source, shapes", [(TMM, ((128, 1024), (1024, 1024))),
                                            (FC, ((256, 512), (128, 512), (128,)))],
                         ids=["tmm", "fc"])
def test_tmm_and_fc_options_on_gpu(source, shapes, rng):
    fn = tc.define(source, target="cuda")
    inputs = [rng.standard_normal(s).astype(np.float32) for s in shapes]
    sizes = dict(zip(("M", "K") if source == TMM else ("B", "M"), shapes[0], strict=True))
    sizes.update({"N": shapes[1][0]})
    opts = MO.default_for(fn, "cuda", sizes).interleave_registers(0, 2).vector_copies(16, True)
    got = fn(*inputs, options=opts)
    want = tc.define(source, target="numpy")(*inputs)
    np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-3)
