"""Reductions mapped to threads (`map-reduction`) and their block combine on NVPTX.

Without a GPU: the default cuda pipeline maps the reduction of a row sum, a row max, a full
reduction and softmax's reductions (the ``reduction S<k> threads=B`` mark is in the tree, which
re-parses; coverage is proved), the PTX has warp shuffles and barriers and passes ptxas; a
matmul (two members on threads) keeps its mapping. With a GPU (``gpu`` mark): every operator x
dtype on awkward shapes against ``target="numpy"``, and the corpus programs tagged "reduction".
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


# ---------------------------------------------------------------- on the GPU


def _values(rng, shape, dtype, op):
    if np.dtype(dtype).kind == "f":
        lo, hi = (0.99, 1.01) if op == "*" else (-1.0, 1.0)
        return rng.uniform(lo, hi, size=shape).astype(dtype)
    lo, hi = (-3, 4) if op == "*" else (-1000, 1000)
    return rng.integers(lo, hi, size=shape).astype(dtype)


GPU_SHAPES = [(r, c) for r in (1, 7, 300) for c in (1, 31, 33, 1000, 4099)]


@pytest.mark.gpu
@pytest.mark.parametrize("shape", GPU_SHAPES, ids=[f"{r}x{c}" for r, c in GPU_SHAPES])
@pytest.mark.parametrize("op", OPS)
@pytest.mark.parametrize("t", list(DTYPES))
def test_rowsum_on_gpu(t, op, shape, rng):
    src = ROWSUM.format(t=t, op=op)
    x = _values(rng, shape, DTYPES[t], op)
    ref = run_program(tc.define(src, target="numpy"), [x])
    for opts in (tc.MappingOptions(), tc.MappingOptions().map_to_threads(256)):
        got = run_program(tc.define(src, target="cuda"), [x], options=opts)
        assert_outputs_close(got, ref, 1e-3 if t == "float" else None, context=f"{src} {shape}")


@pytest.mark.gpu
@pytest.mark.parametrize("n", (1, 31, 33, 1000, 4099, 100_003))
@pytest.mark.parametrize("op", OPS)
@pytest.mark.parametrize("t", list(DTYPES))
def test_full_reduction_on_gpu(t, op, n, rng):
    src = FULL.format(t=t, op=op)
    x = _values(rng, (n,), DTYPES[t], op)
    ref = run_program(tc.define(src, target="numpy"), [x])
    for opts in (tc.MappingOptions(), tc.MappingOptions().map_to_threads(1024)):
        got = run_program(tc.define(src, target="cuda"), [x], options=opts)
        assert_outputs_close(got, ref, 1e-3 if t == "float" else None, context=f"{src} n={n}")


REDUCTION_CASES = [c for c in CASES if "reduction" in c.tags]


@pytest.mark.gpu
@pytest.mark.parametrize("block", [(32, 8), (256,), (7,)], ids=str)
@pytest.mark.parametrize("case", REDUCTION_CASES, ids=[c.name for c in REDUCTION_CASES])
def test_corpus_reductions_on_gpu(case, block, rng):
    opts = tc.MappingOptions().map_to_threads(*block)
    for sizes in case.sizes:
        inputs = case.make_inputs(rng, **sizes)
        ref = run_program(tc.define(case.source, name=case.entry, target="numpy"), inputs)
        got = run_program(tc.define(case.source, name=case.entry, target="cuda"), inputs,
                          options=opts)
        assert_outputs_close(got, ref, case.rtol, context=f"{case.name} {sizes} block={block}")
