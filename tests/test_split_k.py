"""split-K (`passes/split_k.py`, `MappingOptions.split_k`): the rewrite against the reference
interpreter, the cpu target, the cuda pipeline on the simulator and through the fake driver's
launch plan, options, defaults, the tuner's space, the dump, PTX; GPU runs are marked."""

from __future__ import annotations

import numpy as np
import pytest
from conftest import assert_outputs_close, check_against_reference, run_program
from fake_cuda import install_fake, kernel_slots, simulate_with_host
from tcmlir.passes.split_k import (
    chunking,
    fold_statements,
    split_k,
    splittable,
    splittable_statements,
)

import tcmlir as tc
import tcmlir.defaults as defaults_module
from tcmlir import reference
from tcmlir.binding import bind_sizes
from tcmlir.codegen.ptx_tools import find_ptxas, ptxas_check
from tcmlir.dump import dump
from tcmlir.errors import OptionsError
from tcmlir.simulate import simulate_call
from tcmlir.tune.space import space_for

MO = tc.MappingOptions
MM = "def mm({t}(M,K) A, {t}(K,N) B) -> (C) {{ C(m,n) +=! A(m,k) * B(k,n) }}"
TMM = "def tmm(float(M,K) A, float(N,K) B) -> (C) { C(m,n) +=! A(m,k) * B(n,k) }"
FC = """def fc_relu(float(B, M) I, float(N, M) W, float(N) bias) -> (O) {
  O(b, n) +=! I(b, m) * W(n, m)
  O(b, n) = fmax(O(b, n) + bias(n), 0)
}"""
BMM = "def bmm(float(B,N,K) X, float(B,M,K) Y) -> (Z) { Z(b, n, m) +=! X(b, n, k) * Y(b, m, k) }"
ACC = """def acc(double(M,K) A, double(K,N) B, double(M,N) C0) -> (C) {
  C(m, n) = C0(m, n)
  C(m, n) += A(m, k) * B(k, n)
}"""
ROWSUM = "def rows(float(N,D) X) -> (S) { S(n) +=! X(n, d) }"
SHIFTED = "def sh(double(M,K) A, double(K) x) -> (y) { y(m) +=! A(m, k) * x(k) where k in 2:K }"


def _inputs(rng, fn, shapes, dtype=None):
    out = []
    for t, shape in zip(fn.ir.inputs, shapes, strict=True):
        dt = np.dtype(dtype or t.dtype.numpy)
        if dt.kind in "iu":
            out.append(rng.integers(-4, 5, size=shape).astype(dt))
        else:
            out.append(rng.standard_normal(shape).astype(dt))
    return out


def _ref(fn_ir, inputs):
    sizes = bind_sizes(fn_ir, [x.shape for x in inputs])
    outs = reference.run(fn_ir, {t.name: x for t, x in zip(fn_ir.inputs, inputs, strict=True)},
                         sizes)
    return tuple(outs[t.name] for t in fn_ir.outputs), sizes


# ------------------------------------------------------------------ the rewrite itself


def test_chunking_cuts_into_at_most_ways_chunks_covering_the_reduction_once():
    assert chunking(37, 4) == (10, 3, 7)      # 10 + 10 + 10 + 7
    assert chunking(3, 8) == (1, 3, 0)        # K < S: K chunks of one
    assert chunking(1024, 8) == (128, 8, 0)
    assert chunking(100, 8) == (13, 7, 9) and chunking(100, 8, 16) == (16, 6, 4)  # whole tiles
    assert chunking(100, 2, 16) == (64, 1, 36) and chunking(10, 4, 16) == (10, 1, 0)
    for extent in range(1, 60):
        for ways in (1, 2, 3, 4, 7, 16):
            kc, full, last = chunking(extent, ways)
            assert full * kc + last == extent and 0 <= last < kc
            assert full + (last > 0) <= ways


CASES = [  # source, input shapes, ways (awkward: remainders, K < S, primes, 1)
    (MM.format(t="double"), [(5, 37), (37, 3)], 4),
    (MM.format(t="double"), [(1, 3), (3, 1)], 8),
    (MM.format(t="int32"), [(4, 13), (13, 6)], 2),
    (TMM, [(7, 13), (11, 13)], 3),
    (FC, [(3, 17), (5, 17), (5,)], 16),
    (BMM, [(2, 3, 10), (2, 4, 10)], 3),
    (ACC, [(3, 9), (9, 4), (3, 4)], 4),
    (ROWSUM, [(3, 11)], 5),
    (SHIFTED, [(4, 11), (11,)], 4),
]


@pytest.mark.parametrize("source,shapes,ways", CASES)
def test_the_rewritten_function_computes_what_the_original_does(source, shapes, ways, rng):
    fn = tc.define(source, target="numpy")
    inputs = _inputs(rng, fn, shapes)
    expected, sizes = _ref(fn.ir, inputs)
    split = split_k(fn.ir, ways, sizes)
    assert split is not fn.ir and len(split.temporaries) == len(fn.ir.temporaries) + 1
    assert fold_statements(split)
    got, _ = _ref(split, inputs)
    assert_outputs_close(got, expected, context=str(split))


def test_the_rewrite_reads_nothing_outside_a_tensor_and_keeps_chunks_disjoint():
    fn = tc.define(MM.format(t="float"), target="numpy").ir
    split = split_k(fn, 4, {"M": 5, "K": 37, "N": 3})
    main, tail, fold = split.statements
    assert [r.name for r in main.ranges] == ["k_s", "m", "n", "k_c"]
    assert main.lhs == ("k_s", "m", "n")
    assert (str(main.ranges[0].hi), str(main.ranges[3].hi)) == ("3", "10")    # 3 chunks of 10
    assert (str(tail.ranges[0].lo), str(tail.ranges[0].hi), str(tail.ranges[3].hi)) == \
        ("3", "4", "7")                                                          # one of 7
    assert fold.reduction is None and not fold.reduction_indices
    assert [str(e) for e in split.temporaries[-1].shape] == ["4", "M", "N"]


def test_the_partial_sums_are_indexed_affinely():
    """P(s, m, n) reads A(m, s*KC + kc): no floor division or modulo in any index (the
    flattened P(s*M + m, n) read A(m2 mod M, (m2 div M)*KC + kc), and isl's AST generation of
    a promoted tbmm candidate took minutes over those divisions)."""
    from tcmlir import ir
    from tcmlir.affine import to_isl
    from tcmlir.dtypes import DType

    fn = tc.define(BMM, target="numpy").ir
    split = split_k(fn, 8, {"B": 500, "N": 26, "K": 72, "M": 26})
    for st in split.statements:
        reads = [x for x in ir.walk(st.rhs) if isinstance(x, ir.Read)]
        for idx in [i for r in reads for i in r.indices] + [ir.Index(n, DType.INT32) for n in st.lhs]:
            text = to_isl(idx)
            assert text is not None and "floor" not in text and "mod" not in text, (st, text)


def test_a_reduction_of_one_element_is_left_alone():
    fn = tc.define(MM.format(t="float"), target="numpy").ir
    assert split_k(fn, 4, {"M": 3, "K": 1, "N": 2}) is fn
    assert split_k(fn, 1, {"M": 3, "K": 64, "N": 2}) is fn


@pytest.mark.parametrize("source,why", [
    ("def f(float(N) X) -> (Y) { Y(i) = X(i) * 2 }", "not += or +=!"),
    ("def f(float(N,D) X) -> (Y) { Y(i) max=! X(i, j) }", "not += or +=!"),
    ("def f(float(N,C,H) I, float(C,K) W) -> (O) { O(n, h) +=! I(n, c, h + k) * W(c, k) }",
     "2 reduction indices"),
    ("def f(float(N,D) X) -> (Y) { Y(i) +=! X(i, j) * j }", "as a value"),
    ("def f(float(N,D) X, int32(D) idx) -> (Y) { Y(i) +=! X(i, idx(j)) }", "gather"),
])
def test_unsplittable_statements_say_why_and_split_k_on_them_is_an_options_error(source, why):
    fn = tc.define(source, target="numpy").ir
    assert why in splittable(fn, fn.statements[-1])
    assert splittable_statements(fn) == ()
    with pytest.raises(OptionsError, match="no reduction to split"):
        split_k(fn, 4, {s: 4 for s in fn.sizes})
    with pytest.raises(OptionsError, match="no reduction to split"):
        tc.define(source, target="cpu").compile(
            *[np.zeros((4,) * t.rank, t.dtype.numpy) for t in fn.inputs],
            options=MO().split_reduction(4))


# ------------------------------------------------------------------ compiled: cpu, simulated cuda


@pytest.mark.parametrize("source,shapes,ways,dtype", [
    (MM.format(t="double"), [(2, 3), (3, 5)], 8, None),
    (MM.format(t="int32"), [(3, 29), (29, 4)], 3, None),
    (MM.format(t="float16"), [(3, 21), (21, 4)], 4, None),      # accumulates in float32
    (FC, [(3, 17), (5, 17), (5,)], 4, None),
    (ACC, [(3, 9), (9, 4), (3, 4)], 2, None),
])
def test_split_k_on_the_cpu_target_matches_the_reference(source, shapes, ways, dtype, rng):
    fn = tc.define(source, target="cpu")
    inputs = _inputs(rng, fn, shapes, dtype)
    opts = MO.naive().tile(4, 4, 4).split_reduction(ways)
    assert f"split-k{{ways={ways},align=4}}" in opts.to_pipeline("cpu")
    check_against_reference(source, inputs, "cpu", options=opts)


SIM = MO.cuda_contraction((4, 4, 4), (2, 2))


@pytest.mark.parametrize("source,shapes,options", [
    (TMM, [(4, 37), (4, 37)], SIM.split_reduction(4)),           # a remainder chunk
    (MM.format(t="int32"), [(4, 3), (3, 8)], SIM.split_reduction(8)),  # K < S
    (TMM, [(6, 9), (5, 9)], SIM.split_reduction(2)),             # row tiles straddle chunks
    (FC, [(4, 13), (4, 13), (4,)], SIM.split_reduction(2)),      # prime K, bias + relu
    (BMM, [(2, 4, 6), (2, 4, 6)], MO(tile_sizes=(1, 4, 4, 4), block=(4, 4, 1), grid=(8, 8, 8),
                                     use_shared_memory=True, use_private_memory=True)
     .split_reduction(3)),
])
def test_split_k_through_the_cuda_pipeline_on_the_simulator(source, shapes, options, rng):
    fn = tc.define(source, target="numpy")
    inputs = _inputs(rng, fn, shapes)
    expected, _ = _ref(fn.ir, inputs)
    assert_outputs_close(simulate_call(fn.ir, inputs, options), expected, 1e-5)


@pytest.fixture(scope="module")
def default_kernels():
    """The cuda kernels a plain call compiles for the benchmark's tmm and fc (split-K)."""
    out = {}
    for name, source, shapes in (("tmm", TMM, [(128, 1024), (1024, 1024)]),
                                 ("fc", FC, [(1024, 2048), (1024, 2048), (1024,)])):
        fn = tc.define(source, target="cuda")
        out[name] = fn.compile(*[np.zeros(s, np.float32) for s in shapes], arch="sm_90")
    return out


def test_the_partials_get_more_blocks_and_the_fold_a_block_per_thread_block_tile(default_kernels):
    tmm, fc = default_kernels["tmm"], default_kernels["fc"]
    from tcmlir.options import contraction_access

    assert tmm.options == contraction_access(
        MO.cuda_contraction((64, 64, 16), (4, 4)).split_reduction(8))
    partial, fold = tmm.runner.image.kernels
    assert partial.grid == (16, 2, 8)                     # unsplit: 16 x 2 = 32 blocks;
    # the chunks on a grid dimension of their own (the partial sums' chunk member,
    # passes/split_k)
    assert fold.grid == (64, 8, 1) and fold.block == (16, 16, 1)   # one element per thread
    assert "C_split" in tmm.runner.image.arg_order and tmm.compiled_ir is not None
    partial, fold = fc.runner.image.kernels               # fc: the fold fuses bias and relu
    assert partial.grid == (16, 8, 2) and fold.grid == (64, 64, 1)
    assert tc.define(TMM, target="cpu").compile(np.zeros((2, 3), np.float32),
                                                np.zeros((2, 3), np.float32)).compiled_ir is None


@pytest.mark.skipif(find_ptxas() is None, reason="ptxas not on PATH")
def test_the_default_split_kernels_of_tmm_and_fc_assemble_for_sm_90(default_kernels):
    for kernel in default_kernels.values():
        ptxas_check(kernel.ptx, "sm_90")


def test_the_launch_plan_allocates_the_partial_sums_on_the_device(monkeypatch, rng):
    """Through the fake driver: the plan takes the compiled function's temporaries from the
    device pool and the program's host build, run on the packed pointers, gives the result."""
    import tcmlir.cache.artifacts as artifacts
    from tcmlir.runtime.cuda_launch import CudaRunner

    driver, runtime = install_fake(monkeypatch)
    monkeypatch.setattr(artifacts, "make_cuda_runner",
                        lambda image, key, device=0: CudaRunner(image, device, runtime=runtime))
    a = rng.standard_normal((4, 37)).astype(np.float32)
    b = rng.standard_normal((4, 37)).astype(np.float32)
    opts = SIM.split_reduction(4)
    fn = tc.define(TMM, target="cuda")
    kernel = fn.compile(a, b, options=opts)
    host = tc.define(TMM, target="cpu").compile(a, b, options=opts)
    simulate_with_host(driver, kernel.runner.image, host)
    got = fn(a, b, options=opts)
    np.testing.assert_allclose(got, a @ b.T, rtol=1e-5, atol=1e-5)
    (plan,) = kernel.runner.plans
    slot = kernel.runner.image.arg_order.index("C_split")
    assert [s for s, _, _ in plan._temps] == [slot]
    launches = [c for c in driver.calls if c[0] == "cuLaunchKernel"]
    assert len(launches) == 2
    # the partial kernel writes C_split and the final one reads it: the same buffer
    first, second = (kernel_slots(kernel.runner.image, c[1], c[-1]) for c in launches)
    assert first["C_split"] != 0 and first["C_split"] == second["C_split"]
    assert "cuMemcpyDtoH" not in [c[0] for c in driver.calls[:driver.calls.index(launches[-1])]]


# ------------------------------------------------------------------ options, defaults, tuner, dump


def test_split_k_needs_every_size():
    with pytest.raises(OptionsError, match="needs every size fixed"):
        dump(TMM, "tmm.tc", None, "schedule", {"M": 8}, target="cuda",
             options=SIM.split_reduction(4))


def test_split_k_options_round_trip_and_validate():
    opts = MO.cuda_contraction().split_reduction(4)
    assert opts.split_k == 4 and MO.from_json(opts.to_json()) == opts
    assert "split_k" not in MO().to_json()                # the default: old JSON and cache keys
    old = MO().to_dict()
    assert MO.from_dict(old).split_k == 1
    with pytest.raises(OptionsError, match="split_k must be >= 1"):
        MO().split_reduction(0)
    with pytest.raises(OptionsError, match="parametric"):
        MO().split_reduction(2).with_parametric().to_pipeline("cuda")
    with pytest.raises(OptionsError, match="row_block"):
        MO().split_reduction(2).map_rows(128).to_pipeline("cuda")
    pipeline = opts.to_pipeline("cuda")
    assert pipeline.startswith("split-k{ways=4,align=16},schedule")  # chunks of whole k tiles
    assert "tile-folds{sizes=16,16}" in pipeline
    assert "split-k" not in MO.cuda_contraction().to_pipeline("cuda")


def test_default_for_splits_small_contractions_with_long_reductions(monkeypatch):
    tmm, fc = tc.define(TMM), tc.define(FC)
    mm = tc.define(MM.format(t="float"))
    # the contraction model's choices (`cuda_defaults.contraction_choice`): tmm's 8 x 16 tiles
    # of 128 x 64 would leave most SMs idle for its k = 1024
    d = MO.default_for(tmm, "cuda", {"M": 128, "K": 1024, "N": 1024})
    assert (d.split_k, d.tile_sizes, d.register_tile) == (8, (64, 64, 16), (4, 4))
    d = MO.default_for(fc, "cuda", {"B": 1024, "M": 2048, "N": 1024})
    assert (d.split_k, d.tile_sizes) == (2, (128, 64, 16))
    for n in (4096, 2048):   # 128x128 tiles fill the GPU: no split
        d = MO.default_for(mm, "cuda", {"M": n, "K": n, "N": n})
        assert (d.split_k, d.tile_sizes) == (1, (128, 128, 16))
    # a skinny product (16 rows): its few column tiles get several chunks each
    d = MO.default_for(mm, "cuda", {"M": 16, "K": 4096, "N": 4096})
    assert d.split_k > 1 and d.tile_sizes[0] > 16
    assert MO.default_for(tmm, "cuda", {"M": 128, "K": 256, "N": 1024}).split_k == 1  # short k
    assert MO.default_for(tmm, "cuda", {"M": 128, "K": 1031, "N": 1024}).split_k == 1  # prime
    assert MO.default_for(tmm, "cuda", None).split_k == 1                       # parametric
    assert MO.default_for(tmm, "cpu", {"M": 128, "K": 1024, "N": 1024}).split_k == 1
    monkeypatch.setattr(defaults_module, "SPLIT_K_DEFAULT", False)
    d = MO.default_for(tmm, "cuda", {"M": 128, "K": 1024, "N": 1024})
    assert (d.split_k, d.tile_sizes) == (1, (64, 32, 16))


def test_the_tuner_searches_split_k_for_contractions_only():
    import random

    space = space_for(tc.define(TMM).ir, "cuda")
    assert "split_k" in space.fields
    values = {space.sample(random.Random(s), MO.cuda_contraction()).split_k for s in range(40)}
    assert values <= {1, 2, 4, 8, 16} and len(values) > 2
    assert "split_k" not in space_for(tc.define(ROWSUM).ir, "cuda").fields
    assert "split_k" not in space_for(tc.define(TMM).ir, "cpu").fields
    assert "parametric" in space.why_invalid(MO.cuda_contraction().split_reduction(2)
                                             .with_parametric())


def test_the_dump_shows_the_split_program():
    text = dump(TMM, "tmm.tc", None, "pipeline,ir", {"M": 8, "K": 37, "N": 8}, target="cuda",
                options=SIM.split_reduction(4))
    assert "split-k{ways=4,align=4}" in text and "after split-k{ways=4,align=4}:" in text
    assert "temporary float32(4, M, N) C_split" in text
    assert "C_split(k_s, m, n) +=! (A(m, ((k_s * 12:int32) + k_c))" in text
    assert "C(m, n) = (((C_split(0:int32, m, n) + C_split(1:int32, m, n))" in text
    text = dump(TMM, "tmm.tc", None, "ir", None, target="cuda", options=SIM.split_reduction(4))
    assert "give M, K, N with --sizes" in text


# ------------------------------------------------------------------ on the GPU


@pytest.mark.gpu
@pytest.mark.parametrize("case", ["tmm", "fc", "tmm-remainder"])
@pytest.mark.parametrize("ways", [None, 1, 4, 16])
def test_split_k_on_the_gpu_matches_numpy(case, ways, rng):
    """The benchmark's tmm and fc (default options: split-K) and forced chunk counts, one with
    a remainder chunk (K = 1001), against numpy in float64."""
    source, shapes = {"tmm": (TMM, [(128, 1024), (1024, 1024)]),
                      "fc": (FC, [(1024, 2048), (1024, 2048), (1024,)]),
                      "tmm-remainder": (TMM, [(128, 1001), (1024, 1001)])}[case]
    fn = tc.define(source, target="cuda")
    inputs = _inputs(rng, fn, shapes)
    x = [v.astype(np.float64) for v in inputs]
    expected = x[0] @ x[1].T if source is TMM else np.maximum(x[0] @ x[1].T + x[2], 0)
    opts = MO.default_for(fn, "cuda", bind_sizes(fn.ir, [v.shape for v in inputs]))
    if case != "tmm-remainder":  # (the contraction model's choices)
        assert opts.split_k == {"tmm": 8, "fc": 2}[case]
    if ways is not None:
        opts = opts.split_reduction(ways)
    got = run_program(fn, inputs, options=opts)
    assert_outputs_close(got, (expected.astype(np.float32),), 1e-4, context=f"{case} {opts}")


def test_max_fusion_schedules_the_fold_after_the_partial_sums():
    # with `max` fusion isl searched for minutes for a schedule fusing a 96-row matmul's fold
    # with its 4-way partial sums (a tuning candidate timed out on the H200); the folds start a
    # group of their own (`sequence_at`), so the schedule is a sequence computed in a moment
    import threading

    import islpy as isl

    from tcmlir import compiler

    fn = tc.define(MM.format(t="float"))
    sizes = {"M": 96, "K": 64, "N": 80}
    opts = tc.MappingOptions.from_dict({**tc.MappingOptions.naive().split_reduction(4).to_dict(),
                                        "fusion": "max"})
    done: list = []
    worker = threading.Thread(target=lambda: done.append(compiler.lower(fn.ir, sizes, opts, "cuda")),
                              daemon=True)
    worker.start()
    worker.join(60)
    assert done, "scheduling the split matmul took over 60 s"
    schedule = done[0].schedule.get_root().child(0)
    assert schedule.get_type() == isl.schedule_node_type.sequence


def test_a_split_batched_candidate_whose_row_tiles_straddle_chunks_compiles_in_seconds():
    # a tuner candidate of the benchmark's tbmm 500x26x26x72 (8 ways, 32-row tiles): with the
    # chunks stacked along the rows (P(s*B + b, n, m), reads X(m2 mod B, ...)) a tile held rows
    # of two chunks and isl's AST generation of its promoted accesses ran for minutes (issue
    # 31); with P(s, b, n, m) it compiles in seconds
    import threading

    fn = tc.define(BMM, target="cuda")
    x = np.zeros((500, 26, 72), np.float32)
    opts = MO.from_json(
        '{"block":[32,1,1],"double_buffer":true,"fusion":"preserve3coincident",'
        '"grid":[1024,256],"register_interleave":[0,4],"register_tile":[4,8],"split_k":8,'
        '"tile_sizes":[32,128,512,64],"unroll_copy_shared":false,"unroll_factor":4,'
        '"use_private_memory":false,"use_shared_memory":true,"version":1}')
    done: list = []
    worker = threading.Thread(target=lambda: done.append(fn.compile(x, x, options=opts,
                                                                    arch="sm_90")), daemon=True)
    worker.start()
    worker.join(60)
    assert done, "compiling the split tbmm candidate took over 60 s"
    # (isl fuses the fold of the two chunks, 64 + 8, with them: each b tile its own block)
    assert np.prod(done[0].runner.image.kernels[0].grid) >= 16
