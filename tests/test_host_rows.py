"""Row programs on the cpu target: row-local temporaries (`codegen.host_rows`), divisions by a
row value turned into one reciprocal, and chunks on the calling thread, against numpy in
float64 at awkward sizes (1, 7, 1023 columns), one and two threads."""

from __future__ import annotations

import re

import numpy as np
import pytest

import tcmlir as tc
from tcmlir.codegen.host_rows import ROW_BYTES
from tcmlir.errors import CallError

SOFTMAX = """def softmax(float(N, M) X) -> (Y) {
  mx(n) max=! X(n, m)
  e(n, m) = exp(X(n, m) - mx(n))
  s(n) +=! e(n, m)
  Y(n, m) = e(n, m) / s(n)
}"""
LAYERNORM = """def layernorm(float(T, D) I, float(D) G, float(D) Bt) -> (O) {
  mean(t) +=! I(t, d) / D
  c(t, d) = I(t, d) - mean(t)
  var(t) +=! c(t, d) * c(t, d) / D
  O(t, d) = c(t, d) * rsqrt(var(t) + 1e-5) * G(d) + Bt(d)
}"""
FUSED = tc.MappingOptions(fusion="max")  # what the cpu default gives these programs


def _softmax(x):
    x = x.astype(np.float64)
    e = np.exp(x - x.max(axis=1, keepdims=True))
    return e / e.sum(axis=1, keepdims=True)


def _layernorm(x, g, b):
    x = x.astype(np.float64)
    c = x - x.mean(axis=1, keepdims=True)
    return c / np.sqrt((c * c).mean(axis=1, keepdims=True) + 1e-5) * g + b


def _close(got, want, tol=2e-6):
    got = np.asarray(got, np.float64)
    assert got.shape == want.shape
    err = np.max(np.abs(got - want)) / max(1e-30, np.max(np.abs(want)))
    assert err < tol, err


@pytest.mark.parametrize("threads", [1, 2])
@pytest.mark.parametrize("rows,cols", [(1, 7), (7, 1), (13, 7), (5, 1023), (300, 7)])
def test_softmax_and_layernorm_rows(rng, rows, cols, threads):
    x = (rng.standard_normal((rows, cols)) * 4).astype(np.float32)
    g = rng.standard_normal(cols).astype(np.float32)
    b = rng.standard_normal(cols).astype(np.float32)
    opts = FUSED.with_threads(threads)
    sm = tc.define(SOFTMAX, target="cpu")
    ln = tc.define(LAYERNORM, target="cpu")
    k_sm, k_ln = sm.compile(x, options=opts), ln.compile(x, g, b, options=opts)
    for _ in range(2):  # the first call binds in full, the second takes the prepared plan
        _close(sm(x, options=opts), _softmax(x))
        _close(ln(x, g, b, options=opts), _layernorm(x, g, b), 2e-5)
    _close(k_sm.launch(x), _softmax(x))
    _close(k_ln.launch(x, g, b), _layernorm(x, g, b), 2e-5)
    out = np.full((rows, cols), np.nan, np.float32)  # outputs= binds in full (HostKernel.run)
    sm(x, options=opts, outputs=out)
    _close(out, _softmax(x))
    if rows > 1:  # one row: no loop over rows, nothing to keep a row of
        assert k_sm.runner.on_chip == {"mx", "e", "s"}
        assert k_ln.runner.on_chip == {"mean", "c", "var"}
        assert re.search(r"%\"?e\.row\"? = alloca float, i64 " + str(cols), k_sm.llvm_ir)


def test_default_options_keep_rows_on_the_stack():
    x = np.ones((64, 256), np.float32)
    fn = tc.define(SOFTMAX, target="cpu")
    kernel = fn.compile(x)
    assert kernel.runner.on_chip == {"mx", "e", "s"}
    _close(kernel.launch(x), np.full((64, 256), 1 / 256))


def test_row_division_is_one_reciprocal_per_row(monkeypatch):
    """``e(n, m) / s(n)``: the division by the row's sum leaves the loop as one reciprocal
    (LLVM's arcp on host divisions); the vector loop multiplies."""
    monkeypatch.setenv("TCMLIR_ALWAYS_COMPILE", "1")  # the optimised IR, not a cached object
    x = np.ones((64, 256), np.float32)
    kernel = tc.define(SOFTMAX, target="cpu").compile(x, options=FUSED)
    optimized = kernel.runner.optimized_ir
    divisions = re.findall(r"= fdiv [^\n]*", optimized)
    assert divisions and all(" x float>" not in d for d in divisions), divisions
    assert all("arcp float 1.0" in d for d in divisions), divisions


@pytest.mark.parametrize("threads", [1, 2])
def test_a_temporary_of_two_groups_keeps_the_full_buffer(rng, threads):
    """``t(m, n)`` reads other rows: ``t`` is complete (one parallel loop) before ``Y`` reads
    it (another): a full buffer, and the results of the full buffer."""
    src = """def tr(float(N, N) X) -> (Y) {
      t(n, m) = X(n, m) * 2
      Y(n, m) = t(m, n) + t(n, m)
    }"""
    x = rng.standard_normal((37, 37)).astype(np.float32)
    kernel = tc.define(src, target="cpu").compile(x, options=FUSED.with_threads(threads))
    assert "t" not in kernel.runner.on_chip
    _close(kernel.launch(x), 2.0 * x.T.astype(np.float64) + 2.0 * x)


def test_a_row_read_before_it_is_written_keeps_the_full_buffer(rng):
    """``t(n, 0) += 1`` adds onto the zero the language promises for the element the first
    statement did not write: a stack row would carry the previous row's value (2, not 1)."""
    src = """def part(float(N, M) X) -> (Y) {
      t(n, m) = X(n, m) where m in 1:M
      t(n, m) += 1.0 where m in 0:1
      Y(n, m) = t(n, m) * 3
    }"""
    x = rng.standard_normal((29, 11)).astype(np.float32)
    kernel = tc.define(src, target="cpu").compile(x, options=FUSED.with_threads(1))
    assert kernel.runner.on_chip == frozenset()
    want = 3.0 * x.astype(np.float64)
    want[:, 0] = 3.0
    for _ in range(2):
        _close(kernel.launch(x), want)


def test_rows_across_the_loop_keep_the_full_buffer(rng):
    """Column sums: one parallel loop over ``m`` calls ``S0(c1, c0)``, so ``t(n, m)``'s first
    index is not the loop's iterator (a stack row per iteration would hold a column)."""
    src = """def cols(float(N, M) X) -> (Y) {
      t(n, m) = X(n, m) * X(n, m)
      c(m) +=! t(n, m)
      Y(n, m) = t(n, m) / c(m)
    }"""
    x = rng.standard_normal((23, 9)).astype(np.float32)
    kernel = tc.define(src, target="cpu").compile(x, options=FUSED.with_threads(2))
    assert "t" not in kernel.runner.on_chip
    sq = x.astype(np.float64) ** 2
    _close(kernel.launch(x), sq / sq.sum(axis=0))


def test_parametric_kernels_keep_buffers(rng):
    x = rng.standard_normal((9, 5)).astype(np.float32)
    opts = FUSED.with_threads(2)
    kernel = tc.define(SOFTMAX, target="cpu").compile(x, options=opts.with_parametric(True))
    assert kernel.runner.on_chip == frozenset()
    _close(kernel.launch(x), _softmax(x))


@pytest.mark.parametrize("bad", [3, 99_990])
def test_gather_errors_from_either_chunk(bad):
    """Two threads: the pool runs the first chunk, the calling thread the last; a failed
    bounds check in either is reported."""
    src = "def g(float(N) X, int32(N) I) -> (Y) { Y(n) = X(I(n)) }"
    n = 100_000
    x = np.arange(n, dtype=np.float32)
    idx = np.arange(n, dtype=np.int32)[::-1].copy()
    fn = tc.define(src, target="cpu")
    opts = tc.MappingOptions.naive().with_threads(2)
    np.testing.assert_array_equal(fn(x, idx, options=opts), x[::-1])
    idx[bad] = n + 5
    for _ in range(2):
        with pytest.raises(CallError, match=f"gather index {n + 5}"):
            fn(x, idx, options=opts)


def test_rows_past_the_stack_budget_keep_buffers(rng):
    """Rows of 40000 floats (160 KB) pass `ROW_BYTES`: ``e`` keeps its buffer; the 1-element
    rows of ``mx`` and ``s`` still fit."""
    x = rng.standard_normal((3, 40000)).astype(np.float32)
    kernel = tc.define(SOFTMAX, target="cpu").compile(x, options=FUSED.with_threads(2))
    assert ROW_BYTES < 40000 * 4
    assert kernel.runner.on_chip == {"mx", "s"}
    _close(kernel.launch(x), _softmax(x))


@pytest.mark.parametrize("dtype,tol", [("float64", 1e-12), ("float16", 2e-3)])
def test_rows_of_other_element_types(rng, dtype, tol):
    src = SOFTMAX.replace("float(N, M)", f"{dtype}(N, M)")
    x = rng.standard_normal((13, 7)).astype(dtype)
    kernel = tc.define(src, target="cpu").compile(x, options=FUSED.with_threads(2))
    # (float16: the float32 accumulator of the half sum, s_acc, is a row temporary too)
    assert kernel.runner.on_chip >= {"mx", "e", "s"}
    _close(kernel.launch(x), _softmax(x), tol)


def test_a_late_worker_leaves_its_chunks_to_the_caller():
    """The pool's one worker is busy (as a worker waiting for a core on a loaded machine
    would be): the calling thread takes every chunk and the result is whole; the worker, once
    free, finds none left."""
    import threading

    x = np.random.default_rng(5).standard_normal((300, 256)).astype(np.float32)
    from tcmlir.runtime.host_plan import host_plan

    fn = tc.define(SOFTMAX, target="cpu")
    kernel = fn.compile(x, options=FUSED.with_threads(2))
    runner = kernel.runner
    plan = host_plan(runner, fn.ir, {"N": 300, "M": 256})
    plan.split, plan._times = True, None  # split calls (as measured faster on an idle machine)
    ran: list[str] = []
    for entry in runner.entries:
        real = entry.call

        def call(*args, real=real):
            ran.append(threading.current_thread().name)
            real(*args)

        object.__setattr__(entry, "call", call)
    gate = threading.Event()
    blocker = runner._executor().submit(gate.wait)
    threading.Timer(0.3, gate.set).start()
    try:
        _close(kernel.launch(x), _softmax(x))
    finally:
        gate.set()
        blocker.result()
    assert len(ran) > 2 and set(ran) == {threading.main_thread().name}, ran
