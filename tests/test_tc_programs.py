"""Programs of Facebook's TensorComprehensions repository (and fuzz finds around them) that
tcmlir once failed to compile for cuda, or accepted where TC's range inference refuses them
(issue 36).

Without a GPU: each compiles for cuda under the default options (ptxas accepts the PTX), the
simulator runs the compiled kernels equal to the reference (``target="numpy"``), and so does
the cpu target. With a GPU (``gpu`` mark): the same programs against the reference.
"""

from __future__ import annotations

import re

import numpy as np
import pytest
from corpus import as_tuple, assert_outputs_close, run_program

import tcmlir as tc
from tcmlir.binding import bind_sizes
from tcmlir.codegen.ptx_tools import find_ptxas, ptxas_check
from tcmlir.simulate import simulate_call


@pytest.fixture(autouse=True)
def _fresh(monkeypatch):
    monkeypatch.setenv("TCMLIR_ALWAYS_COMPILE", "1")


def _cuda(src: str, inputs: list[np.ndarray]) -> tc.Kernel:
    """The default cuda kernel of ``src`` at the inputs' sizes, its PTX checked by ptxas."""
    kernel = tc.define(src).compile(*inputs, target="cuda", arch="sm_90")
    if find_ptxas() is not None and ".entry" in kernel.ptx:
        ptxas_check(kernel.ptx, "sm_90")
    return kernel


def _check(src: str, inputs: list[np.ndarray], rtol: float = 1e-4) -> tc.Kernel:
    """cpu and the simulated cuda kernels (default options) equal the reference."""
    ref = run_program(tc.define(src, target="numpy"), inputs)
    assert_outputs_close(run_program(tc.define(src, target="cpu"), inputs), ref, rtol, context="cpu")
    kernel = _cuda(src, inputs)
    fn = tc.define(src).ir
    options = tc.MappingOptions.default_for(fn, "cuda", bind_sizes(fn, [x.shape for x in inputs]))
    assert_outputs_close(as_tuple(simulate_call(fn, inputs, options)), ref, rtol, context="cuda")
    return kernel


# ---------------------------------------------------------------- rows of several statements

MOMENTS = """def moments2_2D_1D(float(N, K) I) -> (mean, var) {
    mean(n) +=! I(n, r_k)
     var(n) +=! I(n, r_k) * I(n, r_k)
    mean(n)  = mean(n) / (K)
     var(n)  =  var(n) / (K) - mean(n) * mean(n)
}"""
# test_cuda_mapper.cc MultiStmt
MULTI_STMT = """def fun(float(N, N, N, N) A, float(N, N) B, float(N, N) C, float(N, N) D)
-> (O1, O2, O3)
{
    O1(n0, n1) +=! A(n0, n1, r_n2, r_n3) * B(n0, n1)
    O2(n0, n1)  =  C(n0, n1) *  D(n0, n1)
    O3(n0, n1)  = O1(n0, n1) + O2(n0, n1)
}"""
# test_mapper_llvm.cc MultiStmt
MULTI_STMT_LLVM = """def fun(float(N, M, K, L) A, float(N, M) B, float(N, M) C, float(N, M) D)
-> (O1, O2, O3)
{
    O1(n, m) +=! A(n, m, r_k, r_l) * B(n, m)
    O2(n, m) = C(n, m) * D(n, m)
    O3(n, m) = O1(n, m) + O2(n, m)
}"""
# test_cuda_mapper.cc ReductionTest.AfterInstruction / BetweenInstructions
AFTER = """def fun(float(N, K) I, float(N) O0) -> (O) {
    O(n) = 0.0 where n in 0:N
    O(n) += O0(n)
    O(n) += I(n, r_n)
}"""
BETWEEN = AFTER.replace("r_n)\n}", "r_n)\n    O(n) = O(n) / (K)\n}")

# TC's test_compile_and_run.cc / the pytorch FAQ: softmax reusing tmp for the max and the sum
# (the simulator runs it right only with the barriers between the phases of a row)
SOFTMAX_TMP = """def softmax(float(N, D) I) -> (O, tmp) {
    tmp(n) max=     I(n, d)
      O(n, d) = exp(I(n, d) - tmp(n))
    tmp(n)   +=!    O(n, d)
      O(n, d) =     O(n, d) / tmp(n)
}"""

ROW_PROGRAMS = {
    "softmax-tmp": (SOFTMAX_TMP, lambda n, k: [(n, k)]),
    "moments": (MOMENTS, lambda n, k: [(n, k)]),
    "multi-stmt": (MULTI_STMT, lambda n, k: [(n, n, n, n)] + [(n, n)] * 3),
    "multi-stmt-llvm": (MULTI_STMT_LLVM, lambda n, k: [(n, k, 3, 2)] + [(n, k)] * 3),
    "after-instruction": (AFTER, lambda n, k: [(n, k), (n,)]),
    "between-instructions": (BETWEEN, lambda n, k: [(n, k), (n,)]),
}
ROW_SIZES = [(1, 1), (3, 1), (5, 7), (2, 33), (3, 64), (2, 300)]


@pytest.mark.parametrize(("n", "k"), ROW_SIZES, ids=str)
@pytest.mark.parametrize("name", list(ROW_PROGRAMS))
def test_row_programs_of_several_statements(name, n, k, rng):
    """isl fuses the phases of statements pinned to thread 0 into one ``if (_tx == 0)`` (mean
    and var divided by K; O = 0 and O += O0): one thread runs them in order, no barrier needed
    between them (they used to be refused as one phase running dependent statements)."""
    src, shapes = ROW_PROGRAMS[name]
    inputs = [rng.uniform(-2, 2, size=s).astype(np.float32) for s in shapes(min(n, 5), k)]
    kernel = _check(src, inputs)
    assert "rows threads=" in kernel.schedule and kernel.ptx.count(".entry") == 1


@pytest.mark.parametrize("t", ["double", "int32", "int8"])
def test_moments_of_other_types(t, rng):
    src = MOMENTS.replace("float(", f"{t}(")
    x = rng.integers(-20, 20, size=(4, 300)) if t.startswith("int") else rng.uniform(-2, 2, (4, 300))
    kernel = _check(src, [x.astype(tc.define(src).ir.inputs[0].dtype.numpy)])
    assert kernel.ptx.count(".entry") == 1


def test_one_thread_phase_is_recognised():
    from tcmlir.codegen.gpu_rows import one_thread

    x = np.zeros((5, 7), np.float32)
    loops = _cuda(MOMENTS, [x]).loops
    assert "if (_tx == 0) {\n    S2(_bx);\n    S3(_bx);\n  }" in loops  # one phase, thread 0
    # the walk's view of such a phase: an `if (_tx == 0)` without an else, and nothing else
    import islpy as isl

    ctx = isl.Context()
    build = isl.AstBuild.from_context(isl.Set.read_from_str(ctx, "[_tx] -> { : }"))
    seq = ("child: { sequence: [ { filter: \"[_tx] -> { A[] }\" }, "
           "{ filter: \"[_tx] -> { B[] }\" } ] } }")
    for guard, want in (("_tx = 0", True), ("_tx = 1", False), ("_tx <= 1", False)):
        tree = isl.Schedule.read_from_str(
            ctx, f"{{ domain: \"[_tx] -> {{ A[] : {guard}; B[] : {guard} }}\", {seq}")
        node = build.node_from_schedule(tree)
        assert node.get_type() == isl.ast_node_type.if_, guard
        assert one_thread(node) is want, guard


# ---------------------------------------------------------------- guarded contractions

# TC's docs/source/coding_conventions.rst: a triangular product through a guard
TRIANGULAR = """def matmul(float(M, K) L, float(K, M) U) -> (LU) {
    LU(m1, m2) +=! (r_k >= m1 && r_k <= m2) ? L(m1, r_k) * U(r_k, m2) : 0
}"""
GUARDED_BATCH = """def f(float(Bt, N, K) X, float(Bt, M, K) Y) -> (Z) {
    Z(b, n, m) +=! k != b ? (X(b, n, k) * Y(b, m, k)) : -1.0
}"""


@pytest.mark.parametrize(("m", "k"), [(4, 6), (5, 3), (17, 40)], ids=str)
def test_triangular_product_promotes_what_the_guard_reads(m, k, rng):
    """The shared tiles hold the footprint of the reads where the guard holds (the scop's
    reads); the kernel loads L(m1, r_k) only there (the arm of ``?:`` is a branch), so the
    proof that every access stays in the box counts only those (it used to count every
    instance and fail: an access of S0 leaves the box)."""
    inputs = [rng.uniform(-1, 1, (m, k)).astype(np.float32),
              rng.uniform(-1, 1, (k, m)).astype(np.float32)]
    kernel = _check(TRIANGULAR, inputs)
    assert "cpin_L_sh0" in kernel.schedule and "cpin_U_sh0" in kernel.schedule


@pytest.mark.parametrize(("bt", "n", "k", "m"), [(4, 4, 1, 1), (3, 5, 2, 7), (2, 33, 3, 40)], ids=str)
def test_guarded_batched_product(bt, n, k, m, rng):
    inputs = [rng.uniform(-1, 1, (bt, n, k)).astype(np.float32),
              rng.uniform(-1, 1, (bt, m, k)).astype(np.float32)]
    assert "cpin_X_sh0" in _check(GUARDED_BATCH, inputs).schedule


# ---------------------------------------------------------------- empty ranges


@pytest.mark.parametrize("n", [1, 4])
@pytest.mark.parametrize("src", [
    "def f(float(N, N) A) -> (O) { O(i) +=! A(i, j) where j in 1:N, i in N:N }",
    "def f(float(N, N) A) -> (O) { O(i, j) = A(i, j) where i in N:N }",
])
def test_a_program_with_no_instance_has_no_kernel(src, n, rng):
    kernel = _check(src, [rng.uniform(-1, 1, (n, n)).astype(np.float32)])
    assert ".entry" not in kernel.ptx


# ---------------------------------------------------------------- range inference

# TC's test/test_inference.cc: ambiguous (TCC, TCD, TCE), and programs it infers
AMBIGUOUS = {
    "TCC": ("def fun(float(I_0, I_1, I_2) I) -> (O) {\n  O(i) +=! I(i, i + j, j)\n}",
            "i, j", "I(i, i + j, j)", "where j in 0:I_2"),
    "TCD": ("def fun(float(I_0, I_1, I_2, I_3, I_4) I) -> (O) {\n"
            "  O(i) +=! I(i, j, i, k, 2 * i + j)\n}", "i, j", "2 * i + j", "where j in 0:I_1"),
    "TCE": ("def fun(float(I_0, I_1, I_2, I_3, I_4) I) -> (O) {\n"
            "  O(i) +=! I(j, j + 1, i, i + 3, 2 * i + j + 0)\n}", "i, j", "2 * i + j + 0",
            "where i in lo:hi"),
}
INFERRED = [
    "def fun(float(I_0, I_1, I_2) I) -> (O) { O(i) +=! I(j, i + j, k) }",  # TCA
    """def fun(float(A_0, A_1, A_2) A, float(B_0, B_1, B_2) B, float(C_0, C_1, C_2) C) -> (O2, O3) {
      O2(j, k, l) +=! B(j, k, l) + A(i, j, k)
      O3(k, l, m) +=! C(k, l, m) + O2(j, k, l)
    }""",  # TCF
    """def convolution(float(N,C,H,W) I, float(M,C,KH,KW) W1, float(M) B) -> (pad, tmp) {
        pad(n, c, h, w)  = I(n, c, h - 2 - 3, w - 3 - 4)
        tmp(n, m, h, w) +=! pad(n, c, 2 * h + kh, 3 * w + kw) * W1(m, c, kh, kw)
    }""",  # PaddedConv
    """def fun(float(B,IP,H,W) input, float(OP,IP,KH,KW) weight) -> (output) {
      output(b, op, h, w) +=! input(b, ip, 2 * h + 3 * w + kh, 2 * w + kw) * weight(op, ip, kh, kw)
    }""",  # WeirdConv
    """def convolutionGrad(float(N,C,H,W) I, float(M,C,KH,KW) W1, float(N,M,OH,OW) d_O)
    -> (d_I, d_W1, d_B) {
        d_I(n, c, h, w) +=! d_O(n, m, h - kh, w - kw) * W1(m, c, kh, kw)
        d_W1(m, c, kh, kw) +=! d_O(n, m, h - kh, w - kw) * I(n, c, h, w)
        d_B(m) +=! d_O(n, m, h, w)
    }""",  # ConvGrad
]


@pytest.mark.parametrize("name", list(AMBIGUOUS))
def test_ambiguous_ranges_are_a_located_error(name):
    """More than one maximal rectangle keeps the access in bounds (TC refuses these)."""
    src, indices, culprit, fix = AMBIGUOUS[name]
    with pytest.raises(tc.InferenceError) as info:
        tc.define(src)
    text = str(info.value)
    assert text.startswith("<string>:2:12: error: the ranges of " + indices + " are ambiguous")
    assert culprit in text and "more than one maximal rectangle" in text
    assert "fix: give " in text and fix in text
    if name == "TCD":  # a piecewise bound reads as TC text, not isl's
        assert "i in [0, min(I_2, I_0))" in text or "i in [0, min(I_0, I_2))" in text


@pytest.mark.parametrize("name", ["TCC", "TCD"])
def test_the_suggested_where_settles_the_ranges(name, rng):
    src, _, _, fix = AMBIGUOUS[name]
    fixed = src.replace("\n}", f" {fix}\n}}")
    shape = (3, 7, 4) if name == "TCC" else (4, 3, 5, 2, 9)
    x = rng.uniform(-1, 1, shape).astype(np.float32)
    ref = run_program(tc.define(fixed, target="numpy"), [x])
    assert_outputs_close(run_program(tc.define(fixed, target="cpu"), [x]), ref, 1e-5)


@pytest.mark.parametrize("src", INFERRED, ids=["TCA", "TCF", "PaddedConv", "WeirdConv", "ConvGrad"])
def test_tc_inference_programs_still_infer(src):
    tc.define(src)


def test_combining_another_tensor_stays_a_precondition():
    """inference.rst's ``B(i) * C(i + j) * D(j)``: C must be large enough (a warning)."""
    with pytest.warns(tc.PreconditionWarning, match="C\\(i \\+ j\\)"):
        fn = tc.define("def f(float(N) B, float(M) C, float(K) D) -> (A) {\n"
                       "  A(i, j) = B(i) * C(i + j) * D(j)\n}")
    assert fn.ir.preconditions == ("K <= 1 - N + M",)


# ---------------------------------------------------------------- on the GPU


@pytest.mark.gpu
def test_guarded_contractions_on_gpu(rng):
    for src, shapes in [(TRIANGULAR, [(4, 6), (6, 4)]), (TRIANGULAR, [(300, 129), (129, 300)]),
                        (GUARDED_BATCH, [(4, 4, 1), (4, 1, 1)]),
                        (GUARDED_BATCH, [(7, 65, 9), (7, 33, 9)])]:
        inputs = [rng.uniform(-1, 1, s).astype(np.float32) for s in shapes]
        ref = run_program(tc.define(src, target="numpy"), inputs)
        got = run_program(tc.define(src, target="cuda"), inputs)
        assert_outputs_close(got, ref, 1e-4, context=f"{shapes}")


@pytest.mark.gpu
@pytest.mark.parametrize("name", list(ROW_PROGRAMS))
def test_row_programs_on_gpu(name, rng):
    src, shapes = ROW_PROGRAMS[name]
    for n, k in [(1, 1), (5, 7), (3, 300), (5, 4097)]:
        inputs = [rng.uniform(-2, 2, size=s).astype(np.float32) for s in shapes(n, k)]
        ref = run_program(tc.define(src, target="numpy"), inputs)
        got = run_program(tc.define(src, target="cuda"), inputs)
        assert_outputs_close(got, ref, 1e-4, context=f"{name} {n}x{k}")


def test_tensors_read_across_threads_are_not_noalias():
    """A tensor one statement writes (thread 0's combine) and another reads after a barrier
    must not be ``noalias`` in the kernel: LLVM then kept ``tmp(n)`` loaded before the barrier in
    a register (the H100 gave softmax-tmp at 5x4097 values 500x too large); inputs keep it."""
    kernel = tc.define(SOFTMAX_TMP, target="cuda").compile(
        np.zeros((5, 4097), np.float32), target="cuda", arch="sm_90")
    entry = next(line for line in kernel.llvm_ir.splitlines()
                 if line.startswith("define ptx_kernel"))
    assert re.search(r'noalias (align 16 )?%"I"', entry), entry
    assert not re.search(r'noalias (align 16 )?%"tmp"', entry), entry


def test_rows_of_two_indices_beyond_the_grid_keep_their_phases():
    """More (n, m) rows than blocks: the blocks stride over the last row index (a block
    looping over linearised rows made isl merge three phases into one: a CodegenError at
    5 x 4097 on the GPU)."""
    src, shapes = ROW_PROGRAMS["multi-stmt-llvm"]
    inputs = [np.zeros(s, np.float32) for s in shapes(5, 4097)]
    kernel = tc.define(src).compile(*inputs, target="cuda", arch="sm_90")
    assert "rows threads=" in kernel.schedule
