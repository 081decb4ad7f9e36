"""Regression tests for the front-end and reference-interpreter items of issue 12.

Each section names the item; every test here failed on main before its fix."""

from __future__ import annotations

import warnings

import numpy as np
import pytest
from conftest import target_params

import tcmlir as tc
from tcmlir.dtypes import DType
from tcmlir.poly.scop import build_scop, format_scop

TARGETS = target_params()


# ---------------------------------------------------------------- 9: ?: guards in the bounds proof

PAD = "def pad(float(N) A) -> (O) { O(i) = (i >= 2) ? A(i - 2) : 0.0 where i in 0:N }"
STENCIL = ("def st(float(N) A) -> (O) {\n"
           "    O(i) = (i >= 1 && i < N - 1) ? A(i - 1) + A(i + 1) : 0.0 where i in 0:N\n}")
ELSE_ARM = "def pad(float(N) A) -> (O) { O(i) = (i < 2 || i >= N + 2) ? 0.0 : A(i - 2) where i in 0:N + 4 }"


@pytest.mark.parametrize("target", TARGETS)
def test_guarded_padding_reads_are_proved_in_bounds(target):
    a = np.arange(1, 8, dtype=np.float32)
    out = tc.define(PAD, target=target)(a)
    np.testing.assert_array_equal(out, np.concatenate([[0, 0], a[:-2]]))
    out = tc.define(STENCIL, target=target)(a)
    expected = np.zeros_like(a)
    expected[1:-1] = a[:-2] + a[2:]
    np.testing.assert_array_equal(out, expected)
    out = tc.define(ELSE_ARM, target=target)(a)
    np.testing.assert_array_equal(out, np.concatenate([[0, 0], a, [0, 0]]))


def test_guards_restrict_the_scop_reads():
    fn = tc.define(PAD, target="numpy")
    assert fn.ir.preconditions == ()
    text = format_scop(build_scop(fn.ir))
    read = next(line for line in text.splitlines() if "read: " in line and "A[" in line)
    assert "i >= 2" in read


@pytest.mark.parametrize("src", [
    "def f(float(N) A) -> (O) { O(i) = (i >= 1) ? A(i - 2) : 0.0 where i in 0:N + 1 }",
    "def f(float(N) A) -> (O) { O(i) = (i >= 2) ? 0.0 : A(i - 2) where i in 0:N }",
    "def f(float(N) A) -> (O) { O(i) = (i >= 2 || A(i) > 0.0) ? A(i - 2) : 0.0 where i in 0:N }",
])
def test_guards_that_do_not_cover_the_access_are_still_rejected(src):
    with pytest.raises(tc.InferenceError, match=r"A\(i - 2\) may read outside"):
        tc.define(src, target="numpy")


# ---------------------------------------------------------------- 4: the oracle's ?: is lazy

GUARDED_GATHER = ("def g(float(N) A, int32(K) Idx) -> (O) {\n"
                  "    O(k, a) = (Idx(k) + a < N) ? A(Idx(k) + a) : 0.0 where a in 0:3\n}")


@pytest.mark.parametrize("target", TARGETS)
def test_guarded_gather_is_only_read_where_taken(target):
    a = np.arange(10, 15, dtype=np.float32)
    idx = np.array([0, 2, 4], dtype=np.int32)
    out = tc.define(GUARDED_GATHER, target=target)(a, idx)
    np.testing.assert_array_equal(out, [[10, 11, 12], [12, 13, 14], [14, 0, 0]])


def test_reference_still_checks_the_taken_arm():
    fn = tc.define(GUARDED_GATHER.replace("< N", "< N + 1"), target="numpy")
    with pytest.raises(tc.CallError, match="gathered index 5"):
        fn(np.zeros(5, np.float32), np.array([0, 4], dtype=np.int32))


def test_reference_nested_selects_and_no_live_point():
    src = ("def g(float(N) A, int32(K) Idx) -> (O) {\n"
           "    O(k) = (Idx(k) < 0) ? A(Idx(k) + 100) : ((Idx(k) < N) ? A(Idx(k)) : -1.0)\n}")
    fn = tc.define(src, target="numpy")
    a = np.arange(3, dtype=np.float32)
    np.testing.assert_array_equal(fn(a, np.array([2, 7, 0], np.int32)), [2, -1, 0])


# ---------------------------------------------------------------- 1: index arithmetic overflow

@pytest.mark.parametrize(("src", "culprit"), [
    ("def f(float(N) A) -> (O) {\n  O(i) = A(((i * 4611686018427387904) / 4611686018427387904 - i)"
     " * 100000000 + i)\n}", (2, 14)),
    ("def f(float(N) A) -> (O) {\n  O(i) = A(9223372036854775807 * i / 9223372036854775807)\n}",
     (2, 12)),
])
def test_index_arithmetic_that_may_overflow_is_a_located_error(src, culprit):
    with pytest.raises(tc.InferenceError, match="may overflow") as info:
        tc.define(src, target="numpy")
    assert (info.value.line, info.value.col) == culprit


@pytest.mark.parametrize("target", TARGETS)
def test_large_but_safe_index_arithmetic_runs(target):
    fn = tc.define("def f(float(N) A) -> (O) { O(i) = A(i * 1000000000 - i * 999999999) }",
                   target=target)
    a = np.arange(4, dtype=np.float32)
    np.testing.assert_array_equal(fn(a), a)


def test_a_guard_that_wraps_for_huge_sizes_is_a_silent_precondition():
    src = "def f(float(N) A) -> (O) { O(i) = (i + 2 * N >= 2 + 2 * N) ? A(i - 2) : 0.0 where i in 0:N }"
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # no warning: only sizes near 2^31 are excluded
        fn = tc.define(src, target="numpy")
    (cond,) = fn.ir.preconditions
    from tcmlir.binding import bind_sizes

    with pytest.raises(tc.CallError, match=f"precondition {cond}"):
        bind_sizes(fn.ir, [(2**30 + 5,)])
    a = np.arange(1, 6, dtype=np.float32)
    np.testing.assert_array_equal(fn(a), [0, 0, 1, 2, 3])


def test_sizes_beyond_the_overflow_proof_are_refused():
    from tcmlir.binding import bind_sizes

    fn = tc.define("def f(float(N) A) -> (O) { O(i) = A(i) }", target="numpy")
    assert bind_sizes(fn.ir, [(2**31 - 1,)]) == {"N": 2**31 - 1}
    with pytest.raises(tc.CallError, match=r"N=2147483648 is too large"):
        bind_sizes(fn.ir, [(2**31,)])


# ---------------------------------------------------------------- 2: half reductions in float32

@pytest.mark.parametrize("target", TARGETS)
def test_float16_reductions_accumulate_in_float32(target):
    rowsum = tc.define("def f(float16(N, K) A) -> (O) { O(i) +=! A(i, j) }", target=target)
    np.testing.assert_array_equal(rowsum(np.ones((2, 3000), np.float16)), [3000, 3000])
    mm = tc.define("def mm(float16(M, K) A, float16(K, N) B) -> (C) { C(i, j) +=! A(i, k) * B(k, j) }",
                   target=target)
    out = mm(np.ones((3, 3000), np.float16), np.ones((3000, 2), np.float16))
    assert out.dtype == np.float16
    np.testing.assert_array_equal(out, np.full((3, 2), 3000))
    onto = tc.define("def f(float16(N, K) A) -> (float16(N) B) { B(i) += A(i, j) }", target=target)
    start = np.array([2, 4], np.float16)
    np.testing.assert_array_equal(onto(np.ones((2, 3000), np.float16), outputs=(start.copy(),)),
                                  [3002, 3004])


def test_half_reductions_are_rewritten_over_a_float32_accumulator():
    fn = tc.define("def f(bfloat16(N, K) A) -> (O) { O(i) +=! A(i, j)\n O_acc(i) = O(i) }",
                   target="numpy")
    (acc,) = (t for t in fn.ir.temporaries if t.name == "O_acc1")
    assert acc.dtype is DType.FLOAT32
    text = str(fn.ir)
    assert "O_acc1(i) +=! A(i, j)" in text and "O(i) = O_acc1(i)" in text
    same = tc.define("def f(float16(N, K) A) -> (O) { O(i) max=! A(i, j) }", target="numpy")
    assert same.ir.temporaries == () and len(same.ir.statements) == 1


def test_bfloat16_row_sum_of_ones():
    ml_dtypes = pytest.importorskip("ml_dtypes")
    for target in ("numpy", "cpu"):
        fn = tc.define("def f(bfloat16(N, K) A) -> (O) { O(i) +=! A(i, j) }", target=target)
        out = fn(np.ones((2, 1000), ml_dtypes.bfloat16)).astype(np.float32)
        np.testing.assert_array_equal(out, [1000, 1000])


# ---------------------------------------------------------------- 3: reading what the statement writes

@pytest.mark.parametrize(("src", "culprit"), [
    ("def f(float(N) A) -> (O) {\n  O(i) = A(i)\n  O(i) = O(N - 1 - i)\n}", "O(N - 1 - i) reads elements"),
    ("def f(float(N) A) -> (O) {\n  O(i) = A(i)\n  O(i) = O(i-1) + A(i) where i in 1:N\n}",
     "O(i - 1) reads elements"),
    ("def f(float(N, M) A) -> (O) {\n  O(i) = A(i, 0)\n  O(i) += O(i) * A(i, j)\n}",
     "O(i) reads values other instances of this reduction update"),
    ("def f(float(N) A, int32(N) I) -> (O) {\n  O(i) = A(i)\n  O(i) = O(I(i))\n}",
     "O(I(i)) reads it through a gather"),
])
def test_order_dependent_statements_are_rejected(src, culprit):
    with pytest.raises(tc.InferenceError, match="unspecified in TC") as info:
        tc.define(src, target="numpy")
    assert culprit in str(info.value) and info.value.line == 3
    assert "write the result to a new tensor instead of overwriting O" in str(info.value)


@pytest.mark.parametrize("target", TARGETS)
def test_reading_only_its_own_element_is_allowed(target):
    fn = tc.define("def f(float(N) A) -> (O) {\n  O(i) = A(i)\n  O(i) = O(i) * O(i) + 1.0\n}",
                   target=target)
    a = np.arange(4, dtype=np.float32)
    np.testing.assert_array_equal(fn(a), a * a + 1)
    rev = tc.define("def f(float(N) A) -> (O) {\n  T(i) = A(i)\n  O(i) = T(N - 1 - i)\n}",
                    target=target)
    np.testing.assert_array_equal(rev(a), a[::-1])


# ---------------------------------------------------------------- 6: float -> integer casts saturate

_CAST_INPUT = np.array([1.0, -1.0, np.nan, np.inf, -np.inf, 3.7, -3.7, 1e10, -1e30], np.float32)


def _saturated(ty: str) -> list[int]:
    info = np.iinfo(ty)
    out = []
    for v in _CAST_INPUT.astype(np.float64):
        out.append(0 if np.isnan(v) else int(min(max(np.trunc(v), info.min), info.max)))
    return out


@pytest.mark.parametrize("target", TARGETS)
@pytest.mark.parametrize("ty", ["uint64", "int64", "int32", "uint8", "int8"])
def test_float_to_int_casts_saturate_on_every_target(target, ty):
    fn = tc.define(f"def f(float(N) A) -> (O) {{ O(i) = {ty}(A(i)) }}", target=target)
    assert fn(_CAST_INPUT).tolist() == _saturated(ty)


@pytest.mark.parametrize("target", TARGETS)
def test_issue_cast_example(target):
    fn = tc.define("def f(float(N) A) -> (O) { O(i) = uint64(-A(i) * 1e30) }", target=target)
    assert fn(np.array([1.0, -1.0], np.float32)).tolist() == [0, 2**64 - 1]


def test_constant_casts_fold_like_run_time_casts():
    fn = tc.define("def f(float(N) A) -> (O) { O(i) = A(i) + float(int8(300)) + float(int32(1e30)) }",
                   target="numpy")
    assert "44.0:float32" in str(fn.ir) and "2147483647.0:float32" in str(fn.ir)


# ---------------------------------------------------------------- 8: inference past empty ranges

WEIRD = "def f(float(H, W) I, float(KW) K) -> (O) { O(h, w) +=! I(h + w, w + kw) * K(kw) }"


@pytest.mark.parametrize("target", TARGETS)
def test_inference_continues_past_a_range_that_may_be_empty(target):
    fn = tc.define(WEIRD, target=target)
    (st,) = fn.ir.statements
    assert {r.name: (str(r.lo), str(r.hi)) for r in st.ranges} == {
        "h": ("0", "H - W + KW"), "w": ("0", "1 + W - KW"), "kw": ("0", "KW")}
    rng = np.random.default_rng(3)
    i, k = rng.random((6, 5), dtype=np.float32), rng.random(3, dtype=np.float32)
    expected = np.array([[sum(i[h + w, w + kw] * k[kw] for kw in range(3)) for w in range(3)]
                         for h in range(4)], dtype=np.float32)
    np.testing.assert_allclose(fn(i, k), expected, rtol=1e-5)
    with pytest.raises(tc.CallError, match="KW=3"):
        fn(np.ones((6, 2), np.float32), k)


# ---------------------------------------------------------------- 10: <=> annotations

@pytest.mark.parametrize("stmt", [
    "C(i, j) +=! A(i, k) * B(k, j) <=> matmul(A(i, k), B(k, j))",
    "C(i, j) +=! A(i, k) * B(k, j) <=> matmul(A, B) where k in 0:K",
    "C(i, j) +=! A(i, k) * B(k, j) where k in 0:K <=> matmul(A(i, k), B(k, j))",
])
def test_equivalence_annotation_is_accepted_and_kept(stmt):
    from tcmlir.lang import parse
    from tcmlir.lang.printer import format_stmt

    src = f"def mm(float(M, K) A, float(K, N) B) -> (C) {{ {stmt} }}"
    (parsed,) = parse(src).defs[0].body
    assert parsed.equivalent is not None and "<=> matmul(" in format_stmt(parsed)
    assert parse(format_stmt(parsed).join(src.split(stmt))) == parse(src)
    out = tc.define(src, target="numpy")(np.ones((2, 3), np.float32), np.ones((3, 4), np.float32))
    np.testing.assert_array_equal(out, np.full((2, 4), 3))


def test_equivalence_needs_a_comprehension():
    with pytest.raises(tc.ParseError, match="after '<=>'"):
        tc.define("def f(float(N) A) -> (O) { O(i) = A(i) <=> 3 }")


# ---------------------------------------------------------------- 21: the multi-def hint

def test_multi_def_hint_names_the_real_parameter():
    with pytest.raises(tc.SemaError, match=r"pass name= \(the CLIs: --name\), one of: a, b"):
        tc.define("def a(float(N) A) -> (O) { O(i) = A(i) }\ndef b(float(N) A) -> (O) { O(i) = A(i) }")


# ---------------------------------------------------------------- 11: non-affine indices

@pytest.mark.parametrize("target", TARGETS)
def test_modulo_by_a_size_in_an_index_is_a_checked_may_access(target):
    fn = tc.define("def f(float(N, KC) I, float(C) W) -> (O) { O(n, kc) = I(n, kc) * W(kc % C) }",
                   target=target)
    rng = np.random.default_rng(5)
    i, w = rng.random((2, 7), dtype=np.float32), rng.random(3, dtype=np.float32)
    np.testing.assert_array_equal(fn(i, w), i * w[np.arange(7) % 3])
    prod = tc.define("def f(float(N) A) -> (O) { O(i, j) = A(i * j) where i in 0:3, j in 0:3 }",
                     target=target)
    a = np.arange(5, dtype=np.float32)
    np.testing.assert_array_equal(prod(a), np.outer(np.arange(3), np.arange(3)))
    with pytest.raises(tc.CallError, match="index"):
        prod(a[:4])


def test_non_affine_index_needs_a_positive_constant_divisor_when_constant():
    with pytest.raises(tc.SemaError, match="needs a positive divisor"):
        tc.define("def f(float(N) A) -> (O) { O(i) = A(i / -2) where i in 0:N }")


# ---------------------------------------------------------------- 13, 14, 15: limits and scaling

def _deep_lets(count: int, depth: int) -> str:
    lets = ", ".join(f"x{k + 1} = {'(' * depth}x{k}{' + 1.0)' * depth}" for k in range(count))
    return f"def f(float(N) A) -> (O) {{ O(i) = x{count} where x0 = A(i), {lets} }}"


def test_chained_deep_lets_are_a_located_error_not_a_recursion_error():
    with pytest.raises(tc.SemaError, match="nested too deeply once lets are substituted"):
        tc.define(_deep_lets(5, 150), target="numpy")
    fn = tc.define(_deep_lets(2, 60), target="numpy")  # 120 levels: fine
    np.testing.assert_array_equal(fn(np.zeros(2, np.float32)), [120, 120])


def _doubling(count: int) -> str:
    lets = ", ".join(f"x{k + 1} = x{k} + x{k}" for k in range(count))
    return f"def f(float(N) A) -> (O) {{ O(i) = x{count} where x0 = A(i), {lets} }}"


@pytest.mark.parametrize("target", TARGETS)
def test_doubling_lets_are_shared_not_expanded(target):
    import time

    start = time.perf_counter()
    fn = tc.define(_doubling(11), target=target)
    np.testing.assert_array_equal(fn(np.ones(3, np.float32)), [2048] * 3)
    assert time.perf_counter() - start < 15
    start = time.perf_counter()
    with pytest.raises(tc.SemaError, match=r"has 3221225471 nodes once lets are substituted"):
        tc.define(_doubling(30), target=target)
    assert time.perf_counter() - start < 2  # at once, not exponential


def test_one_let_is_checked_once():
    from tcmlir.lang import check, parse
    from tcmlir.lang.sema import _tree_size

    fn = check(parse(_doubling(8)))
    rhs = fn.statements[0].rhs
    assert _tree_size(rhs, {}) == 3 * 2**8 - 1
    assert len({id(n) for n in ir_nodes(rhs)}) == 8 + 2  # a DAG: one node per let (and A, i)


def ir_nodes(e):
    from tcmlir import ir

    seen, todo = {}, [e]
    while todo:
        n = todo.pop()
        if id(n) not in seen:
            seen[id(n)] = n
            todo.extend(ir.children(n))
    return list(seen.values())


def test_rank_and_statement_limits_answer_at_once():
    from tcmlir.lang.sema import MAX_RANK, MAX_STATEMENTS

    dims = ", ".join(f"N{k}" for k in range(MAX_RANK + 1))
    with pytest.raises(tc.SemaError, match=f"rank {MAX_RANK + 1}; tcmlir supports at most"):
        tc.define(f"def f(float({dims}) A) -> (O) {{ O(i) = A(i) }}")
    idx = ", ".join(f"i{k}" for k in range(MAX_RANK + 1))
    with pytest.raises(tc.SemaError, match=f"{MAX_RANK + 2} indices"):  # i and i0..i16
        tc.define(f"def f(float(N) A) -> (O) {{ O(i) +=! A(i) where {', '.join(f'{v} in 0:2' for v in idx.split(', '))} }}")
    body = "\n".join(f"  T{k}(i) = A(i)" for k in range(MAX_STATEMENTS)) + "\n  O(i) = A(i)"
    with pytest.raises(tc.SemaError, match=f"{MAX_STATEMENTS + 1} statements"):
        tc.define(f"def f(float(N) A) -> (O) {{\n{body}\n}}")
    dims = ", ".join(f"N{k}" for k in range(MAX_RANK))
    idx = ", ".join(f"i{k}" for k in range(MAX_RANK))
    fn = tc.define(f"def f(float({dims}) A) -> (O) {{ O({idx}) = A({idx}) }}", target="numpy")
    assert fn.ir.outputs[0].rank == MAX_RANK


# ---------------------------------------------------------------- 16: Python scalars

SCALARS = ("def f(float(N) A, int32 s, float alpha, bool b, uint8 u) -> (O) {\n"
           "    O(i) = b ? A(i) * float(s) * alpha + float(u) : 0.0\n}")


@pytest.mark.parametrize(("args", "message"), [
    ((2**40, 1.0, True, 1), r"scalar s \(int32\) must be in \[-2147483648, 2147483647\]"),
    ((float("nan"), 1.0, True, 1), r"scalar s \(int32\) must be an integer, got nan"),
    ((1.9, 1.0, True, 1), r"scalar s \(int32\) must be an integer, got 1.9 .*lose information"),
    ((1, 1e300, True, 1), r"scalar alpha \(float32\): 1e\+300 overflows float32"),
    ((1, 1.0, 2, 1), r"scalar b \(bool\) must be True or False"),
    ((1, 1.0, True, -1), r"scalar u \(uint8\) must be in \[0, 255\]"),
    ((1, 1.0, True, np.int64(300)), r"scalar u \(uint8\) must be in \[0, 255\]"),
])
@pytest.mark.parametrize("target", TARGETS)
def test_bad_python_scalars_are_call_errors_naming_the_parameter(target, args, message):
    fn = tc.define(SCALARS, target=target)
    with pytest.raises(tc.CallError, match=message):
        fn(np.ones(2, np.float32), *args)


@pytest.mark.parametrize("target", TARGETS)
def test_exact_scalars_convert(target):
    fn = tc.define(SCALARS, target=target)
    a = np.ones(2, np.float32)
    np.testing.assert_array_equal(fn(a, 2.0, 1.0, True, 1), [3, 3])
    np.testing.assert_array_equal(fn(a, np.int64(3), np.float64(0.5), np.bool_(True), np.uint8(7)),
                                  [8.5, 8.5])
    np.testing.assert_array_equal(fn(a, 1, float("inf"), 1, 0), [np.inf, np.inf])


# ---------------------------------------------------------------- 20: default_for as docs/using.md shows it

def test_default_options_for_a_defined_function():
    fn = tc.define("def mm(float(M, K) A, float(K, N) B) -> (C) { C(i, j) +=! A(i, k) * B(k, j) }",
                   target="numpy")
    assert tc.MappingOptions.default_for(fn, "cpu") == tc.MappingOptions.default_for(fn.ir, "cpu")
    assert tc.MappingOptions.default_for(fn, "cpu") == tc.MappingOptions.naive()
