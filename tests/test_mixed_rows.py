"""Programs that mix row statements and column reductions (`merge-updates`, `map-mixed`).

The layernorm gradient with scale and shift (row statements per ``n``, the column reductions
``G_grad(d)``, ``Bt_grad(d)``), a row and a column reduction of one input, and a column
reduction feeding a row statement. Without a GPU: the split, the default options and the
kernels they give (one row kernel, one column kernel for both column reductions, ptxas accepts
the PTX), results equal to the reference through the cuda pipeline run by the simulator on
awkward sizes, the DRAM bytes of the gradient's kernels against the minimal, refusals, and
that softmax/layernorm keep their one kernel. With a GPU (``gpu`` mark): the same programs
against the reference.
"""

from __future__ import annotations

import dataclasses
import functools
import os
import random
import sys

import islpy as isl
import numpy as np
import pytest
from corpus import assert_outputs_close, run_program
from tcmlir.passes.map_mixed import column_groups, mixed_problem, split_statements
from tcmlir.passes.merge_updates import merge_updates

import tcmlir as tc
from tcmlir import reference
from tcmlir.codegen.ptx_tools import find_ptxas, ptxas_check
from tcmlir.compiler import lower
from tcmlir.errors import CodegenError, OptionsError, PipelineError
from tcmlir.grad import derive
from tcmlir.simulate import simulate_call

LAYERNORM_GB = """def layernorm(float(N, D) X, float(D) G, float(D) Bt) -> (O) {
    mean(n) +=! X(n, d) / D
    c(n, d) = X(n, d) - mean(n)
    var(n) +=! c(n, d) * c(n, d) / D
    O(n, d) = c(n, d) * rsqrt(var(n) + 1e-5) * G(d) + Bt(d)
}"""
LAYERNORM = """def layernorm(float(N, D) X) -> (O) {
    mean(n) +=! X(n, d) / D
    c(n, d) = X(n, d) - mean(n)
    var(n) +=! c(n, d) * c(n, d) / D
    O(n, d) = c(n, d) * rsqrt(var(n) + 1e-5)
}"""
SOFTMAX = """def softmax(float(N, D) X) -> (O) {
    mx(n) max=! X(n, d)
    e(n, d) = exp(X(n, d) - mx(n))
    s(n) +=! e(n, d)
    O(n, d) = e(n, d) / s(n)
}"""
ROW_AND_COLUMN = "def rc(float(N, D) X) -> (R, C) {\n R(n) +=! X(n, d)\n C(d) max=! X(n, d)\n}"
# a column result used by every row (centering by the column means): the column kernel first
CENTER = """def center(float(N, D) X) -> (O, S, M) {
    S(d) +=! X(n, d)
    O(n, d) = X(n, d) - S(d) / N
    M(n) max=! O(n, d)
}"""
sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "tools"))
GRAD = derive(tc.define(LAYERNORM_GB).ir).source
# (the fused form needs >= 32 threads per row dividing the columns: 64, 96, 128 here)
SIZES = [(1, 1, "fused"), (3, 33, "kernels"), (7, 5, "fused"), (5, 64, "fused"),
         (3, 96, "fused"), (3, 128, "fused")]  # 128: 32 threads of 4 adjacent columns


@pytest.fixture(autouse=True)
def _fresh(monkeypatch):
    monkeypatch.setenv("TCMLIR_ALWAYS_COMPILE", "1")


def _inputs(fn: tc.TCFunction, rng, n: int, d: int) -> list[np.ndarray]:
    shapes = {"X": (n, d), "O_grad": (n, d), "G": (d,), "Bt": (d,)}
    return [rng.uniform(-2, 2, size=shapes[t.name]).astype(np.float32) for t in fn.ir.inputs]


def _reference(fn: tc.TCFunction, inputs: list[np.ndarray]) -> tuple[np.ndarray, ...]:
    from tcmlir.binding import bind_sizes

    sizes = bind_sizes(fn.ir, [x.shape for x in inputs])
    named = {t.name: x for t, x in zip(fn.ir.inputs, inputs, strict=True)}
    out = reference.run(fn.ir, named, sizes)
    return tuple(out[t.name] for t in fn.ir.outputs)


# above this many elements per input matrix the interpreter takes minutes (600 x 4096 ran
# past the GPU session's limit): the host build, under naive options, is the reference there
# (its own agreement with the interpreter is checked on the corpus)
REFERENCE_MAX_ELEMENTS = 1 << 20


def _host_reference(fn: tc.TCFunction, inputs: list[np.ndarray]) -> tuple[np.ndarray, ...]:
    host = tc.define(fn.canonical_source, target="cpu")
    out = host(*inputs, options=tc.MappingOptions.naive())
    return out if isinstance(out, tuple) else (out,)


def _ptx(src: str, n: int, d: int) -> tuple[tc.Kernel, str]:
    fn = tc.define(src)
    inputs = [np.zeros((n, d) if len(t.shape) == 2 else (d,), np.float32) for t in fn.ir.inputs]
    kernel = fn.compile(*inputs, target="cuda", arch="sm_90")
    if find_ptxas() is not None:
        ptxas_check(kernel.ptx, "sm_90")
    return kernel, kernel.ptx


# ---------------------------------------------------------------- the split and the default


def test_gradient_splits_into_rows_and_two_column_reductions():
    fn = tc.define(GRAD).ir
    rows, columns = split_statements(fn)
    assert [fn.statements[k].tensor for k in columns] == ["G_grad", "Bt_grad"]
    assert {fn.statements[k].tensor for k in rows} == {
        "mean", "c", "var", "c_grad", "var_grad", "X_grad", "mean_grad"}
    assert mixed_problem(fn) is None
    opts = tc.MappingOptions.default_for(fn, "cuda", {"N": 16384, "D": 4096})
    assert opts.mixed_rows == "fused" and opts.row_block == 1024
    assert opts.to_pipeline("cuda") == ("merge-updates,inline-temporaries,schedule{fusion=max,"
                                        "skew=false,positive-orthant=true},"
                                        "map-mixed{threads=1024,grid=4224,vector-bytes=16}")
    state = lower(fn, {"N": 64, "D": 32}, opts, "cuda")
    # both column reductions (same rows, independent) in one group
    (group,) = column_groups(state.fn, state.deps.validity, state.scop.domain,
                             split_statements(state.fn)[1])
    assert len(group) == 2


@functools.cache
def _gradient_kernel(mixed: str) -> tuple[tc.Kernel, str]:
    """The gradient compiled for cuda at 2048 x 4096 (ptxas-checked), fused or not."""
    fn = tc.define(GRAD)
    opts = dataclasses.replace(tc.MappingOptions.default_for(fn.ir, "cuda"), mixed_rows=mixed)
    inputs = [np.zeros((2048, 4096) if len(t.shape) == 2 else (4096,), np.float32)
              for t in fn.ir.inputs]
    kernel = fn.compile(*inputs, target="cuda", arch="sm_90", options=opts)
    if find_ptxas() is not None:
        ptxas_check(kernel.ptx, "sm_90")
    return kernel, kernel.ptx


def test_fused_gradient_is_one_row_kernel():
    kernel, ptx = _gradient_kernel("fused")
    assert ptx.count(".entry") == 2  # the column identities, the row kernel
    sched = kernel.schedule
    assert sched.count("kernel grid=") == 2
    assert "kernel grid=264,1,1 block=1024,1,1" in sched  # 2 blocks of 1024 per SM
    assert "rows threads=1024 local=mean,var,var_grad,mean_grad" in sched
    for k in (3, 4):
        assert f"accumulate S{k} over-rows atomic" in sched
    # merge-updates + inline-temporaries: no temporary exists in global memory
    assert set(kernel.runner.image.on_chip) == {t.name for t in kernel.function.ir.temporaries}
    # one atomic fold per column stride (4096 / 1024) and column reduction, after the row loop
    assert ptx.count("red.global.add.f32") + ptx.count("atom.global.add.f32") == 8
    # the tree prints in isl syntax and re-parses to a fixed point
    ctx = isl.Context()
    once = str(isl.Schedule.read_from_str(ctx, sched))
    assert str(isl.Schedule.read_from_str(ctx, once)) == once


def test_gradient_as_row_and_column_kernels():
    kernel, ptx = _gradient_kernel("kernels")
    assert ptx.count(".entry") == 3  # the row kernel, the identities, the column kernel
    sched = kernel.schedule
    assert "kernel grid=264,1,1 block=1024,1,1" in sched and "kernel grid=4,66,1 block=1024,1,1" in sched
    assert "accumulate S3,S4 atomic" in sched  # one loop over the rows for both
    assert "rows threads=1024 local=var_grad,mean_grad" in sched
    # the column kernel reads the row statistics that the row kernel wrote
    assert set(kernel.runner.image.on_chip) == {"c", "c_grad", "var_grad", "mean_grad"}


def test_gradient_dram_bytes():
    """isl counts: the fused kernels move the program's minimal bytes (X and O_grad read once,
    X_grad written once); the column kernels read X and O_grad a second time."""
    from kernel_bytes import kernel_bytes

    full = 2048 * 4096 * 4
    rows, minimal = kernel_bytes(_gradient_kernel("fused")[0])
    assert 3 * full <= minimal < 3 * full + 100_000
    assert sum(b for _, b in rows) - minimal < 100_000
    rows, _ = kernel_bytes(_gradient_kernel("kernels")[0])
    assert 5 * full <= sum(b for _, b in rows) < 5 * full + 500_000


def test_dump_shows_one_kernel_mark_each(tmp_path, capsys):
    from tcmlir.dump import main

    path = tmp_path / "ln.tc"
    path.write_text(LAYERNORM_GB)
    main([str(path), "--grad", "--sizes", "N=16384,D=4096", "--target", "cuda",
          "--stage", "pipeline,loops"])
    out = capsys.readouterr().out
    assert "map-mixed{threads=1024,grid=4224,vector-bytes=16}" in out
    assert out.count("// kernel grid=") == 2


def test_columns_the_strides_do_not_divide_get_column_kernels():
    fn = tc.define(GRAD)
    kernel = fn.compile(*_inputs(fn, np.random.default_rng(0), 64, 1000), target="cuda", arch="sm_90")
    assert kernel.options.mixed_rows == "fused"
    assert "accumulate S3,S4 atomic" in kernel.schedule and "over-rows" not in kernel.schedule
    # 768 columns: 3 strides of 256 threads
    kernel = fn.compile(*_inputs(fn, np.random.default_rng(0), 64, 768), target="cuda", arch="sm_90")
    assert "rows threads=256" in kernel.schedule and "over-rows" in kernel.schedule


def test_row_and_column_reduction_of_one_input_is_split():
    fn = tc.define(ROW_AND_COLUMN)
    opts = tc.MappingOptions.default_for(fn.ir, "cuda")
    assert opts.mixed_rows
    _, ptx = _ptx(ROW_AND_COLUMN, 1000, 333)
    assert ptx.count(".entry") == 3  # rows; the column's identity; the column reduction
    kernel, ptx = _ptx(ROW_AND_COLUMN, 1000, 256)  # 256 columns: one stride of 256 threads
    assert ptx.count(".entry") == 2 and "accumulate S1 over-rows atomic" in kernel.schedule


@pytest.mark.parametrize("src", [SOFTMAX, LAYERNORM, LAYERNORM_GB],
                         ids=["softmax", "layernorm", "layernorm-scale-shift"])
def test_row_programs_keep_their_one_kernel(src):
    opts = tc.MappingOptions.default_for(tc.define(src).ir, "cuda")
    assert opts.row_block == 512 and not opts.mixed_rows
    assert "mixed_rows" not in opts.to_json()  # the default is kept out of the cache keys
    kernel, ptx = _ptx(src, 4096, 1024)
    assert ptx.count(".entry") == 1
    assert "map-rows{" in kernel.options.to_pipeline("cuda")


def test_options_round_trip():
    for mixed in ("fused", "kernels"):
        opts = tc.MappingOptions(row_block=256, mixed_rows=mixed)
        assert tc.MappingOptions.from_json(opts.to_json()) == opts
        assert f'"mixed_rows":"{mixed}"' in opts.to_json()
    assert tc.MappingOptions(row_block=256, mixed_rows="fused").to_pipeline("cuda").endswith(
        "map-mixed{threads=256,grid=256}")
    assert tc.MappingOptions(row_block=256, mixed_rows="kernels").to_pipeline("cuda").endswith(
        "map-mixed{threads=256,grid=256,fuse=false}")
    assert "map-mixed" not in tc.MappingOptions(mixed_rows="fused").to_pipeline("cuda")  # no row_block
    with pytest.raises(OptionsError, match="mixed_rows"):
        tc.MappingOptions(mixed_rows="yes")


# ---------------------------------------------------------------- results (simulated cuda)


@pytest.mark.parametrize(("n", "d", "mixed"), SIZES, ids=[f"{n}x{d}-{m}" for n, d, m in SIZES])
def test_simulated_gradient_matches_reference(n, d, mixed, rng):
    fn = tc.define(GRAD)
    inputs = _inputs(fn, rng, n, d)
    opts = dataclasses.replace(tc.MappingOptions.default_for(fn.ir, "cuda", {"N": n, "D": d}),
                               mixed_rows=mixed)
    got = simulate_call(fn.ir, inputs, opts)
    assert_outputs_close(got, _reference(fn, inputs), 1e-4, context=f"{n}x{d} {mixed}")
    fused = "over-rows" in lower(fn.ir, {"N": n, "D": d}, opts, "cuda").schedule.to_str()
    assert fused == (mixed == "fused" and d in (64, 96, 128))


@pytest.mark.parametrize(("n", "d"), [(1, 1), (5, 33), (31, 7), (3, 64)], ids=str)
@pytest.mark.parametrize("src", [LAYERNORM_GB, ROW_AND_COLUMN, CENTER],
                         ids=["layernorm-forward", "row-and-column", "center"])
def test_simulated_programs_match_reference(src, n, d, rng):
    fn = tc.define(src)
    inputs = _inputs(fn, rng, n, d)
    opts = tc.MappingOptions.default_for(fn.ir, "cuda", {"N": n, "D": d})
    assert opts.row_block
    got = simulate_call(fn.ir, inputs, opts)
    assert_outputs_close(got, _reference(fn, inputs), 1e-4, context=f"{n}x{d}")


def test_center_runs_its_column_kernel_first():
    kernel, _ = _ptx(CENTER, 100, 64)
    sched = kernel.schedule
    assert sched.index("accumulate S0 atomic") < sched.index("rows threads=")


@pytest.mark.parametrize(("n", "d", "mixed", "vector"), [(5, 40, "kernels", 0), (5, 256, "fused", 16)],
                         ids=["kernels", "fused-lanes"])
def test_explicit_grid_and_block(n, d, mixed, vector, rng):
    fn = tc.define(GRAD)
    inputs = _inputs(fn, rng, n, d)
    opts = tc.MappingOptions(fusion="max", row_block=32, grid=(3,), mixed_rows=mixed,
                             vector_bytes=vector)
    if vector:  # 32 threads of 4 adjacent columns, 2 strides: 8 registers per reduction
        text = fn.compile(*inputs, target="cuda", arch="sm_90", options=opts).loops
        assert "accumulate S3 over-rows atomic" in text and "S3(4 * _tx + 131, " in text
    got = simulate_call(fn.ir, inputs, opts)
    assert_outputs_close(got, _reference(fn, inputs), 1e-4)


# ---------------------------------------------------------------- refusals


def test_dependences_both_ways_are_not_split():
    src = """def f(float(N, D) X) -> (C2) {
        C(d) +=! X(n, d)
        R(n) +=! X(n, d) * C(d)
        C2(d) +=! X(n, d) * R(n)
    }"""
    fn = tc.define(src).ir
    assert "both ways" in mixed_problem(fn)
    assert not tc.MappingOptions.default_for(fn, "cuda").mixed_rows
    with pytest.raises(PipelineError, match="map-mixed"):
        lower(fn, {"N": 8, "D": 8}, tc.MappingOptions(row_block=32, mixed_rows="fused"), "cuda")


@pytest.mark.parametrize("src", [SOFTMAX, "def f(float(N) A) -> (s) { s +=! A(i) }",
                                 "def f(float(N, D) X) -> (S) { S(d) +=! X(n, d) }"])
def test_programs_of_one_kind_are_not_mixed(src):
    assert mixed_problem(tc.define(src).ir) is not None


def test_codegen_refuses_a_column_phase_that_is_not_unrolled(monkeypatch):
    """With the stride limit lifted in map-mixed (not in map-rows' unrolling), isl keeps the
    stride loop (64 strides of 64 threads, scalar accesses): a call site would stand for
    several columns, and the code generator says so rather than fold them into one register."""
    from tcmlir.passes import row_partials

    monkeypatch.setattr(row_partials, "UNROLL_STRIDES", 1000)
    fn = tc.define(GRAD)
    inputs = [np.zeros((8, 4096) if len(t.shape) == 2 else (4096,), np.float32)
              for t in fn.ir.inputs]
    opts = tc.MappingOptions(fusion="max", row_block=64, grid=(8,), mixed_rows="fused")
    with pytest.raises(CodegenError, match=r"over-rows.*loop iterator"):
        fn.compile(*inputs, target="cuda", arch="sm_90", options=opts).ptx  # noqa: B018


# ---------------------------------------------------------------- merge-updates


def test_merge_updates_keeps_the_reference_semantics(rng):
    fn = tc.define(GRAD).ir
    merged = merge_updates(fn)
    text = str(merged)
    assert text.count("c_grad(n, d) =") == 1 and "c_grad(n, d) +=" not in text
    assert text.count("X_grad(n, d) =") == 1 and "X_grad(n, d) +=" not in text
    sizes = {"N": 5, "D": 7}
    named = {"X": rng.standard_normal((5, 7)), "G": rng.standard_normal(7),
             "Bt": rng.standard_normal(7), "O_grad": rng.standard_normal((5, 7))}
    named = {k: v.astype(np.float32) for k, v in named.items()}
    want, got = reference.run(fn, named, sizes), reference.run(merged, named, sizes)
    for t in fn.outputs:
        np.testing.assert_allclose(got[t.name], want[t.name], rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("src", [
    # T read between the assignment and the update
    "def f(float(N) A) -> (T, U) { T(i) = A(i)\n U(i) = T(i) * 2\n T(i) += A(i) }",
    # an operand of the assignment written in between
    "def f(float(N) A) -> (T, U) { U(i) = A(i)\n T(i) = U(i)\n U(i) = A(i) * 3\n T(i) += U(i) }",
    # the update reads the tensor
    "def f(float(N) A) -> (T) { T(i) = A(i)\n T(i) += T(i) * 2 }",
    # a reduction update
    "def f(float(N, M) A) -> (T) { T(i) = A(i, 0)\n T(i) += A(i, j) }",
])
def test_merge_updates_refuses_what_would_change_the_result(src):
    fn = tc.define(src).ir
    assert merge_updates(fn) is fn


# ---------------------------------------------------------------- relaxed defaults


def test_column_reduction_may_read_a_per_row_operand(rng):
    src = "def f(float(N, D) X, float(N) w) -> (S) { S(d) +=! X(n, d) * w(n) }"
    fn = tc.define(src)
    opts = tc.MappingOptions.default_for(fn.ir, "cuda")
    assert opts.row_block  # map-rows -> map_columns
    x, w = rng.standard_normal((9, 40)).astype(np.float32), rng.standard_normal(9).astype(np.float32)
    (got,) = simulate_call(fn.ir, [x, w], opts)
    np.testing.assert_allclose(got, (x * w[:, None]).sum(0), rtol=1e-5, atol=1e-5)


def test_row_reduction_may_read_a_vector_along_the_reduction(rng):
    src = "def f(float(N, D) X, float(D) w) -> (S) { S(n) +=! X(n, d) * w(d) }"
    fn = tc.define(src)
    opts = tc.MappingOptions.default_for(fn.ir, "cuda")
    assert opts.row_block == 512 and not opts.mixed_rows
    x, w = rng.standard_normal((6, 37)).astype(np.float32), rng.standard_normal(37).astype(np.float32)
    (got,) = simulate_call(fn.ir, [x, w], opts)
    np.testing.assert_allclose(got, x @ w, rtol=1e-5, atol=1e-5)
    # a matrix beside the row is still a contraction, not a row program
    mv = "def f(float(N, D) X, float(D, E) W) -> (S) { S(n) +=! X(n, d) * W(d, e) }"
    assert not tc.MappingOptions.default_for(tc.define(mv).ir, "cuda").row_block


# ---------------------------------------------------------------- on the GPU

# fused (column partials in the row kernel): 96, 768, 1024, 4096 columns; column kernels: the rest
# (600 x 4096: about two rows per block of the default's 264, so the partials span several
# rows; the largest sizes are checked against the host build, see REFERENCE_MAX_ELEMENTS)
GPU_SIZES = [(1, 1), (33, 31), (300, 33), (1000, 1), (5, 96), (4097, 1000), (64, 768),
             (4097, 1024), (600, 4096)]


@pytest.mark.gpu
@pytest.mark.parametrize(("n", "d"), GPU_SIZES, ids=[f"{n}x{d}" for n, d in GPU_SIZES])
@pytest.mark.parametrize("src", [GRAD, LAYERNORM_GB, ROW_AND_COLUMN, CENTER],
                         ids=["layernorm-grad", "layernorm-forward", "row-and-column", "center"])
def test_mixed_programs_on_gpu(src, n, d, rng):
    fn = tc.define(src, target="cuda")
    inputs = _inputs(fn, rng, n, d)
    want = (_reference if n * d <= REFERENCE_MAX_ELEMENTS else _host_reference)(fn, inputs)
    mixed = tc.MappingOptions.default_for(fn.ir, "cuda").mixed_rows
    assert bool(mixed) == (src != LAYERNORM_GB)
    variants = [None, tc.MappingOptions(fusion="max", row_block=64, grid=(5,), mixed_rows=mixed)]
    if mixed:
        variants.append(tc.MappingOptions(fusion="max", row_block=1024, grid=(4224,),
                                          mixed_rows="kernels"))
    for opts in variants:
        got = run_program(fn, inputs, options=opts)
        assert_outputs_close(got, want, 1e-3, context=f"{n}x{d} {opts}")


def test_tuner_searches_the_mixed_mapping():
    from tcmlir.tune.space import space_for

    fn = tc.define(GRAD).ir
    space = space_for(fn, "cuda")
    assert {"row_block", "mixed_rows"} <= set(space.fields)
    assert "mixed_rows" not in space_for(tc.define(SOFTMAX).ir, "cuda").fields
    base = tc.MappingOptions.default_for(fn, "cuda")
    seen = {space.sample(random.Random(s), base).mixed_rows for s in range(12)}
    assert seen == {"fused", "kernels"}


def test_fixed_sizes_bound_the_schedule_constants():
    # CENTER at 600 x 1024 kept isl's scheduler busy for minutes with unbounded constant terms
    # (the GPU tests at 600 x 4096 ran past their limit); a fixed-size scop bounds them
    from tcmlir.poly.scheduler import FIXED_SIZE_MAX_CONSTANT, compute_schedule
    from tcmlir.poly.state import CompileState

    fn = tc.define(CENTER).ir
    fixed = CompileState.initial(fn, {"N": 600, "D": 4096})
    schedule = compute_schedule(fixed.scop, fixed.deps, "max")
    assert fixed.scop.ctx.get_schedule_max_constant_term() == FIXED_SIZE_MAX_CONSTANT
    assert schedule.get_domain().is_equal(fixed.scop.domain)
    param = CompileState.initial(fn, None)
    compute_schedule(param.scop, param.deps, "max")
    assert param.scop.ctx.get_schedule_max_constant_term() == -1
    kernel, ptx = _ptx(CENTER, 600, 4096)
    assert ptx.count(".entry") >= 1 and "rows threads=" in kernel.schedule


@pytest.mark.parametrize("src,sizes", [
    ("""def p(float(N) X, float(N, N) Y) -> (T1, T2) {
        T0(i) min=! Y(r, i) + X(r) where r in 0:N
        T1(i) min=! Y(i, r) * X(r) where r in 0:N
        T2(i) max=! Y(r, i) * T0(i) where r in 0:1
    }""", {"N": 2}),
    ("""def p(float(M) X, float(K, N) Y) -> (T2) {
        T0(i) +=! Y(r, i) + Y(r, i) where r in 0:K
        T1(i) min=! Y(i, r) + Y(i, r) where r in 0:N
        T2(i) *=! Y(r, i) - max((-(Y(r, i) >= 2.0 ? T0(i) : T1(r))), ((-T0(i)) * T1(r)))
    }""", {"N": 2, "M": 7, "K": 5}),
], ids=["column-read-by-column", "product"])
def test_a_column_reductions_temporary_gets_a_buffer(src, sizes):
    """A temporary that a column kernel writes (``T0(i) min=! Y(r, i)``) lives in global memory:
    the row kernel kept it on chip and it got no buffer, so the column kernels wrote through a
    null pointer (CUDA_ERROR_ILLEGAL_ADDRESS on the H100, found by the random programs)."""
    fn = tc.define(src, target="cuda")
    inputs = [np.zeros([sizes[str(d)] for d in t.shape], np.float32) for t in fn.ir.inputs]
    image = fn.compile(*inputs, arch="sm_90").runner.image
    assert "T0" not in image.on_chip and sum("T0" in k.tensors for k in image.kernels) > 1


@pytest.mark.gpu
def test_a_column_reductions_temporary_on_gpu(rng):
    src = """def p(float(N) X, float(N, N) Y) -> (T1, T2) {
        T0(i) min=! Y(r, i) + X(r) where r in 0:N
        T1(i) min=! Y(i, r) * X(r) where r in 0:N
        T2(i) max=! Y(r, i) * T0(i) where r in 0:1
    }"""
    x, y = rng.standard_normal(5).astype(np.float32), rng.standard_normal((5, 5)).astype(np.float32)
    t1, t2 = tc.define(src, target="cuda")(x, y)
    t0 = (y + x[:, None]).min(0)
    np.testing.assert_allclose(np.asarray(t1), (y * x[None, :]).min(1), rtol=1e-6)
    np.testing.assert_allclose(np.asarray(t2), y[0] * t0, rtol=1e-6)
