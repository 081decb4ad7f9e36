"""Memory promotion (register-tile, promote-shared, promote-private) without a GPU.

* The corpus under promotion option sets runs on the CUDA simulator (`tcmlir.simulate`: every
  block and thread, barriers, shared-memory race and unwritten-read detection) against each
  case's independent numpy oracle, at awkward sizes.
* Planted bugs (copies scheduled so that isl drops instances; the trailing barrier left out)
  must be caught by the simulator, so these tests cannot pass by accident.
* The promoted tree prints in isl syntax and re-parses; copies cover exactly the footprints;
  buffer accesses stay in their boxes; the PTX of the corpus with promotion assembles with
  ptxas; the default contraction kernel uses no local memory.
"""

from __future__ import annotations

import dataclasses
import shutil
import subprocess

import islpy as isl
import numpy as np
import pytest
from conftest import ptxas_verbose
from corpus import assert_outputs_close
from corpus.programs import CASES, case_by_name

import tcmlir as tc
from tcmlir import compiler
from tcmlir.options import contraction_access
from tcmlir.poly.loops import build_ast, format_loops
from tcmlir.poly.scop import maps_of
from tcmlir.simulate import SimulationError, simulate_call

MO = tc.MappingOptions
MM = "def mm(float(M,K) A, float(K,N) B) -> (C) { C(m,n) +=! A(m,k) * B(k,n) }"

SINGLE_128 = (MO.cuda_contraction().tile(128, 128, 8).register_tiling(8, 8).double_buffering(False)
              .map_to_blocks(2, 2))
SIM_SETS = {
    "tile16x16x8-r2x2": MO.cuda_contraction().tile(16, 16, 8).register_tiling(2, 2).map_to_blocks(3, 3),
    "tile8x16x4-r4x2": MO.cuda_contraction().tile(8, 16, 4).register_tiling(4, 2).map_to_blocks(2, 3),
    "tile16x8x4-r2x2-double": MO.cuda_contraction().tile(16, 8, 4).register_tiling(2, 2)
    .double_buffering().map_to_blocks(2, 2),
    "naive8x8x4-shared": MO.naive().tile(8, 8, 4).map_to_threads(4, 4).map_to_blocks(2, 2)
    .shared_memory(True),
    "block5x3-shared": MO.naive().tile(8, 8, 8).map_to_threads(5, 3).map_to_blocks(2, 2)
    .shared_memory(True),
}
# Cases whose kernels the simulator runs (no map-reduction block combine) and that finish
# in well under a second at their smallest size.
SIM_CASES = ["matmul_transposed", "batch_matmul", "batch_matmul_transposed", "conv2d_bias",
             "strided_conv_where", "fc_bias_relu", "mlp2_temporary", "transpose",
             "float64_matmul_and_exp", "softmax_temporaries", "elementwise_chain", "casts"]


# PTX + ptxas for the cases where promotion changes the kernels (the rest of the corpus
# compiles under these options on the GPU machine, tests/test_gpu_corpus.py)
PTX_CASES = {"matmul", "matmul_transposed", "batch_matmul", "batch_matmul_transposed", "conv2d",
             "group_conv", "fc_bias_relu", "mlp2_temporary", "float64_matmul_and_exp", "float16",
             "bfloat16", "transpose", "maxpool", "softmax_temporaries"}


@pytest.mark.parametrize("opts", list(SIM_SETS))
@pytest.mark.parametrize("name", SIM_CASES)
def test_corpus_on_the_simulator(name, opts, rng):
    case = case_by_name(name)
    sizes = case.sizes[0]
    fn = tc.define(case.source, name=case.entry, target="numpy")
    inputs = case.make_inputs(rng, **sizes)
    got = simulate_call(fn.ir, list(inputs), SIM_SETS[opts])
    assert_outputs_close(got, case.expected(*[np.copy(x) for x in inputs]), case.rtol,
                         context=f"{name} {sizes} {opts}")


@pytest.mark.parametrize("shape", [(1, 1, 1), (19, 11, 23), (16, 8, 16), (33, 5, 7), (8, 16, 128)])
def test_matmul_awkward_sizes_on_the_simulator(shape, rng):
    m, k, n = shape
    fn = tc.define(MM, target="numpy")
    a = rng.standard_normal((m, k)).astype(np.float32)
    b = rng.standard_normal((k, n)).astype(np.float32)
    opts = (SINGLE_128 if shape == (8, 16, 128) else SIM_SETS["tile16x16x8-r2x2"])
    (c,) = simulate_call(fn.ir, [a, b], opts)
    assert_outputs_close((c,), ((a.astype(np.float64) @ b).astype(np.float32),), 1e-5)


def _buffers(source: str, sizes: dict, opts) -> list:
    state = compiler.lower(tc.define(source).ir, sizes, opts, "cuda")
    return list(state.promotion.buffers) if state.promotion else []


def test_contraction_promotes_both_operands_and_the_accumulator():
    bufs = {b.name: b for b in _buffers(MM, {"M": 200, "K": 100, "N": 256}, MO.cuda_contraction())}
    assert set(bufs) == {"A_sh0", "B_sh0", "C_reg0"}
    assert bufs["A_sh0"].box.extent == (128, 16) and bufs["A_sh0"].order == (1, 0)  # k-major
    assert bufs["B_sh0"].storage == (16, 68)  # padded innermost dimension
    assert bufs["A_sh0"].stages == bufs["B_sh0"].stages == 2  # double-buffered
    assert bufs["C_reg0"].box.extent == (8, 4) and not bufs["C_reg0"].copy_in
    assert bufs["C_reg0"].fill == 0  # S0_init runs on the registers before the loop


TRANSPOSE = "def tr(float(N, M) A) -> (B) { B(m, n) = A(n, m) }"


def test_transpose_goes_through_a_padded_shared_tile():
    """Threads along x read A(n, m) down a column: A's 64 x 64 tile is copied by rows
    (coalesced) into a buffer padded by one element, so the column reads hit 32 banks."""
    opts = MO.default_for(tc.define(TRANSPOSE), "cuda")
    assert opts.use_shared_memory
    (buf,) = _buffers(TRANSPOSE, {"N": 256, "M": 128}, opts)
    assert buf.tensor == "A" and buf.order == (0, 1) and buf.storage == (64, 65)
    # an elementwise read along rows stays unpromoted
    assert _buffers("def f(float(N, M) A) -> (B) { B(n, m) = A(n, m) * 2 }", {"N": 64, "M": 64},
                    opts) == []


@pytest.mark.parametrize("shape", [(37, 70), (1, 5), (33, 1), (64, 32)])
def test_transpose_default_is_simulated_correct(shape, rng):
    fn = tc.define(TRANSPOSE)
    a = rng.standard_normal(shape).astype(np.float32)
    (b,) = simulate_call(fn.ir, [a], MO.default_for(fn, "cuda"))
    np.testing.assert_array_equal(b, a.T)


def test_planted_copy_schedule_bug_is_caught(monkeypatch, rng):
    """Scheduling the copies by their element coordinates under the modulo thread filter makes
    isl drop copy instances (seen on the H200 as wrong results): the simulator must see it."""
    import tcmlir.passes.promote_shared as ps

    monkeypatch.setattr(ps, "copy_band",
                        lambda copy_set, buf, n, ahead=False, lanes=1: ps.band_of_copy(copy_set, n, len(buf.box.extent)))
    fn = tc.define(MM, target="numpy")
    a = rng.standard_normal((8, 16)).astype(np.float32)
    b = rng.standard_normal((16, 128)).astype(np.float32)
    with pytest.raises(SimulationError, match="before anything wrote it"):
        simulate_call(fn.ir, [a, b], SINGLE_128)


def test_planted_missing_barrier_is_a_race(monkeypatch, rng):
    import tcmlir.passes.promote_shared as ps

    real = ps.graft
    monkeypatch.setattr(ps, "graft", lambda node, ext, parts, *, before:
                        real(node, ext, parts, before=before) if before else node)
    fn = tc.define(MM, target="numpy")
    a = rng.standard_normal((16, 24)).astype(np.float32)
    b = rng.standard_normal((24, 16)).astype(np.float32)
    with pytest.raises(SimulationError, match="race on shared"):
        simulate_call(fn.ir, [a, b], SIM_SETS["tile16x16x8-r2x2"])


@pytest.mark.parametrize("double", [False, True], ids=["single", "double-buffered"])
def test_promoted_tree_reparses_and_copies_cover_the_footprints(double):
    fn = tc.define(MM)
    opts = MO.cuda_contraction().double_buffering(double)
    state = compiler.lower(fn.ir, {"M": 200, "K": 100, "N": 130}, opts, "cuda")
    text = str(state.schedule)
    assert "extension" in text and "cpin_A_sh0" in text
    assert ("cpnext_A_sh0" in text and "wait_0_0" in text) if double else "sync_0_0" in text
    again = dataclasses.replace(state, schedule=isl.Schedule.read_from_str(state.ctx, text))
    assert format_loops(build_ast(again)) == format_loops(build_ast(state))
    # the copy-in instances of each shared buffer (the first tile's, and the next tile's
    # issued one iteration early), per tile, are exactly what the kernel reads of the tensor
    ext = []

    def visit(node):
        if node.get_type() == isl.schedule_node_type.extension:
            ext.append(node.extension_get_extension())
        return True

    state.schedule.get_root().foreach_descendant_top_down(visit)
    for buf in state.promotion.buffers:
        if buf.space != "shared":
            continue
        copied = None
        for kind in ("cpin", "cpnext"):
            for m in (m for e in ext for m in maps_of(e)
                      if m.get_tuple_name(isl.dim_type.out) == f"{kind}_{buf.name}"):
                got = m.range().reset_tuple_id()                     # (p, a)
                if kind == "cpnext":                                 # issued at tile p - 1
                    got = got.apply(_shift_map(got, buf.n_prefix - 1, state.ctx))
                copied = got if copied is None else copied.union(got)
        read = buf.prefix.reverse().apply_range(state.scop.reads.intersect_domain(buf.scope))
        want = next(m for m in maps_of(read) if m.get_tuple_name(isl.dim_type.out) == buf.tensor)
        want = want.wrap().flatten().reset_tuple_id()             # [p] -> T[a]  as (p, a)
        want = want.align_params(copied.get_space().params())
        copied = copied.align_params(want.get_space().params())
        assert copied.is_equal(want), buf.name


def _shift_map(s: isl.Set, dim: int, ctx: isl.Context) -> isl.Map:
    """``{ [x] -> [x + e_dim] }`` over the space of ``s``."""
    n = s.dim(isl.dim_type.set)
    params = s.get_space().params()
    pn = ", ".join(params.get_dim_name(isl.dim_type.param, i)
                   for i in range(params.dim(isl.dim_type.param)))
    names = ", ".join(f"x{i}" for i in range(n))
    shifted = ", ".join(f"x{i} + 1" if i == dim else f"x{i}" for i in range(n))
    return isl.Map.read_from_str(ctx, f"[{pn}] -> {{ [{names}] -> [{shifted}] }}")


@pytest.mark.skipif(shutil.which("ptxas") is None, reason="ptxas is not installed")
def test_corpus_ptx_with_promotion_assembles(tmp_path, rng):
    opts = [MO.cuda_contraction(), MO.naive().shared_memory(True)]
    failures = []
    for case in [c for c in CASES if c.name in PTX_CASES]:
        sizes = case.sizes[-1]
        fn = tc.define(case.source, name=case.entry)
        inputs = case.make_inputs(rng, **sizes)
        for o in opts:
            try:
                ptx = fn.compile(*inputs, options=o, target="cuda", arch="sm_90").ptx
            except tc.TCError as exc:
                failures.append(f"{case.name}: {exc}")
                continue
            path = tmp_path / f"{case.name}.ptx"
            path.write_text(ptx)
            r = subprocess.run(["ptxas", "-arch=sm_90", str(path), "-o", str(tmp_path / "k.cubin")],
                               capture_output=True, text=True)
            if r.returncode:
                failures.append(f"{case.name} {o}: {r.stderr[:300]}")
    assert not failures, "\n".join(failures)


@pytest.mark.skipif(shutil.which("ptxas") is None, reason="ptxas is not installed")
def test_default_matmul_kernel_resources(tmp_path):
    fn = tc.define(MM)
    a = np.zeros((4096, 4096), np.float32)
    kernel = fn.compile(a, a, target="cuda", arch="sm_90")
    # 1024 tiles of 128 x 128, B read as interleaved groups of 4, 16-byte copies unrolled
    assert kernel.options == contraction_access(MO.cuda_contraction((128, 128, 16), (8, 8)))
    assert kernel.options.register_interleave == (0, 4) and kernel.options.copy_bytes == 16
    ptx = kernel.ptx
    assert "ld.shared.v4" in ptx and "fma.rn.f32" in ptx and "cp.async.cg.shared.global" in ptx
    assert ".local" not in ptx
    info = ptxas_verbose(tmp_path, ptx, "mm")
    assert "0 bytes spill stores" in info and "0 bytes spill loads" in info


@pytest.mark.parametrize("shape, tile", [
    ((4096, 4096), (128, 64, 16)),    # B(n, k) copied an element at a time by the 8x8 kernel
    ((1536, 2048), (64, 64, 16)),     # 128 x 128 tiles: 192 blocks, 60 SMs with one block alone
    ((1024, 1024), (64, 64, 16)),     # 256 blocks: two per SM
    ((128, 1024), (64, 32, 16)),      # TMM: 64 blocks of 64 x 32 (k = 64: too short to split)
])
def test_contraction_default_tiles_by_size(shape, tile):
    """default_for picks the contraction tiles the contraction model predicts fastest."""
    from tcmlir.options import CONTRACTION_TILES

    fn = tc.define("def tmm(float(M,K) A, float(N,K) B) -> (C) { C(m,n) +=! A(m,k) * B(n,k) }")
    opts = MO.default_for(fn, "cuda", {"M": shape[0], "N": shape[1], "K": 64})
    reg = dict(CONTRACTION_TILES)[tile]
    assert opts == contraction_access(MO.cuda_contraction(tile, reg))
    assert opts.thread_block() == (16, 16)
    # sizes unknown: 128 x 64
    assert MO.default_for(fn, "cuda") == contraction_access(MO.cuda_contraction())


def test_batched_contraction_default_is_simulated_correct():
    tbmm = "def tbmm(float(B,N,K) X, float(B,M,K) Y) -> (Z) { Z(b,n,m) +=! X(b,n,k) * Y(b,m,k) }"
    fn = tc.define(tbmm)
    opts = MO.default_for(fn, "cuda", {"B": 3, "N": 5, "M": 7, "K": 11})
    assert opts == MO.cuda_batched_contraction()
    rng = np.random.default_rng(1)
    x, y = rng.standard_normal((3, 33, 11)), rng.standard_normal((3, 7, 11))
    x, y = x.astype(np.float32), y.astype(np.float32)
    out = simulate_call(fn.ir, [x, y], opts)
    out = out[0] if isinstance(out, (tuple, list)) else out
    np.testing.assert_allclose(out, np.einsum("bnk,bmk->bnm", x, y), rtol=1e-5, atol=1e-5)


def test_register_tile_options_round_trip_and_pipeline():
    o = MO.naive().tile(64, 32, 8).register_tiling(4, 2).shared_memory(True).private_memory(True)
    assert MO.from_json(o.to_json()) == o
    assert o.thread_block() == (16, 16)
    pipe = o.to_pipeline("cuda")
    assert "register-tile{sizes=4,2}" in pipe and "map-to-threads{block=16,16}" in pipe
    assert pipe.endswith("promote-shared{max-bytes=49152,unroll-copies=false,double-buffer=false},promote-private")
    with pytest.raises(tc.OptionsError, match="multiples"):
        MO.naive().tile(30, 32).register_tiling(4, 4).to_pipeline("cuda")


def test_no_promotion_without_reuse():
    """An elementwise kernel reads each element once: nothing to promote."""
    assert _buffers("def f(float(N, M) A) -> (B) { B(n, m) = A(n, m) * 2 }", {"N": 64, "M": 64},
                    MO.naive().shared_memory(True)) == []


@pytest.mark.parametrize("name", ["relu_ternary", "unary_builtins", "stencil_offsets"])
def test_elementwise_default_on_the_simulator(name, rng):
    """The cuda default of 1-D elementwise programs (`gpu_defaults.elementwise_defaults`:
    tiles over blocks, a grid-stride loop), shrunk so that tiles, threads and the grid wrap."""
    from tcmlir.gpu_defaults import elementwise_defaults

    case = case_by_name(name)
    fn = tc.define(case.source, name=case.entry, target="numpy")
    opts = elementwise_defaults(tc.MappingOptions, fn.ir)
    assert opts is not None and opts == MO.default_for(fn, "cuda")
    for sizes in case.sizes:
        inputs = case.make_inputs(rng, **sizes)
        got = simulate_call(fn.ir, list(inputs), opts.tile(16).map_to_threads(4).map_to_blocks(3))
        assert_outputs_close(got, case.expected(*[np.copy(x) for x in inputs]), case.rtol)


def test_planted_box_too_small_is_refused_by_the_proof(monkeypatch):
    """A box one slot short along a dimension: the isl proof in the pass must refuse it."""
    import tcmlir.passes.promote_shared as ps

    from tcmlir.poly.promotion import Box

    real = ps.compute_box

    def short(fp):
        box = real(fp)
        return None if box is None else Box(box.lo, box.stride, (box.extent[0] - 1, *box.extent[1:]))

    monkeypatch.setattr(ps, "compute_box", short)
    with pytest.raises(AssertionError, match="leaves the box"):
        compiler.lower(tc.define(MM).ir, {"M": 64, "K": 64, "N": 64}, MO.cuda_contraction(), "cuda")


@pytest.mark.parametrize("name", ["fused_diagonal_stencil", "reversed_temporary"])
def test_several_reads_of_one_tensor_in_a_statement_promote(name, rng):
    """A statement reading one tensor twice (a stencil's A(i) and A(i + 1)) gives isl a read
    map that is not a function: the stride analysis takes the accesses one by one."""
    case = case_by_name(name)
    fn = tc.define(case.source, case.entry)
    inputs = case.make_inputs(rng, **case.sizes[-1])
    for opts in (MO.naive().shared_memory(True), MO.cuda_contraction()):
        got = simulate_call(fn.ir, list(inputs), opts)
        assert_outputs_close(got, case.expected(*inputs), case.rtol, context=f"{name} {opts}")


def test_a_box_whose_span_isl_writes_with_a_denominator_still_compiles():
    # a tuner candidate (split-K fc, min fusion, 4 x 256 tiles, 1 x 4 register tiles): isl wrote
    # a footprint's span with a rational denominator and max_val raised isl.Error out of the
    # compile (found by tools/fuzz_compile.py); the span is floored (its values are integers)
    fc = """def fc(float(B,M) I, float(N,M) W1, float(N) B1) -> (O1) {
        O1(b, n) +=! I(b, m) * W1(n, m)
        O1(b, n) = fmax(O1(b, n) + B1(n), 0) }"""
    opts = tc.MappingOptions.from_dict({
        **tc.MappingOptions.naive().to_dict(), "block": [8, 1], "copy_bytes": 16,
        "copy_transposed": True, "fusion": "min", "grid": [8], "register_tile": [1, 4],
        "split_k": 2, "tile_sizes": [4, 256, 0], "unroll_factor": 1,
        "use_private_memory": True, "use_shared_memory": True})
    state = compiler.lower(tc.define(fc).ir, {"B": 30, "M": 70, "N": 50}, opts, "cuda")
    assert "promote" in opts.to_pipeline("cuda") and state.schedule is not None
