"""Row programs as one GPU kernel (`inline-temporaries`, `map-rows`, `codegen.gpu_rows`).

Without a GPU: the inlining keeps the reference semantics; the default cuda options of the
benchmark's softmax, layernorm and row sum give one ``.entry`` that ptxas accepts, with the
per-row temporaries in shared memory and no global buffer for any temporary; the block size
adapts to short rows (proved: every thread reaches every barrier); non-row programs keep the
naive options; options round-trip. With a GPU (``gpu`` mark): every operator x dtype on rows
of 1, 31, 33, 1000, 4097 and 10^6 elements, a single row, one column, the corpus row programs.
"""

from __future__ import annotations

import islpy as isl
import numpy as np
import pytest
from corpus import assert_outputs_close, run_program
from corpus.programs import CASES, case_by_name
from tcmlir.passes.inline_temporaries import inline_temporaries

import tcmlir as tc
from tcmlir import reference
from tcmlir.codegen.ptx_tools import find_ptxas, ptxas_check
from tcmlir.errors import OptionsError, PipelineError
from tcmlir.gpu_defaults import reduction_defaults

SOFTMAX = """def softmax(float(N, D) X) -> (O) {
    mx(n) max=! X(n, d)
    e(n, d) = exp(X(n, d) - mx(n))
    s(n) +=! e(n, d)
    O(n, d) = e(n, d) / s(n)
}"""
LAYERNORM = case_by_name("layernorm").source
ROWSUM = "def rowsum(float(N, D) X) -> (S) { S(n) +=! X(n, d) }"
ROWRED = "def f({t}(N, D) X) -> (S) {{ S(n) {op}=! X(n, d) }}"
OPS = ("+", "*", "min", "max")
try:
    from ml_dtypes import bfloat16 as _BF16
except ImportError:  # pragma: no cover - ml_dtypes is optional
    _BF16 = None
DTYPES = {"float": np.float32, "double": np.float64, "int32": np.int32, "int64": np.int64,
          "float16": np.float16, "bfloat16": _BF16, "int8": np.int8}


@pytest.fixture(autouse=True)
def _fresh(monkeypatch):
    monkeypatch.setenv("TCMLIR_ALWAYS_COMPILE", "1")


def _inputs(src: str, shape, dtype=np.float32):
    x = np.zeros(shape, dtype)
    return (x, np.float32(1e-5)) if "eps" in src else (x,)


def _compile(src: str, *inputs, options=None) -> tc.Kernel:
    return tc.define(src).compile(*inputs, target="cuda", arch="sm_90", options=options)


def _rows(src: str, threads: int) -> tc.MappingOptions:
    """The default row options with ``threads`` per row (a call's default picks them by width)."""
    return tc.MappingOptions.default_for(tc.define(src).ir, "cuda").map_rows(threads)


def _checked_ptx(kernel: tc.Kernel) -> str:
    if find_ptxas() is not None:
        ptxas_check(kernel.ptx, "sm_90")
    return kernel.ptx


# ---------------------------------------------------------------- inline-temporaries


@pytest.mark.parametrize("name", ["softmax_temporaries", "layernorm"])
def test_inlining_keeps_the_reference_semantics(name, rng):
    case = case_by_name(name)
    fn = tc.define(case.source, name=case.entry).ir
    inlined = inline_temporaries(fn)
    assert len(inlined.statements) < len(fn.statements)
    assert inlined.tensors == fn.tensors  # the ABI does not change
    for sizes in case.sizes:
        inputs = case.make_inputs(rng, **sizes)
        named = {t.name: np.asarray(x) for t, x in zip(fn.inputs, inputs, strict=True)}
        want = reference.run(fn, named, sizes)
        got = reference.run(inlined, named, sizes)
        for k in want:
            np.testing.assert_allclose(got[k], want[k], rtol=1e-5, atol=1e-6)


def test_softmax_inlined_text():
    text = str(inline_temporaries(tc.define(SOFTMAX).ir))
    assert "e(n, d) =" not in text and "e(n, d))" not in text
    assert "s(n) +=! exp((X(n, d) - mx(n)))" in text


@pytest.mark.parametrize("src", [
    # read inside an index (a gather through the temporary)
    "def f(int32(N) I, float(N) A) -> (O) { t(i) = I(i)\n O(i) = A(t(i)) }",
    # its operand is written again after it: the value at the read would differ
    "def f(float(N) A) -> (O) { u(i) = A(i)\n t(i) = u(i) * 2\n u(i) = u(i) + 1\n O(i) = t(i) + u(i) }",
])
def test_inlining_refuses_what_would_change_the_result(src):
    fn = tc.define(src).ir
    assert inline_temporaries(fn).statements[:2] == fn.statements[:2]


# ---------------------------------------------------------------- one kernel by default


@pytest.mark.parametrize(("src", "local"), [(SOFTMAX, ("mx", "s")), (LAYERNORM, ("mean", "var")),
                                            (ROWSUM, ())], ids=["softmax", "layernorm", "rowsum"])
def test_bench_row_programs_are_one_kernel(src, local):
    fn = tc.define(src)
    opts = tc.MappingOptions.default_for(fn.ir, "cuda")
    assert opts.row_block == 512 and opts.grid == (4224,)  # sizes unknown: 512 threads per row
    # at the call's sizes: 64 threads of 64 elements each (`gpu_defaults.row_threads`)
    # (a row sum, one phase, keeps 512)
    threads = 512 if src == ROWSUM else 64
    sized = tc.MappingOptions.default_for(fn.ir, "cuda", {"N": 32768, "D": 4096})
    assert sized.row_block == threads and sized.grid == (4224,)
    kernel = _compile(src, *_inputs(src, (32768, 4096)))
    assert kernel.schedule.count("kernel grid=") == 1
    assert f"kernel grid={4224 if threads == 64 else 528},1,1 block={threads},1,1" in kernel.schedule
    assert f"rows threads={threads} local={','.join(local)}" in kernel.schedule
    ptx = _checked_ptx(kernel)
    assert ptx.count(".entry") == 1
    assert "bar.sync" in ptx and "shfl.sync.bfly" in ptx
    # threads holding 64 values each get the registers they need (no minctasm: 32 spilled)
    assert (".minnctapersm" in ptx) == (threads == 512)
    big = _compile(src, *_inputs(src, (32768, 4096)), options=opts)  # 8 values per thread
    assert ".minnctapersm 4" in big.ptx
    image = kernel.runner.image
    assert set(image.on_chip) == {t.name for t in fn.ir.temporaries}  # no global temporaries
    for t in local:
        assert f".shared .align 8 .f32 rows_$_{t}_" in ptx  # the slot in shared memory
    # the tree re-parses to a fixed point
    ctx = isl.Context()
    once = str(isl.Schedule.read_from_str(ctx, kernel.schedule))
    assert str(isl.Schedule.read_from_str(ctx, once)) == once


@pytest.mark.parametrize(("width", "threads"), [(1, 32), (31, 32), (2048, 32), (2049, 64),
                                                (4096, 64), (8192, 128), (1 << 20, 512)])
def test_row_threads_follow_the_row_width(width, threads):
    from tcmlir.gpu_defaults import row_threads

    fn = tc.define(SOFTMAX).ir
    assert row_threads(fn, {"N": 7, "D": width}) == threads
    assert row_threads(fn, {"N": 7}) == 512  # a width not known
    assert row_threads(tc.define(ROWSUM).ir, {"N": 7, "D": width}) == 512  # one pass: streams


def _enclosing(lines: list[str], i: int) -> list[str]:
    """The lines that open the blocks/loops/ifs around line i (by indentation)."""
    out, indent = [], len(lines[i]) - len(lines[i].lstrip())
    for line in reversed(lines[:i]):
        ind = len(line) - len(line.lstrip())
        if ind < indent and line.strip():
            out.append(line)
            indent = ind
    return out


@pytest.mark.parametrize(("d", "threads"), [(1, 1), (31, 16), (33, 32), (1000, 512), (4097, 512)])
def test_block_fits_short_rows_and_barriers_are_uniform(d, threads):
    kernel = _compile(SOFTMAX, *_inputs(SOFTMAX, (7, d)), options=_rows(SOFTMAX, 512))
    assert f"block={threads},1,1" in kernel.schedule
    assert f"rows threads={threads} " in kernel.schedule
    lines = kernel.loops.splitlines()
    marks = [i for i, line in enumerate(lines) if "// reduction" in line or "// rows" in line]
    assert len(marks) == (3 if threads > 1 else 1)
    for i in marks:  # no thread index on any condition or loop around a combine
        assert all("_tx" not in line for line in _enclosing(lines, i)), kernel.loops
    ptx = _checked_ptx(kernel)
    assert ptx.count(".entry") == 1
    assert ("shfl.sync" in ptx) == (threads > 1)
    if threads > 1:  # two per combine (4), at the end of the row (1)
        assert ptx.count("bar.sync") == 5


def test_single_row_and_one_column():
    k = _compile(ROWSUM, np.zeros((1, 4097), np.float32), options=_rows(ROWSUM, 512))
    assert "kernel grid=1,1,1 block=512,1,1" in k.schedule
    k = _compile(ROWSUM, np.zeros((1000, 1), np.float32))
    assert "block=1,1,1" in k.schedule and "reduction S" not in k.schedule
    _checked_ptx(k)


@pytest.mark.parametrize("op", OPS)
@pytest.mark.parametrize("t", list(DTYPES))
def test_every_operator_and_dtype_compiles(t, op):
    if DTYPES[t] is None:
        pytest.skip("bfloat16 arrays need ml_dtypes")
    src = ROWRED.format(t=t, op=op)
    x = np.zeros((5, 1000), DTYPES[t])
    kernel = _compile(src, x)
    # one statement: 512 threads per row; 8-bit values are not shuffled: that reduction runs
    # on one thread, and so does the block (every thread of it must work at every row, or
    # thread 0 alone would reach the row's barriers), the kernel stays one
    threads = 1 if t == "int8" else 512
    assert f"rows threads={threads} " in kernel.schedule
    assert ("reduction S0 threads=512" in kernel.schedule) == (t != "int8")
    assert _checked_ptx(kernel).count(".entry") == 1


def test_non_row_programs_keep_their_default():
    for src in (case_by_name("matmul").source,
                "def fc(float(B, M) I, float(N, M) W, float(N) b) -> (O) {\n"
                " O(i, n) +=! I(i, m) * W(n, m)\n O(i, n) = fmax(O(i, n) + b(n), 0) }",
                "def tr(float(N, M) A) -> (B) { B(m, n) = A(n, m) }",
                "def g(float(N, D) X) -> (S, O) { S(n) +=! X(n, d)\n O(n, d) = X(n, d) / S(0) }",
                case_by_name("maxpool").source):
        fn = tc.define(src).ir
        assert reduction_defaults(tc.MappingOptions, fn) is None, src
        assert tc.MappingOptions.default_for(fn, "cuda").row_block == 0
    # a bias vector (no row index) is fine
    src = "def f(float(N, D) X, float(D) g) -> (O) { m(n) +=! X(n, d)\n O(n, d) = X(n, d) * g(d) - m(n) }"
    assert reduction_defaults(tc.MappingOptions, tc.define(src).ir) is not None


ROW_CASES = [c for c in CASES if reduction_defaults(tc.MappingOptions, tc.define(c.source, name=c.entry).ir) is not None]


def test_the_corpus_has_row_programs():
    assert {"softmax_temporaries", "layernorm"} <= {c.name for c in ROW_CASES}


@pytest.mark.parametrize("case", ROW_CASES, ids=[c.name for c in ROW_CASES])
def test_corpus_row_programs_compile_to_one_kernel(case, rng):
    fn = tc.define(case.source, name=case.entry)
    for sizes in case.sizes:
        kernel = fn.compile(*case.make_inputs(rng, **sizes), target="cuda", arch="sm_90")
        assert "rows threads=" in kernel.schedule
        assert _checked_ptx(kernel).count(".entry") == 1


# found by test_random_programs on the H200: at N=2 isl fuses the two thread-0 phases (S0 and
# S1's init) into one `if (_tx == 0) { S0(..); S1_init(..); }`; they are independent, so the
# row body may run them in one barrier interval
FUSED_PHASES = """def f(float(N) X, float(N, N) Y) -> (T0, T1) {
    T0(i) = X(i) * X(i)
    T1(i) *=! Y(i, r) * X(i)
}"""


@pytest.mark.parametrize("n", [1, 2, 3, 37])
def test_fused_row_phases(n, rng):
    fn = tc.define(FUSED_PHASES)
    x, y = rng.uniform(-1, 1, n).astype(np.float32), rng.uniform(-1, 1, (n, n)).astype(np.float32)
    kernel = fn.compile(x, y, target="cuda", arch="sm_90")
    assert "rows threads=" in kernel.schedule and _checked_ptx(kernel).count(".entry") == 1


def test_only_independent_statements_share_a_row_phase():
    from tcmlir.codegen.gpu_rows import independent_calls

    fused = tc.define(FUSED_PHASES).ir
    assert independent_calls(fused, {(0, False), (1, True)})  # S0 and S1's init
    assert independent_calls(fused, {(0, False), (1, False)})  # S1 reads X and Y only
    chain = tc.define("def f(float(N) X) -> (A, B) { A(i) = X(i)\n B(i) = A(i) + 1 }").ir
    assert not independent_calls(chain, {(0, False), (1, False)})  # B reads A
    assert independent_calls(chain, {(0, False), (1, True)})  # an init reads nothing
    same = tc.define("def f(float(N) X) -> (A) { A(i) = X(i)\n A(i) = A(i) * 2 }").ir
    assert not independent_calls(same, {(0, False), (1, True)})  # both write A


@pytest.mark.gpu
def test_fused_row_phases_on_gpu(rng):
    fn = tc.define(FUSED_PHASES, target="cuda")
    for n in (1, 2, 3, 37):
        x = rng.uniform(-1, 1, n).astype(np.float32)
        y = rng.uniform(-1, 1, (n, n)).astype(np.float32)
        t0, t1 = (np.asarray(o) for o in fn(x, y))
        np.testing.assert_allclose(t0, x * x, rtol=1e-6)
        np.testing.assert_allclose(t1, np.prod(y * x[:, None], axis=1), rtol=1e-5, atol=1e-6)


FULL = "def f({t}(N) A) -> (s) {{ s {op}=! A(i) }}"


@pytest.mark.parametrize("op", OPS)
@pytest.mark.parametrize("t", ["float", "double", "int32", "int64"])
def test_full_reduction_spans_the_grid(t, op):
    src = FULL.format(t=t, op=op)
    fn = tc.define(src)
    assert tc.MappingOptions.default_for(fn.ir, "cuda").row_block == 1024
    kernel = _compile(src, np.zeros(1 << 20, DTYPES[t]))
    # the identity first (one thread), then every block folds its share atomically (a sum by
    # red.global.add, other operators by compare-and-swap);
    # with 128-bit lanes every thread reads a group: at most 2^20 / (lanes * 1024) blocks
    lanes = 16 // np.dtype(DTYPES[t]).itemsize
    assert "kernel grid=1,1,1 block=1,1,1" in kernel.schedule
    assert f"kernel grid={min(264, (1 << 20) // (lanes * 1024))},1,1 block=1024,1,1" in kernel.schedule
    assert "reduction S0 threads=1024 atomic" in kernel.schedule
    ptx = _checked_ptx(kernel)
    assert ptx.count(".entry") == 2
    assert ("atom.relaxed.sys.global.cas" in ptx) == (op != "+")
    assert ("atom.global.add" in ptx) == (op == "+")
    assert "bar.sync" in ptx and "shfl.sync.bfly" in ptx


@pytest.mark.parametrize(("n", "schedule"), [(1, "kernel grid=1,1,1 block=1,1,1"),
                                             (5, "block=4,1,1"), (1000, "grid=1,1,1 block=512,1,1"),
                                             (4099, "grid=4,1,1 block=1024,1,1")])
def test_short_full_reductions(n, schedule):
    kernel = _compile(FULL.format(t="float", op="+"), np.zeros(n, np.float32))
    assert schedule in kernel.schedule
    _checked_ptx(kernel)


COLUMN = "def f({t}(N, D) X) -> (S) {{ S(d) {op}=! X(n, d) }}"


@pytest.mark.parametrize("op", OPS)
@pytest.mark.parametrize("t", ["float", "double", "int32", "int64"])
def test_column_reduction_is_coalesced(t, op):
    src = COLUMN.format(t=t, op=op)
    assert tc.MappingOptions.default_for(tc.define(src).ir, "cuda").row_block == 512
    kernel = _compile(src, np.zeros((4096, 32768), DTYPES[t]))
    assert "kernel grid=64,1,1 block=512,1,1" in kernel.schedule      # the identity
    assert "kernel grid=64,8,1 block=512,1,1" in kernel.schedule      # 8 chunks of rows
    assert "accumulate S0 atomic" in kernel.schedule
    # consecutive threads read consecutive columns of one row
    assert "S0(512 * _bx + _tx, _by + 8 * c1)" in kernel.loops
    ptx = _checked_ptx(kernel)
    assert ptx.count(".entry") == 2 and "bar.sync" not in ptx
    assert ("atom.global.add" in ptx) == (op == "+") and ("cas" in ptx) == (op != "+")


def test_half_full_reduction_keeps_the_naive_default():
    fn = tc.define(FULL.format(t="float16", op="+")).ir
    assert reduction_defaults(tc.MappingOptions, fn) is None


# ---------------------------------------------------------------- options and errors


def test_row_options_round_trip_and_pipeline():
    opts = tc.MappingOptions().map_rows(256).map_to_blocks(99)
    assert opts.row_block == 256
    assert tc.MappingOptions.from_json(opts.to_json()) == opts
    pipe = opts.to_pipeline("cuda")
    assert pipe.startswith("inline-temporaries,schedule{")
    assert pipe.endswith("map-rows{threads=256,grid=99}")
    assert "map-rows" not in opts.to_pipeline("cpu")
    assert tc.MappingOptions().map_rows(0).to_pipeline("cuda") == tc.MappingOptions().to_pipeline("cuda")
    with pytest.raises(OptionsError, match="row_block"):
        tc.MappingOptions(row_block=-1)
    with pytest.raises(OptionsError, match="map-rows"):
        opts.shared_memory(True).to_pipeline("cuda")


def test_map_rows_on_a_non_row_program_is_a_clear_error():
    with pytest.raises(PipelineError, match="not a row program"):
        _compile("def tr(float(N, M) A) -> (B) { B(m, n) = A(n, m) }", np.zeros((8, 4), np.float32),
                 options=tc.MappingOptions().map_rows(128))


def test_dump_shows_one_kernel(capsys, tmp_path):
    from tcmlir.dump import main

    path = tmp_path / "softmax.tc"
    path.write_text(SOFTMAX)
    opts = tc.MappingOptions.default_for(tc.define(SOFTMAX).ir, "cuda")
    assert main([str(path), "--sizes", "N=64,D=256", "--stage", "loops", "--target", "cuda",
                 "--options", opts.to_json()]) == 0
    out = capsys.readouterr().out
    assert out.count("// kernel grid=") == 1 and "// rows threads=256 local=mx,s" in out


# ---------------------------------------------------------------- on the GPU


def _values(rng, shape, t, op):
    dtype = DTYPES[t]
    if t in ("float", "double", "float16", "bfloat16"):
        if op == "*" and np.prod(shape) >= 1_000_000:
            # Long float products round differently in every association order (float32
            # products of 2^24 values in [0.999, 1.001] differ by ~1% between a sequential and
            # a blocked order), so long products use exactly representable factors: random
            # signs and 64 factors of 2 and of 0.5 at random places; any lost or doubled
            # block then shows up as a wrong sign or power of two (the products are exact).
            x = rng.choice(np.array([-1.0, 1.0]), size=shape)
            flat = x.reshape(-1)
            where = rng.choice(flat.size, size=128, replace=False)
            flat[where[:64]] *= 2.0
            flat[where[64:]] *= 0.5
            return x.astype(dtype)
        lo, hi = (0.999, 1.001) if op == "*" else (-1.0, 1.0)
        return rng.uniform(lo, hi, size=shape).astype(dtype)
    lo, hi = (-1, 2) if op == "*" else (-1000, 1000)
    return rng.integers(lo, hi, size=shape).astype(dtype)


GPU_SHAPES = [(7, 1), (300, 31), (300, 33), (64, 1000), (33, 4097), (2, 1_000_000), (1, 4097),
              (1000, 1)]
GPU_TYPES = ["float", "double", "int32", "int64", "float16", "bfloat16"]


@pytest.mark.gpu
@pytest.mark.parametrize("shape", GPU_SHAPES, ids=[f"{r}x{c}" for r, c in GPU_SHAPES])
@pytest.mark.parametrize("op", OPS)
@pytest.mark.parametrize("t", GPU_TYPES)
def test_row_reduction_on_gpu(t, op, shape, rng):
    if DTYPES[t] is None:
        pytest.skip("bfloat16 arrays need ml_dtypes")
    src = ROWRED.format(t=t, op=op)
    x = _values(rng, shape, t, op)
    ref = run_program(tc.define(src, target="numpy"), [x])
    rtol = {"float": 1e-3, "float16": 2e-2, "bfloat16": 2e-2, "double": 1e-9}.get(t)
    for opts in (None, tc.MappingOptions().map_rows(32).map_to_blocks(5)):
        got = run_program(tc.define(src, target="cuda"), [x], options=opts)
        assert_outputs_close(got, ref, rtol, context=f"{src} {shape} {opts}")


@pytest.mark.gpu
@pytest.mark.parametrize("n", (1, 33, 1000, 4097, 1_000_000, 1 << 24))
@pytest.mark.parametrize("op", OPS)
@pytest.mark.parametrize("t", ["float", "double", "int32", "int64"])
def test_full_reduction_on_gpu(t, op, n, rng):
    src = FULL.format(t=t, op=op)
    x = _values(rng, (n,), t, op)
    ref = run_program(tc.define(src, target="numpy"), [x])
    rtol = {"float": 1e-3, "double": 1e-9}.get(t)
    for opts in (None, tc.MappingOptions().map_rows(64).map_to_blocks(7)):
        got = run_program(tc.define(src, target="cuda"), [x], options=opts)
        assert_outputs_close(got, ref, rtol, context=f"{src} n={n} {opts}")


COLUMN_SHAPES = [(1, 1), (1000, 1), (1_000_000, 3), (4097, 33), (31, 1000), (2, 4097)]


@pytest.mark.gpu
@pytest.mark.parametrize("shape", COLUMN_SHAPES, ids=[f"{r}x{c}" for r, c in COLUMN_SHAPES])
@pytest.mark.parametrize("op", OPS)
@pytest.mark.parametrize("t", ["float", "double", "int32", "int64"])
def test_column_reduction_on_gpu(t, op, shape, rng):
    src = COLUMN.format(t=t, op=op)
    x = _values(rng, shape, t, op)
    ref = run_program(tc.define(src, target="numpy"), [x])
    rtol = {"float": 1e-3, "double": 1e-9}.get(t)
    for opts in (None, tc.MappingOptions().map_rows(64).map_to_blocks(3)):
        got = run_program(tc.define(src, target="cuda"), [x], options=opts)
        assert_outputs_close(got, ref, rtol, context=f"{src} {shape} {opts}")


@pytest.mark.gpu
@pytest.mark.parametrize("shape", [(1, 1), (5, 31), (300, 33), (64, 4097), (2, 1_000_000)], ids=str)
@pytest.mark.parametrize("src", [SOFTMAX, LAYERNORM], ids=["softmax", "layernorm"])
def test_softmax_layernorm_on_gpu(src, shape, rng):
    x = rng.uniform(-3, 3, size=shape).astype(np.float32)
    inputs = [x, np.float32(1e-5)] if "eps" in src else [x]
    ref = run_program(tc.define(src, target="numpy"), inputs)
    for opts in (None, tc.MappingOptions().map_rows(1024).map_to_blocks(3)):
        got = run_program(tc.define(src, target="cuda"), inputs, options=opts)
        assert_outputs_close(got, ref, 2e-4, context=f"{shape} {opts}")


@pytest.mark.gpu
@pytest.mark.parametrize("case", ROW_CASES, ids=[c.name for c in ROW_CASES])
def test_corpus_row_programs_on_gpu(case, rng):
    for opts in (None, tc.MappingOptions().map_rows(64).map_to_blocks(2)):
        for sizes in case.sizes:
            inputs = case.make_inputs(rng, **sizes)
            ref = run_program(tc.define(case.source, name=case.entry, target="numpy"), inputs)
            got = run_program(tc.define(case.source, name=case.entry, target="cuda"), inputs,
                              options=opts)
            assert_outputs_close(got, ref, case.rtol, context=f"{case.name} {sizes} {opts}")


@pytest.mark.parametrize("sizes", [{"N": 3, "C": 5, "H": 7, "W": 9}, {"N": 64, "C": 64, "H": 4, "W": 8}],
                         ids=str)
def test_rows_of_two_indices_spread_over_blocks(sizes, rng):
    """``O(n, c) +=! I(n, c, h, w)``: every (n, c) row on its own block (the row number
    linearised), not a block per c walking every n (64 blocks for 4096 rows: 6.2 ms on an
    H100 against 0.08 ms for torch)."""

    from tcmlir.poly.gpu_mapping import kernel_marks
    from tcmlir.simulate import simulate_call

    fn = tc.define("def gap(float(N,C,H,W) I) -> (O) { O(n, c) +=! I(n, c, h, w) / (H * W) }")
    x = rng.standard_normal([sizes[k] for k in "NCHW"]).astype(np.float32)
    opts = tc.MappingOptions.default_for(fn, "cuda", sizes)
    kernel = fn.compile(x, target="cuda", arch="sm_90", options=opts)
    ((_, mark),) = kernel_marks(isl.Schedule.read_from_str(isl.Context(), kernel.schedule))
    assert mark.grid[0] == sizes["N"] * sizes["C"]
    (got,) = simulate_call(fn.ir, [x], opts)
    np.testing.assert_allclose(got, x.mean(axis=(2, 3)), rtol=1e-4, atol=1e-6)


def test_group_norm_is_a_row_program(rng):
    """A per-group operand ``Gm(g, c)`` carries one of the two row indices (n, g): read no more
    per row than the row itself, so the group norm runs as one row kernel (before: six kernels,
    its reductions a thread per (n, g) walking 25 thousand values)."""
    from tcmlir.simulate import simulate_call

    src = """def groupnorm(float(N,G,C,S) I, float(G,C) Gm, float(G,C) Bt) -> (O) {
        mean(n, g) +=! I(n, g, c, s) / (C * S)
        d(n, g, c, s) = I(n, g, c, s) - mean(n, g)
        var(n, g) +=! d(n, g, c, s) * d(n, g, c, s) / (C * S)
        O(n, g, c, s) = d(n, g, c, s) * rsqrt(var(n, g) + 1e-5) * Gm(g, c) + Bt(g, c)
    }"""
    fn = tc.define(src)
    sizes = {"N": 3, "G": 4, "C": 2, "S": 37}
    opts = tc.MappingOptions.default_for(fn, "cuda", sizes)
    assert opts.row_block
    x = rng.standard_normal((3, 4, 2, 37)).astype(np.float32)
    gm, bt = (rng.standard_normal((4, 2)).astype(np.float32) for _ in range(2))
    (got,) = simulate_call(fn.ir, [x, gm, bt], opts)
    flat = x.reshape(3, 4, -1).astype(np.float64)
    norm = (flat - flat.mean(-1, keepdims=True)) / np.sqrt(flat.var(-1, keepdims=True) + 1e-5)
    want = norm.reshape(x.shape) * gm[None, :, :, None] + bt[None, :, :, None]
    np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-4)


BN_TRAIN = """def bn_train(float(N,C,H,W) X, float(C) G, float(C) Bt) -> (O) {
    mean(c) +=! X(n, c, h, w) / (N * H * W)
    d(n, c, h, w) = X(n, c, h, w) - mean(c)
    var(c) +=! d(n, c, h, w) * d(n, c, h, w) / (N * H * W)
    O(n, c, h, w) = d(n, c, h, w) * rsqrt(var(c) + 1e-5) * G(c) + Bt(c)
}"""


@pytest.mark.parametrize("shape", [(2, 3, 5, 7), (3, 4, 9, 40)], ids=str)
def test_batch_norm_rows_are_its_channels(shape, rng):
    """Every statement of a training batch norm shares the lhs index ``c``: with its loops
    reordered (`map_rows.rows_first`) it is a row program, a block per channel whose threads
    cover ``h * W + w`` (before: a thread per channel walking N x H x W, 166 ms on an H100)."""
    from tcmlir.passes.map_rows import row_program_problem, rows_first

    from tcmlir.poly.gpu_mapping import kernel_marks
    from tcmlir.simulate import simulate_call

    fn = tc.define(BN_TRAIN)
    assert row_program_problem(fn.ir) is not None
    assert row_program_problem(rows_first(fn.ir)) is None
    sizes = dict(zip("NCHW", shape, strict=True))
    opts = tc.MappingOptions.default_for(fn, "cuda", sizes)
    assert opts.row_block
    x = rng.standard_normal(shape).astype(np.float32)
    g, bt = (rng.standard_normal(shape[1]).astype(np.float32) for _ in range(2))
    kernel = fn.compile(x, g, bt, target="cuda", arch="sm_90", options=opts)
    ((_, mark),) = kernel_marks(isl.Schedule.read_from_str(isl.Context(), kernel.schedule))
    assert mark.grid[0] == shape[1] and mark.block[0] > shape[3] // 2
    (got,) = simulate_call(fn.ir, [x, g, bt], opts)
    x64 = x.astype(np.float64)
    mean, var = x64.mean((0, 2, 3), keepdims=True), x64.var((0, 2, 3), keepdims=True)
    want = (x64 - mean) / np.sqrt(var + 1e-5) * g[None, :, None, None] + bt[None, :, None, None]
    np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-4)
