"""Tests of the numpy reference interpreter against independently written numpy / Python.

The IR is built by hand (helpers below); a few tests go through the front end when it exists.
"""

from __future__ import annotations

import math
import time

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tcmlir import ir, reference, reference_builtins
from tcmlir.dtypes import DType
from tcmlir.errors import CallError, CodegenError

F16, F32, F64 = DType.FLOAT16, DType.FLOAT32, DType.FLOAT64
I8, I32, I64, BOOL = DType.INT8, DType.INT32, DType.INT64, DType.BOOL
IN, OUT, TMP = ir.Role.INPUT, ir.Role.OUTPUT, ir.Role.TEMP
ADD, MUL, MIN, MAX = ir.Reduction.ADD, ir.Reduction.MUL, ir.Reduction.MIN, ir.Reduction.MAX


# ---------------------------------------------------------------- IR builders


def sz(x) -> ir.SizeExpr:
    if isinstance(x, ir.SizeExpr):
        return x
    return ir.SizeExpr.constant(x) if isinstance(x, int) else ir.SizeExpr.param(x)


def tensor(name, dtype, shape, role) -> ir.Tensor:
    return ir.Tensor(name, dtype, tuple(sz(d) for d in shape), role)


def ix(x) -> ir.Expr:
    return ir.Index(x) if isinstance(x, str) else x


def rd(name, *idx, dtype=F32) -> ir.Read:
    return ir.Read(name, tuple(ix(i) for i in idx), dtype)


def const(v, dtype=F32) -> ir.Const:
    return ir.Const(v, dtype)


def bop(op, a, b, dtype=F32) -> ir.Binary:
    return ir.Binary(op, a, b, dtype)


def stmt(t, lhs, rhs, ranges, reduction=None, init=False) -> ir.Statement:
    rs = tuple(ir.IndexRange(n, sz(lo), sz(hi)) for n, lo, hi in ranges)
    return ir.Statement(t, tuple(lhs), reduction, init, rhs, rs)


def func(inputs, outputs, statements, temporaries=(), sizes=()) -> ir.Function:
    return ir.Function("f", tuple(sizes), "{ : }", tuple(inputs), tuple(outputs),
                       tuple(temporaries), tuple(statements))


def matmul_fn(dtype=F32):
    return func(
        [tensor("A", dtype, ["M", "K"], IN), tensor("B", dtype, ["K", "N"], IN)],
        [tensor("C", dtype, ["M", "N"], OUT)],
        [stmt("C", ["m", "n"], bop("*", rd("A", "m", "k", dtype=dtype),
                                   rd("B", "k", "n", dtype=dtype), dtype),
              [("m", 0, "M"), ("n", 0, "N"), ("k", 0, "K")], ADD, True)],
        sizes=["M", "N", "K"],
    )


def elementwise(rhs, in_dtypes, out_dtype=F32, n="N"):
    """out(i) = rhs over i in [0, N), inputs named A, B, ... of shape (N,)."""
    names = "ABCD"[: len(in_dtypes)]
    return func([tensor(nm, t, [n], IN) for nm, t in zip(names, in_dtypes, strict=True)],
                [tensor("out", out_dtype, [n], OUT)],
                [stmt("out", ["i"], rhs, [("i", 0, n)])], sizes=[n])


rng = np.random.default_rng(0)


# ---------------------------------------------------------------- statements


def test_matmul():
    A = rng.standard_normal((5, 7)).astype(np.float32)
    B = rng.standard_normal((7, 3)).astype(np.float32)
    out = reference.run(matmul_fn(), {"A": A, "B": B}, {"M": 5, "N": 3, "K": 7})
    assert list(out) == ["C"] and out["C"].dtype == np.float32
    np.testing.assert_allclose(out["C"], A.astype(np.float64) @ B, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("op", [ADD, MUL, MIN, MAX])
@pytest.mark.parametrize("init", [True, False])
@pytest.mark.parametrize("dtype", [I32, F64])
def test_reductions(op, init, dtype):
    A = rng.integers(-4, 5, size=(4, 6)).astype(dtype.numpy)
    base = rng.integers(-9, 10, size=4).astype(dtype.numpy)
    fn = func([tensor("A", dtype, ["N", "M"], IN)], [tensor("out", dtype, ["N"], OUT)],
              [stmt("out", ["i"], rd("A", "i", "j", dtype=dtype),
                    [("i", 0, "N"), ("j", 0, "M")], op, init)], sizes=["N", "M"])
    given_out = base.copy()
    res = reference.run(fn, {"A": A}, {"N": 4, "M": 6}, {"out": given_out})
    assert res["out"] is given_out
    red = {ADD: A.sum(1), MUL: A.prod(1), MIN: A.min(1), MAX: A.max(1)}[op]
    combine = {ADD: np.add, MUL: np.multiply, MIN: np.minimum, MAX: np.maximum}[op]
    expected = red if init else combine(base, red)
    np.testing.assert_array_equal(given_out, expected.astype(dtype.numpy))


def test_fresh_outputs_start_at_zero():
    fn = func([tensor("A", I32, ["N"], IN)], [tensor("s", I32, [], OUT)],
              [stmt("s", [], rd("A", "i", dtype=I32), [("i", 0, "N")], ADD, False)], sizes=["N"])
    A = np.arange(10, dtype=np.int32)
    assert reference.run(fn, {"A": A}, {"N": 10})["s"] == 45
    assert reference.run(fn, {"A": A}, {"N": 10}, {"s": np.array(5, np.int32)})["s"] == 50


def test_assign_sub_box_keeps_the_rest():
    lo = ir.SizeExpr("[N] -> { [(N - 3)] }")
    fn = elementwise(bop("*", rd("A", "i"), const(2.0)), [F32])
    fn = func(fn.inputs, fn.outputs, [stmt("out", ["i"], fn.statements[0].rhs,
                                           [("i", 2, lo)])], sizes=["N"])
    A = np.arange(8, dtype=np.float32)
    garbage = np.full(8, -7.0, np.float32)
    reference.run(fn, {"A": A}, {"N": 8}, {"out": garbage})
    np.testing.assert_array_equal(garbage, [-7, -7, 4, 6, 8, -7, -7, -7])


def test_empty_ranges():
    fn = func([tensor("A", I32, ["N", "M"], IN)], [tensor("out", I32, ["N"], OUT)],
              [stmt("out", ["i"], rd("A", "i", "j", dtype=I32),
                    [("i", 0, "N"), ("j", 5, "M")], MAX, True),
               stmt("out", ["i"], const(1, I32), [("i", 3, 2)])], sizes=["N", "M"])
    out = np.full(2, 9, np.int32)
    reference.run(fn, {"A": np.zeros((2, 3), np.int32)}, {"N": 2, "M": 3}, {"out": out})
    # the `!` initialises although its reduction range is empty; the empty `=` does nothing
    np.testing.assert_array_equal(out, [np.iinfo(np.int32).min] * 2)


def test_softmax_with_temporaries():
    X = rng.standard_normal((6, 9)).astype(np.float32)
    x = rd("X", "i", "j")
    fn = func(
        [tensor("X", F32, ["N", "M"], IN)], [tensor("Y", F32, ["N", "M"], OUT)],
        [stmt("mx", ["i"], x, [("i", 0, "N"), ("j", 0, "M")], MAX, True),
         stmt("e", ["i", "j"], ir.Call("exp", (bop("-", x, rd("mx", "i")),), F32),
              [("i", 0, "N"), ("j", 0, "M")]),
         stmt("s", ["i"], rd("e", "i", "j"), [("i", 0, "N"), ("j", 0, "M")], ADD, True),
         stmt("Y", ["i", "j"], bop("/", rd("e", "i", "j"), rd("s", "i")),
              [("i", 0, "N"), ("j", 0, "M")])],
        temporaries=[tensor("mx", F32, ["N"], TMP), tensor("e", F32, ["N", "M"], TMP),
                     tensor("s", F32, ["N"], TMP)],
        sizes=["N", "M"],
    )
    out = reference.run(fn, {"X": X}, {"N": 6, "M": 9})
    assert list(out) == ["Y"]
    e = np.exp(X.astype(np.float64) - X.max(1, keepdims=True))
    np.testing.assert_allclose(out["Y"], e / e.sum(1, keepdims=True), rtol=1e-6)


def test_scalar_input_and_output():
    fn = func([tensor("alpha", F32, [], IN), tensor("A", F32, ["N"], IN)],
              [tensor("out", F32, ["N"], OUT), tensor("tot", F32, [], OUT)],
              [stmt("out", ["i"], bop("*", rd("alpha"), rd("A", "i")), [("i", 0, "N")]),
               stmt("tot", [], rd("out", "i"), [("i", 0, "N")], ADD, True)], sizes=["N"])
    A = np.arange(5, dtype=np.float32)
    res = reference.run(fn, {"alpha": np.array(2.5, np.float32), "A": A}, {"N": 5})
    np.testing.assert_array_equal(res["out"], 2.5 * A)
    assert res["tot"].shape == () and res["tot"] == 25.0


def test_float16_storage_rounds_after_float32_arithmetic():
    fn = elementwise(bop("+", rd("A", "i"), rd("B", "i")), [F16, F16], F16)
    A = np.array([1.0, 2048.0, 0.1, 65504.0], np.float16)
    B = np.array([2.0 ** -11, 1.0, 0.2, 65504.0], np.float16)
    out = reference.run(fn, {"A": A, "B": B}, {"N": 4})["out"]
    assert out.dtype == np.float16
    with np.errstate(over="ignore"):
        expected = (A.astype(np.float32) + B.astype(np.float32)).astype(np.float16)
    np.testing.assert_array_equal(out, expected)


def test_float16_reduction_accumulates_in_float32():
    fn = func([tensor("A", F16, ["N"], IN)], [tensor("s", F16, [], OUT)],
              [stmt("s", [], rd("A", "i"), [("i", 0, "N")], ADD, True)], sizes=["N"])
    A = np.full(4096, 1.0, np.float16)  # a float16 running sum would stick at 2048
    assert reference.run(fn, {"A": A}, {"N": 4096})["s"] == 4096


def test_integer_arithmetic_wraps():
    fn = elementwise(bop("+", rd("A", "i", dtype=I8), const(100, I8), I8), [I8], I8)
    out = reference.run(fn, {"A": np.array([100, -100, 27], np.int8)}, {"N": 3})["out"]
    np.testing.assert_array_equal(out, np.array([-56, 0, 127], np.int8))


# ---------------------------------------------------------------- expressions


def c_div(a: int, b: int) -> int:
    return 0 if b == 0 else int(math.copysign(abs(a) // abs(b), 1 if (a < 0) == (b < 0) else -1))


def c_mod(a: int, b: int) -> int:
    return 0 if b == 0 else a - c_div(a, b) * b


def test_c_division_and_modulo():
    a = np.array([7, -7, 7, -7, 0, 5, -1, 2**31 - 1], np.int32)
    b = np.array([2, 2, -2, -2, 3, 0, 5, -3], np.int32)
    for op, ref in (("/", c_div), ("%", c_mod)):
        fn = elementwise(bop(op, rd("A", "i", dtype=I32), rd("B", "i", dtype=I32), I32),
                         [I32, I32], I32)
        out = reference.run(fn, {"A": a, "B": b}, {"N": len(a)})["out"]
        assert out.tolist() == [ref(int(x), int(y)) for x, y in zip(a, b, strict=True)], op


def test_int_min_divided_by_minus_one_does_not_crash():
    fn = elementwise(bop("/", rd("A", "i", dtype=I32), const(-1, I32), I32), [I32], I32)
    reference.run(fn, {"A": np.array([-(2**31)], np.int32)}, {"N": 1})


@settings(max_examples=50, deadline=None)
@given(st.lists(st.tuples(st.integers(-(2**31) + 1, 2**31 - 1), st.integers(-(2**31), 2**31 - 1)),
                min_size=1, max_size=20))
def test_c_division_property(pairs):
    a = np.array([p[0] for p in pairs], np.int32)
    b = np.array([p[1] for p in pairs], np.int32)
    for op, ref in (("/", c_div), ("%", c_mod)):
        fn = elementwise(bop(op, rd("A", "i", dtype=I32), rd("B", "i", dtype=I32), I32),
                         [I32, I32], I32)
        out = reference.run(fn, {"A": a, "B": b}, {"N": len(a)})["out"]
        assert out.tolist() == [ref(x, y) for x, y in pairs]


def test_float_modulo_is_fmod():
    fn = elementwise(bop("%", rd("A", "i"), rd("B", "i")), [F32, F32])
    a = np.array([5.5, -5.5, 5.5, -5.5], np.float32)
    b = np.array([2.0, 2.0, -2.0, -2.0], np.float32)
    out = reference.run(fn, {"A": a, "B": b}, {"N": 4})["out"]
    np.testing.assert_array_equal(out, [1.5, -1.5, 1.5, -1.5])


def test_select_and_comparisons():
    a = rd("A", "i")
    rhs = ir.Select(bop(">", a, const(0.0), BOOL), a, bop("*", const(0.5), a), F32)
    A = np.array([-2.0, -0.0, 3.0, 0.25], np.float32)
    out = reference.run(elementwise(rhs, [F32]), {"A": A}, {"N": 4})["out"]
    np.testing.assert_array_equal(out, np.where(A > 0, A, 0.5 * A))
    logic = bop("||", bop("<", a, const(-1.0), BOOL),
                ir.Unary("!", bop("<=", a, const(1.0), BOOL), BOOL), BOOL)
    out = reference.run(elementwise(logic, [F32], BOOL), {"A": A}, {"N": 4})["out"]
    assert out.dtype == np.bool_ and out.tolist() == [True, False, True, False]


def test_index_and_size_values():
    rhs = bop("-", ir.Cast(ir.Index("i"), F32), ir.Cast(ir.Size("N"), F32))
    fn = func([], [tensor("out", F32, ["N"], OUT)], [stmt("out", ["i"], rhs, [("i", 0, "N")])],
              sizes=["N"])
    np.testing.assert_array_equal(reference.run(fn, {}, {"N": 4})["out"], [-4, -3, -2, -1])


def test_casts():
    A = np.array([2.7, -2.7, 0.0, 1e3], np.float32)
    out = reference.run(elementwise(ir.Cast(rd("A", "i"), I32), [F32], I32), {"A": A}, {"N": 4})
    assert out["out"].tolist() == [2, -2, 0, 1000]
    out = reference.run(elementwise(ir.Cast(rd("A", "i"), BOOL), [F32], BOOL), {"A": A}, {"N": 4})
    assert out["out"].tolist() == [True, True, False, True]
    ints = np.array([3, -4], np.int64)
    fn = elementwise(bop("/", ir.Cast(rd("A", "i", dtype=I64), F64), const(2.0, F64), F64), [I64], F64)
    assert reference.run(fn, {"A": ints}, {"N": 2})["out"].tolist() == [1.5, -2.0]


# ---------------------------------------------------------------- built-ins


def call(name, *arrays, dtype=F32):
    args = tuple(rd("ABCD"[k], "i", dtype=dtype) for k in range(len(arrays)))
    fn = elementwise(ir.Call(name, args, dtype), [dtype] * len(arrays), dtype)
    arrays = [np.asarray(a, dtype.numpy) for a in arrays]
    return reference.run(fn, dict(zip("ABCD", arrays, strict=False)), {"N": len(arrays[0])})["out"]


def test_round_is_half_away_from_zero():
    x = [0.5, 1.5, 2.5, -0.5, -2.5, 0.49999997, -0.49999997, 3.2, -3.7]
    out = call("round", x)
    assert out.dtype == np.float32
    assert out.tolist() == [1, 2, 3, -1, -3, 0, 0, 3, -4]
    assert call("round", [0.49999999999999994, 2.5], dtype=F64).tolist() == [0.0, 3.0]


def test_remainder_is_ieee():
    x = [5.0, 7.0, -5.0, 5.5, 1e30, 3.0, 6.0]
    y = [2.0, 2.0, 2.0, 2.0, 3.0, 0.0, float("inf")]
    out = call("remainder", x, y, dtype=F64)
    expected = [math.remainder(a, b) if b != 0 else math.nan for a, b in zip(x, y, strict=True)]
    np.testing.assert_array_equal(out, expected)


finite = st.floats(allow_nan=False, allow_infinity=False, width=32)


@settings(max_examples=200, deadline=None)
@given(finite, finite.filter(lambda v: v != 0))
def test_remainder_property(x, y):
    for dtype in (F32, F64):
        got = call("remainder", [x], [y], dtype=dtype)[0]
        want = math.remainder(x, y)  # float32 inputs: the remainder is exact in float32
        assert got == want and math.copysign(1, got) == math.copysign(1, want), (x, y, dtype)


def test_assorted_builtins():
    x = np.array([0.25, 1.0, 2.0, 9.5], np.float32)
    x64 = x.astype(np.float64)
    np.testing.assert_allclose(call("exp", x), np.exp(x64), rtol=1e-7)
    np.testing.assert_allclose(call("rsqrt", x), 1 / np.sqrt(x64), rtol=1e-7)
    np.testing.assert_allclose(call("exp10", x), 10.0 ** x64, rtol=1e-7)
    np.testing.assert_allclose(call("erf", x), [math.erf(v) for v in x64], rtol=1e-7)
    np.testing.assert_allclose(call("normcdf", x, dtype=F64),
                               [0.5 * math.erfc(-v / math.sqrt(2)) for v in x64], rtol=1e-15)
    assert call("logb", [0.75, 1.0, 1023.9, 0.0, -8.0]).tolist() == [-1, 0, 9, -math.inf, 3]
    assert call("fdim", [3.0, 1.0], [1.0, 3.0]).tolist() == [2.0, 0.0]
    assert call("sinpi", [0.5, 1.0, 1.5, 2.0, 0.25], dtype=F64).tolist() == \
        [1.0, 0.0, -1.0, 0.0, math.sin(math.pi / 4)]
    assert call("cospi", [0.5, 1.0, 2.0], dtype=F64).tolist() == [0.0, -1.0, 1.0]
    assert call("fmax", [1.0, math.nan], [math.nan, 2.0]).tolist() == [1.0, 2.0]
    assert call("norm3d", [3.0], [4.0], [12.0]).tolist() == [13.0]
    assert call("fma", [2.0], [3.0], [1.0]).tolist() == [7.0]
    assert call("tgamma", [5.0, 0.0, -1.0], dtype=F64)[:2].tolist() == [24.0, math.inf]
    assert math.isnan(call("tgamma", [-1.0], dtype=F64)[0])
    assert call("lgamma", [1.0, 0.0], dtype=F64).tolist() == [0.0, math.inf]
    assert call("nextafter", [1.0], [2.0])[0] == np.nextafter(np.float32(1), np.float32(2))
    assert call("cyl_bessel_i0", [0.0])[0] == 1.0


def test_every_builtin_evaluates():
    from tcmlir.lang.ast import BUILTINS

    for name, arity in BUILTINS.items():
        if name in ("min", "max"):
            continue
        if name in reference_builtins.SCIPY_BUILTINS and reference_builtins.scipy_special() is None:
            continue
        out = call(name, *([[0.5, 0.25]] * arity))
        assert out.dtype == np.float32 and out.shape == (2,), name


def test_scipy_builtins(monkeypatch):
    special = reference_builtins.scipy_special()
    if special is not None:
        np.testing.assert_allclose(call("j0", [1.0], dtype=F64), special.j0(1.0))
        np.testing.assert_allclose(call("erfinv", [0.5], dtype=F64), special.erfinv(0.5))
    monkeypatch.setattr(reference_builtins, "scipy_special", lambda: None)
    with pytest.raises(CodegenError, match=r"'j1'.*needs scipy|needs scipy.*'j1'"):
        call("j1", [1.0])


# ---------------------------------------------------------------- gathers and bounds


def gather_fn():
    return func([tensor("A", F32, ["N"], IN), tensor("I", I32, ["M"], IN)],
                [tensor("out", F32, ["M"], OUT)],
                [stmt("out", ["i"], rd("A", rd("I", "i", dtype=I32)), [("i", 0, "M")])],
                sizes=["N", "M"])


def test_gather():
    A = np.arange(10, dtype=np.float32) * 3
    idx = np.array([9, 0, 4, 4], np.int32)
    out = reference.run(gather_fn(), {"A": A, "I": idx}, {"N": 10, "M": 4})["out"]
    np.testing.assert_array_equal(out, A[idx])


@pytest.mark.parametrize("bad", [10, -1])
def test_gather_out_of_bounds(bad):
    idx = np.array([1, bad, 2], np.int32)
    with pytest.raises(CallError, match=rf"{bad} in dimension 0 of tensor 'A'.*extent 10"):
        reference.run(gather_fn(), {"A": np.zeros(10, np.float32), "I": idx}, {"N": 10, "M": 3})


def test_floordiv_floormod_indices():
    i = ir.Index("i", I64)
    rhs = bop("+", rd("A", bop("floordiv", i, const(2, I64), I64)),
              rd("A", bop("floormod", bop("-", i, const(3, I64), I64), const(4, I64), I64)))
    fn = func([tensor("A", F32, [4], IN)], [tensor("out", F32, [8], OUT)],
              [stmt("out", ["i"], rhs, [("i", 0, 8)])])
    A = np.array([1.0, 10.0, 100.0, 1000.0], np.float32)
    out = reference.run(fn, {"A": A}, {})["out"]
    np.testing.assert_array_equal(out, [A[k // 2] + A[(k - 3) % 4] for k in range(8)])


# ---------------------------------------------------------------- chunking and speed


def test_chunking_gives_the_same_result(monkeypatch):
    A = rng.integers(-5, 5, size=(13, 11)).astype(np.int32)
    B = rng.integers(-5, 5, size=(11, 7)).astype(np.int32)
    sizes = {"M": 13, "N": 7, "K": 11}
    whole = reference.run(matmul_fn(I32), {"A": A, "B": B}, sizes)["C"]
    np.testing.assert_array_equal(whole, A @ B)
    for limit in (1, 5, 40, 100):
        small = reference.run(matmul_fn(I32), {"A": A, "B": B}, sizes, chunk_elements=limit)
        np.testing.assert_array_equal(small["C"], whole)
    monkeypatch.setattr(reference, "CHUNK_ELEMENTS", 3)
    np.testing.assert_array_equal(reference.run(matmul_fn(I32), {"A": A, "B": B}, sizes)["C"],
                                  whole)


def test_chunked_full_reduction_and_gather():
    fn = func([tensor("A", I64, ["N"], IN)], [tensor("s", I64, [], OUT)],
              [stmt("s", [], rd("A", "i", dtype=I64), [("i", 0, "N")], ADD, True)], sizes=["N"])
    A = np.arange(1000, dtype=np.int64)
    assert reference.run(fn, {"A": A}, {"N": 1000}, chunk_elements=7)["s"] == A.sum()
    idx = rng.integers(0, 10, size=50).astype(np.int32)
    A = rng.standard_normal(10).astype(np.float32)
    out = reference.run(gather_fn(), {"A": A, "I": idx}, {"N": 10, "M": 50}, chunk_elements=3)
    np.testing.assert_array_equal(out["out"], A[idx])


def test_large_matmul_runs():
    n = 256
    A = rng.standard_normal((n, n)).astype(np.float32)
    B = rng.standard_normal((n, n)).astype(np.float32)
    start = time.perf_counter()
    C = reference.run(matmul_fn(), {"A": A, "B": B}, {"M": n, "N": n, "K": n})["C"]
    print(f"256^3 matmul: {time.perf_counter() - start:.2f}s")
    np.testing.assert_allclose(C, A.astype(np.float64) @ B, rtol=1e-4, atol=1e-4)


# ---------------------------------------------------------------- through the front end


def _front_end():
    import tcmlir.lang as lang

    return lambda src: lang.check(lang.parse(src))


def _c_div_arrays(a, b):
    return np.array([c_div(int(x), int(y)) for x, y in zip(a, b, strict=True)], np.int32)


def _c_mod_arrays(a, b):
    return np.array([c_mod(int(x), int(y)) for x, y in zip(a, b, strict=True)], np.int32)


def _softmax(X):
    e = np.exp(X.astype(np.float64) - X.max(1, keepdims=True))
    return e / e.sum(1, keepdims=True)


_X = rng.standard_normal((4, 6)).astype(np.float32)
_IA = np.array([7, -7, 7, -7, 9], np.int32)
_IB = np.array([2, 2, -2, -2, -4], np.int32)
_V = np.array([0.5, 1.5, 2.5, -0.5, -2.5, 3.25], np.float32)
_IDX = np.array([3, 0, 5, 5], np.int32)

SOURCES = [
    ("def mm(float(M,K) A, float(K,N) B) -> (C) { C(m,n) +=! A(m,k) * B(k,n) }",
     {"A": _X[:, :3], "B": _X[:3, :5].copy()}, {"M": 4, "K": 3, "N": 5},
     lambda: _X[:, :3].astype(np.float64) @ _X[:3, :5]),
    ("def d(int32(N) A, int32(N) B) -> (O) { O(i) = A(i) / B(i) }",
     {"A": _IA, "B": _IB}, {"N": 5}, lambda: _c_div_arrays(_IA, _IB)),
    ("def d(int32(N) A, int32(N) B) -> (O) { O(i) = A(i) % B(i) }",
     {"A": _IA, "B": _IB}, {"N": 5}, lambda: _c_mod_arrays(_IA, _IB)),
    ("def softmax(float(N, M) X) -> (Y) {\n"
     "  mx(i) max=! X(i, j)\n  e(i, j) = exp(X(i, j) - mx(i))\n"
     "  s(i) +=! e(i, j)\n  Y(i, j) = e(i, j) / s(i)\n}",
     {"X": _X}, {"N": 4, "M": 6}, lambda: _softmax(_X)),
    ("def scale(float(N) A, float alpha) -> (O) { O(i) = alpha * A(i) }",
     {"A": _V, "alpha": np.array(2.0, np.float32)}, {"N": 6}, lambda: 2.0 * _V),
    ("def r(float(N) A) -> (O) { O(i) = round(A(i)) }",
     {"A": _V}, {"N": 6}, lambda: np.array([1, 2, 3, -1, -3, 3], np.float32)),
    ("def g(float(N) A, int32(M) I) -> (O) { O(i) = A(I(i)) }",
     {"A": _V, "I": _IDX}, {"N": 6, "M": 4}, lambda: _V[_IDX]),
    ("def h(float16(N) A) -> (float16(N) O) { O(i) = A(i) * 3 }",
     {"A": _V.astype(np.float16)}, {"N": 6}, lambda: (3 * _V).astype(np.float16)),
    ("def diff(float(N) A) -> (O) { O(i) = A(i+1) - A(i) }",
     {"A": _V}, {"N": 6}, lambda: np.diff(_V)),
    ("def sel(float(N) A) -> (O) { O(i) = A(i) > 0 ? A(i) : 0.5 * A(i) }",
     {"A": _V}, {"N": 6}, lambda: np.where(_V > 0, _V, 0.5 * _V)),
    ("def cm(int32(N) A) -> (O) { O(i) = float(A(i)) / 2 + max(A(i), 0) }",
     {"A": _IA}, {"N": 5}, lambda: (_IA / 2 + np.maximum(_IA, 0)).astype(np.float32)),
    ("def up(float(N) A) -> (O) { O(i) = A(i/2) }",
     {"A": _V}, {"N": 6}, lambda: np.repeat(_V, 2)),
    ("def conv(float(H,W) I, float(KH,KW) K) -> (O) { O(h,w) +=! I(h+kh, w+kw) * K(kh,kw) }",
     {"I": _X, "K": _X[:2, :3].copy()}, {"H": 4, "W": 6, "KH": 2, "KW": 3},
     lambda: _conv2d(_X, _X[:2, :3])),
]


def _conv2d(img, ker):
    kh, kw = ker.shape
    out = np.zeros((img.shape[0] - kh + 1, img.shape[1] - kw + 1))
    for h in range(out.shape[0]):
        for w in range(out.shape[1]):
            out[h, w] = (img[h:h + kh, w:w + kw].astype(np.float64) * ker).sum()
    return out


@pytest.mark.parametrize(("src", "inputs", "sizes", "expected"), SOURCES,
                         ids=[s[0].split("(")[0][4:] + str(k) for k, s in enumerate(SOURCES)])
def test_source_text(src, inputs, sizes, expected):
    fn = _front_end()(src)
    out = reference.run(fn, inputs, sizes)
    (result,) = out.values()
    want = expected()
    assert result.dtype == want.dtype or want.dtype == np.float64
    np.testing.assert_allclose(result, want, rtol=1e-6, atol=1e-7)


# ---------------------------------------------------------------- corner cases


def test_statement_reading_its_own_target():
    fn = func([tensor("A", I32, ["N"], IN)], [tensor("out", I32, ["N"], OUT)],
              [stmt("out", ["i"], rd("A", "i", dtype=I32), [("i", 0, "N")]),
               stmt("out", ["i"], bop("*", rd("out", "i", dtype=I32), const(3, I32), I32),
                    [("i", 0, "N")])], sizes=["N"])
    out = reference.run(fn, {"A": np.arange(6, dtype=np.int32)}, {"N": 6}, chunk_elements=2)
    np.testing.assert_array_equal(out["out"], 3 * np.arange(6))


def test_bool_reductions_are_or_and_and():
    A = np.array([[True, False], [False, False], [True, True]])
    for op, want in ((ADD, A.any(1)), (MUL, A.all(1)), (MIN, A.all(1)), (MAX, A.any(1))):
        fn = func([tensor("A", BOOL, ["N", "M"], IN)], [tensor("out", BOOL, ["N"], OUT)],
                  [stmt("out", ["i"], rd("A", "i", "j", dtype=BOOL),
                        [("i", 0, "N"), ("j", 0, "M")], op, True)], sizes=["N", "M"])
        out = reference.run(fn, {"A": A}, {"N": 3, "M": 2})["out"]
        assert out.dtype == np.bool_ and out.tolist() == want.tolist(), op


def test_unsigned_division():
    U32 = DType.UINT32
    fn = elementwise(bop("/", rd("A", "i", dtype=U32), rd("B", "i", dtype=U32), U32), [U32, U32], U32)
    a = np.array([2**32 - 1, 7, 9], np.uint32)
    b = np.array([2, 0, 4], np.uint32)
    assert reference.run(fn, {"A": a, "B": b}, {"N": 3})["out"].tolist() == [2**31 - 1, 0, 2]


def test_reduction_rhs_independent_of_reduction_index():
    fn = func([tensor("A", I32, ["N"], IN)], [tensor("out", I32, ["N"], OUT)],
              [stmt("out", ["i"], rd("A", "i", dtype=I32), [("i", 0, "N"), ("j", 0, 4)], ADD, True)],
              sizes=["N"])
    out = reference.run(fn, {"A": np.array([1, 2], np.int32)}, {"N": 2})["out"]
    assert out.tolist() == [4, 8]


def test_out_of_bounds_affine_read_and_write():
    fn = func([tensor("A", F32, ["N"], IN)], [tensor("out", F32, ["N"], OUT)],
              [stmt("out", ["i"], rd("A", bop("+", ir.Index("i"), const(1, I32), I32)),
                    [("i", 0, "N")])], sizes=["N"])
    with pytest.raises(CallError, match=r"index 4 in dimension 0 of tensor 'A'.*extent 4"):
        reference.run(fn, {"A": np.zeros(4, np.float32)}, {"N": 4})
    fn = func([], [tensor("out", F32, [3], OUT)], [stmt("out", ["i"], const(1.0), [("i", 0, 5)])])
    with pytest.raises(CallError, match=r"'out'.*\[0, 5\).*extent 3"):
        reference.run(fn, {}, {})


def test_cast_to_a_storage_type_rounds():
    rhs = ir.Cast(ir.Cast(rd("A", "i"), F16), F32)
    out = reference.run(elementwise(rhs, [F32]), {"A": np.array([0.1], np.float32)}, {"N": 1})
    assert out["out"][0] == np.float32(np.float16(0.1))


def test_every_scipy_builtin_needs_scipy(monkeypatch):
    monkeypatch.setattr(reference_builtins, "scipy_special", lambda: None)
    for name in reference_builtins.SCIPY_BUILTINS:
        with pytest.raises(CodegenError, match=f"needs scipy for the built-in '{name}'"):
            call(name, [0.5])


def test_float16_chunked_reduction_rounds_once():
    fn = func([tensor("A", F16, ["N"], IN)], [tensor("s", F16, [], OUT)],
              [stmt("s", [], rd("A", "i"), [("i", 0, "N")], ADD, False)], sizes=["N"])
    A = np.full(4096, 1.0, np.float16)
    for limit in (None, 3):
        out = reference.run(fn, {"A": A}, {"N": 4096}, {"s": np.array(1.0, np.float16)},
                            chunk_elements=limit)
        assert out["s"] == np.float16(4097.0), limit  # one rounding of 4097 (to 4096)


def test_constant_index_reads():
    rhs = bop("+", rd("A", const(0, I32)), rd("A", "i"))
    out = reference.run(elementwise(rhs, [F32]), {"A": np.array([5.0, 1.0, 2.0], np.float32)},
                        {"N": 3})
    assert out["out"].tolist() == [10.0, 6.0, 7.0]


def test_source_where_clause_sub_box_and_gather_bounds():
    compile_ = _front_end()
    fn = compile_("def f(float(N) A) -> (float(N) O) { O(i) = A(i) where i in 2:N }")
    out = np.full(6, -1.0, np.float32)
    reference.run(fn, {"A": _V}, {"N": 6}, {"O": out})
    np.testing.assert_array_equal(out, np.concatenate([[-1.0, -1.0], _V[2:]]))
    fn = compile_("def g(float(N) A, int32(M) I) -> (O) { O(i) = A(I(i)) }")
    with pytest.raises(CallError, match=r"7 in dimension 0 of tensor 'A'.*extent 6"):
        reference.run(fn, {"A": _V, "I": np.array([0, 7], np.int32)}, {"N": 6, "M": 2})
