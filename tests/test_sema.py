"""Semantic analysis and range inference: TC source -> typed TC IR, and located errors."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tcmlir import ir
from tcmlir.affine import pw_aff_to_expr, to_isl
from tcmlir.dtypes import DType
from tcmlir.errors import InferenceError, PreconditionWarning, SemaError, Source
from tcmlir.ir_printer import format_expr
from tcmlir.lang import check, parse

F32, F64, I32, I64, BOOL = DType.FLOAT32, DType.FLOAT64, DType.INT32, DType.INT64, DType.BOOL


def fn(text: str, entry: str | None = None) -> ir.Function:
    return check(parse(text), entry, source=Source(text))


def fails(text: str, cls=SemaError, entry: str | None = None) -> SemaError:
    with pytest.raises(cls) as info:
        fn(text, entry)
    return info.value


def rng(s: ir.Statement, name: str, **sizes: int) -> tuple[int, int]:
    r = s.range_of(name)
    return r.lo.evaluate(sizes), r.hi.evaluate(sizes)


def expr(f: ir.Function, k: int = 0) -> str:
    return format_expr(f.statements[k].rhs)


# ---------------------------------------------------------------- structure


def test_matmul():
    f = fn("def matmul(float(M, K) A, float(K, N) B) -> (C) {\n"
           "  C(m, n) +=! A(m, r_k) * B(r_k, n)\n}")
    assert f.name == "matmul" and f.sizes == ("M", "K", "N")
    (c,) = f.outputs
    assert c.role is ir.Role.OUTPUT and c.dtype is F32 and [str(d) for d in c.shape] == ["M", "N"]
    (s,) = f.statements
    assert s.tensor == "C" and s.lhs == ("m", "n") and s.index_names == ("m", "n", "r_k")
    assert s.reduction is ir.Reduction.ADD and s.init and s.reduction_indices == ("r_k",)
    assert [(str(r.lo), str(r.hi)) for r in s.ranges] == [("0", "M"), ("0", "N"), ("0", "K")]
    assert s.rhs == ir.Binary("*", ir.Read("A", (ir.Index("m"), ir.Index("r_k")), F32),
                              ir.Read("B", (ir.Index("r_k"), ir.Index("n")), F32), F32)
    assert "M > 0" in f.context and "K > 0" in f.context and "N > 0" in f.context


def test_conv_output_shape_and_context():
    f = fn("def conv(float(N) A, float(K) W) -> (O) { O(i) +=! A(i + k) * W(k) }")
    (o,) = f.outputs
    assert o.shape[0].evaluate({"N": 10, "K": 3}) == 8
    assert str(o.shape[0]).replace(" ", "") in ("1+N-K", "N-K+1")
    s = f.statements[0]
    assert rng(s, "i", N=10, K=3) == (0, 8) and rng(s, "k", N=10, K=3) == (0, 3)
    assert "K <= N" in f.context


@pytest.mark.parametrize("body, n, expected", [
    ("A(i) = B(2*i)", 7, (0, 4)),
    ("A(i) = B(2*i) + B(2*i + 1)", 7, (0, 3)),
    ("A(i) = B(i - 2)", 5, (2, 7)),
    ("A(i) = B(i / 2)", 5, (0, 10)),
    ("A(i) = B(i) + B(i + 1)", 5, (0, 4)),
    ("A(i) = B(i) where i in 1:I-1", 6, (1, 5)),
])
def test_strided_and_offset_accesses(body, n, expected):
    f = fn(f"def s(float(I) B) -> (A) {{ {body} }}")
    assert rng(f.statements[0], "i", I=n) == expected
    assert f.outputs[0].shape[0].evaluate({"I": n}) == expected[1]


def test_stencil_resolves_in_rounds_and_where_range_gives_the_reduction():
    f = fn("def s(float(I) B) -> (A) { A(i) +=! B(2*i + k) where k in 0:2 }")
    s = f.statements[0]
    assert rng(s, "k", I=9) == (0, 2) and rng(s, "i", I=9) == (0, 4)
    assert rng(s, "i", I=8) == (0, 4)


def test_range_bounds_divide_with_floor():
    f = fn("def s(float(N) A) -> (O) { O(i) = A(2 * i) where i in 0:(N - 1) / 2 + 1 }")
    assert rng(f.statements[0], "i", N=7) == (0, 4) and rng(f.statements[0], "i", N=6) == (0, 3)


def test_where_range_on_lhs_index():
    f = fn("def s(float(N) A) -> (O) { O(i) = A(i) + 1 where i in 0:N-1 }")
    assert str(f.outputs[0].shape[0]).replace(" ", "") in ("-1+N", "N-1")
    assert "N >= 2" in f.context


def test_range_is_the_minimum_of_several_accesses():
    f = fn("def s(float(N) A, float(M) B) -> (C) { C(i) = A(i) + B(i) }")
    s = f.statements[0]
    assert rng(s, "i", N=4, M=9) == (0, 4) and rng(s, "i", N=9, M=4) == (0, 4)


def test_lets_are_substituted():
    f = fn("def s(float(N) A, float alpha) -> (O) {\n"
           "  O(i) = y * x where y = A(i) + 1, x = y * alpha\n}")
    assert expr(f) == ("((A(i) + 1.0:float32) * ((A(i) + 1.0:float32) * alpha))")


def test_exists_takes_part_in_inference_only():
    f = fn("def fill(float(N) A, float c) -> (B) { B(i) = c where exists A(i) }")
    s = f.statements[0]
    assert s.rhs == ir.Read("c", (), F32) and rng(s, "i", N=6) == (0, 6)
    f = fn("def s(float(N) A) -> (O) { O(i) = 1 where exists A(i) }")
    assert f.outputs[0].dtype is I32 and f.outputs[0].shape[0].evaluate({"N": 3}) == 3
    f = fn("def s(float(N) A) -> (O) { O(i) = A(i) where exists A(i + 1) }")
    assert f.outputs[0].shape[0].evaluate({"N": 5}) == 4


def test_gathers():
    f = fn("def g(float(N, D) E, int64(M) idx) -> (O) { O(i, j) = E(idx(i), j) }")
    s = f.statements[0]
    assert rng(s, "i", N=3, D=2, M=7) == (0, 7) and rng(s, "j", N=3, D=2, M=7) == (0, 2)
    assert expr(f) == "E(idx(i), j)"
    f = fn("def g(float(N) A, int64(N) idx) -> (O) { O(i) = A(idx(i) / N + i % 2 * 0) }")
    assert "floordiv(idx(i), int64(N))" in expr(f)


def test_index_division_is_floor_division():
    f = fn("def s(float(N) A) -> (O) { O(i) = A(i / 2) + A((i + 1) % 2) }")
    assert expr(f) == "(A(floordiv(i, 2:int32)) + A(floormod((i + 1:int32), 2:int32)))"


def test_promotion_and_casts():
    f = fn("def s(int32(N) A, double(N) D) -> (X, Y, Z, W, V, P, Q) {\n"
           "  X(i) = A(i) + 1.5\n"
           "  Y(i) = A(i) + D(i)\n"
           "  Z(i) = A(i) < 2 && D(i)\n"
           "  W(i) = exp(A(i)) + max(A(i), 3)\n"
           "  V(i) = D(i) * 2 + exp(A(i))\n"
           "  P(i) = float(A(i)) / 2\n"
           "  Q(i) = A(i) / 2 + 3\n}")
    x, y, z, w, v, p, q = f.outputs
    assert (x.dtype, y.dtype, z.dtype, w.dtype, v.dtype, p.dtype, q.dtype) == (
        F32, F64, BOOL, F32, F64, F32, I32)
    assert expr(f, 0) == "(float32(A(i)) + 1.5:float32)"
    assert expr(f, 1) == "(float64(A(i)) + D(i))"
    assert expr(f, 2) == "((A(i) < 2:int32) && (D(i) != 0.0:float64))"
    assert expr(f, 3) == "(exp(float32(A(i))) + float32(max(A(i), 3:int32)))"
    assert expr(f, 4) == "((D(i) * 2.0:float64) + float64(exp(float32(A(i)))))"
    assert expr(f, 5) == "(float32(A(i)) / 2.0:float32)"
    assert expr(f, 6) == "((A(i) / 2:int32) + 3:int32)"


def test_literals_alone_and_bools():
    f = fn("def s(bool(N) B) -> (X, Y, Z) {\n  X(i) = 2 where exists B(i)\n"
           "  Y(i) = 2.5 where exists B(i)\n  Z(i) = B(i) + B(i) + !B(i)\n}")
    x, y, z = f.outputs
    assert (x.dtype, y.dtype, z.dtype) == (I32, F32, I32)
    assert expr(f, 2) == "((int32(B(i)) + int32(B(i))) + int32(!B(i)))"


def test_sizes_and_indices_are_int32_values():
    f = fn("def s(float(N) A) -> (O) { O(i) = A(i) * i + N }")
    assert expr(f) == "((A(i) * float32(i)) + float32(N))"


def test_half_types_are_storage_only():
    f = fn("def h(float16(N) H, bfloat16(N) B) -> (bfloat16(N) O, P) {\n"
           "  O(i) = H(i) * 2.0 + B(i)\n  P(i) = float16(H(i))\n}")
    o, p = f.outputs
    # an unannotated output whose float reads are all float16 stores float16 (as in CUDA)
    assert o.dtype is DType.BFLOAT16 and p.dtype is DType.FLOAT16
    for s in f.statements:
        assert all(e.dtype not in (DType.FLOAT16, DType.BFLOAT16) for e in ir.walk(s.rhs))
    assert f.statements[0].rhs.dtype is F32


def test_scalars():
    f = fn("def axpy(float a, float(N) X, float(N) Y) -> (O) { O(i) = a * X(i) + Y(i) }")
    assert f.inputs[0].rank == 0 and f.inputs[0].name == "a"
    assert f.statements[0].rhs.lhs.lhs == ir.Read("a", (), F32)
    f = fn("def sum(float(N) A) -> (s) { s +=! A(i) }")
    assert f.outputs[0].shape == () and f.statements[0].lhs == ()


def test_temporaries_and_dim_refs():
    f = fn("def s(float(N, M) A) -> (C) {\n  T(i) +=! A(i, j)\n  C(i) = T(i) / T.0 + A.1\n}")
    (t,) = f.temporaries
    assert t.role is ir.Role.TEMP and t.dtype is F32 and str(t.shape[0]) == "N"
    assert [o.name for o in f.outputs] == ["C"]
    assert expr(f, 1) == "((T(i) / float32(N)) + float32(M))"
    f = fn("def s(float(N, 4) A) -> (C) { C(i) = A(i, 0) * A.1 }")
    assert expr(f) == "(A(i, 0:int32) * 4.0:float32)"
    f = fn("def s(float(N) A, float(K) W) -> (O, P) {\n  O(i) +=! A(i + k) * W(k)\n"
           "  P(i) = O(i) * O.0 \n}")
    assert expr(f, 1) == "(O(i) * float32(((N - K) + 1:int32)))"


def test_second_write_uses_the_known_shape():
    f = fn("def s(float(N) A) -> (float(N) O) {\n  O(i) = A(i)\n  O(i) = O(i) + A(N - i)\n}")
    assert rng(f.statements[1], "i", N=5) == (1, 5)
    f = fn("def s(float(N) A, float(N) B) -> (O) { O(i) = A(i) \n O(i) += B(i) }")
    assert f.statements[1].reduction is ir.Reduction.ADD and not f.statements[1].init


def test_several_defs_and_entry():
    text = "def a(float(N) A) -> (O) { O(i) = A(i) }\ndef b(float(N) A) -> (O) { O(i) = -A(i) }"
    assert fn(text, "b").name == "b"
    e = fails(text)
    assert "a, b" in str(e)
    e = fails(text, entry="bb")
    assert "a, b" in str(e) and "did you mean `b`" in str(e)


def test_no_source_still_locates():
    text = "def s(float(N) A) -> (O) { O(i) = B(i) }"
    with pytest.raises(SemaError) as info:
        check(parse(text))
    assert info.value.line == 1 and info.value.col == 35
    assert str(info.value).startswith("<string>:1:35: error: unknown tensor B")


# ---------------------------------------------------------------- errors


@pytest.mark.parametrize("text, line, col, message, fix", [
    ("def s(float(N) A) -> (O) {\n  O(i) = Aa(i)\n}", 2, 10, "unknown tensor Aa", "`A`"),
    ("def s(float(N) A) -> (O) { O(i) = expp(A(i)) }", 1, 35, "unknown function expp", "`exp`"),
    ("def s(float(N) A) -> (O) { O(i) = A(i, 0) }", 1, 35,
     "A has rank 1 but is accessed with 2 indices", None),
    ("def s(float(N, M) A) -> (float(N) O) { O(i, j) = A(i, j) }", 1, 40,
     "O has rank 1 but is written with 2 indices", None),
    ("def s(float(N) A) -> (O) {\n  O(i) = A(i)\n  A(i) = 1\n}", 3, 3,
     "cannot write A: inputs are read-only", "output"),
    ("def s(float(N) A) -> (O, P) { O(i) = A(i) }", 1, 26, "output P is never written", "P("),
    ("def s(float(N, M) A) -> (O) { O(i) = A(i, k) }", 1, 43,
     "index k appears only on the right-hand side; use a reduction such as +=!", None),
    ("def s(float(N) A) -> (O) { O(i) = A(1.5 * i) }", 1, 37,
     "index of A must be an integer, found float32", None),
    ("def s(float(N) A) -> (O) { O(i) = A(i / 0) where i in 0:N }", 1, 37,
     "needs a positive divisor", None),
    ("def s(float(N) A) -> (O) { O(i) = A(i % -3) where i in 0:N }", 1, 37,
     "needs a positive divisor", None),
    ("def s(float(N) A, float(N) A) -> (O) { O(i) = A(i) }", 1, 28, "A is already a tensor", None),
    ("def s(float(N) A, float(A) B) -> (O) { O(i) = A(i) }", 1, 25, "A is already a tensor", None),
    ("def s(float(N) A) -> (N) { N(i) = A(i) }", 1, 23, "N is already a size", None),
    ("def s(float(N) A) -> (A) { A(i) = 1 }", 1, 23, "output A is already a tensor", None),
    ("def s(float(N) exp) -> (O) { O(i) = 1 }", 1, 16, "built-in", None),
    ("def s(float(N) A) -> (O) {\n  O(i) = T(i)\n  T(i) = A(i)\n}", 2, 10,
     "T is read before any statement writes it", None),
    ("def s(float(N) A) -> (O) { O(i) = O(i) + A(i) }", 1, 35, "O is read before", None),
    ("def s(float(N) A) -> (O) {\n  T(i) += A(i)\n  O(i) = T(i)\n}", 2, 3,
     "accumulated into before it is initialised", "+=!"),
    ("def s(float(N) A) -> (O) { O(i) = A(i) + A.1 }", 1, 42, "dimension 1 does not exist", None),
    ("def s(float(N) A) -> (O) { O(i, i) = A(i) }", 1, 33, "appears twice", None),
    ("def s(float(N) A) -> (O) { O(i) = A(i) % 2 }", 1, 40, "% needs integer operands", "fmod"),
    ("def s(float(N) A) -> (O) { O(i) = A(i) where i in 0:A(0) }", 1, 53, "range bound", None),
    ("def s(float(N) A) -> (O) { O(i) = A(i) where i in 0:j }", 1, 53, "unknown name j", None),
    ("def s(float(N) A) -> (O) { O(i) = x where x = y, y = A(i) }", 1, 47,
     "let y is used before its definition", None),
    ("def s(float(N) A) -> (float(M) O) { O(i) = A(i) }", 1, 29, "size M of output O", None),
])
def test_sema_errors(text, line, col, message, fix):
    e = fails(text)
    assert type(e) is SemaError
    assert (e.line, e.col) == (line, col), str(e)
    assert message in str(e)
    assert str(e).startswith(f"<string>:{line}:{col}: error: ")
    if fix is not None:
        assert "fix:" in str(e) and fix in str(e).split("fix:")[1]


def test_missing_range_names_the_index_and_a_fix():
    e = fails("def s(float(N) A) -> (O) {\n  O(i) = A(0) + j\n}")
    assert "index j appears only" in str(e)  # `=` with a reduction index comes first
    e = fails("def s(float(N) A) -> (O) {\n  O(i, j) = A(i)\n}", InferenceError)
    assert (e.line, e.col) == (2, 8)
    assert "cannot infer the range of index j" in str(e)
    assert "fix: add `where j in 0:N`" in str(e)
    e = fails("def s(float(N) A) -> (O) { O(i) = A(i % 2) }", InferenceError)
    assert "range of index i" in str(e)


def test_out_of_bounds_access_is_located():
    e = fails("def s(float(N) A) -> (O) { O(i) = A(i + 1) where i in 0:N }", InferenceError)
    assert (e.line, e.col) == (1, 35)
    assert "A(i + 1) may read outside A's dimension 0 (extent N) for i in [0, N)" in str(e)
    assert "fix: add a where clause restricting i" in str(e)
    # in bounds when L >= N + M - 1: a precondition of the call (a warning), not an error
    with pytest.warns(PreconditionWarning, match=r"2:27: warning: C\(i \+ j\)"):
        f = fn("def s(float(N) A, float(M) B, float(L) C) -> (O) {\n"
               "  O(i, j) = A(i) * B(j) * C(i + j)\n}")
    assert f.preconditions == ("L >= -1 + N + M",)
    with pytest.warns(PreconditionWarning, match=r"A\(i\) stays in bounds only when .* I <= 11"):
        f = fn("def s(float(I) B) -> (A) { A(i) = B(10 - i) }")
    assert f.preconditions == ("I <= 11",)
    e = fails("def s(float(I) B) -> (A) { A(i) = B(0) where i in -1:I }", InferenceError)
    assert "A(i) may write outside A's dimension 0 (extent I)" in str(e)


def test_empty_output_is_an_error():
    e = fails("def s(float(N) A) -> (O) { O(i) = A(i + N) }", InferenceError)
    assert "size of O's dimension 0 is never >= 1" in str(e)


def test_a_where_clause_lets_the_next_round_use_the_access():
    f = fn("def s(float(N) A, float(L) C) -> (O) {\n"
           "  O(i, j) = A(i) * C(i + j) where i in 0:N\n}")
    s = f.statements[0]
    assert rng(s, "j", N=3, L=10) == (0, 8)
    assert "L >= N" in f.context


# ---------------------------------------------------------------- affine helpers


def test_to_isl():
    i, n = ir.Index("i"), ir.Size("N")

    def c(v):
        return ir.Const(v, I32)

    assert to_isl(ir.Binary("+", ir.Binary("*", c(2), i, I32), n, I32)) == "((2 * i) + N)"
    assert to_isl(ir.Binary("floordiv", i, c(3), I32)) == "floor((i)/3)"
    assert to_isl(ir.Binary("floormod", i, c(3), I32)) == "((i) mod 3)"
    assert to_isl(ir.Binary("*", i, n, I32)) is None
    assert to_isl(ir.Binary("floordiv", i, c(0), I32)) is None
    assert to_isl(ir.Read("A", (i,), I32)) is None


def test_pw_aff_to_expr_round_trip():
    import islpy as isl

    e = pw_aff_to_expr(isl.PwAff("[N, K] -> { [(N - K + 1)] }"))
    assert format_expr(e) == "((N - K) + 1:int32)"
    e = pw_aff_to_expr(isl.PwAff("[I] -> { [(floor((I + 1)/2))] }"))
    assert format_expr(e) == "floordiv((I + 1:int32), 2:int32)"
    assert pw_aff_to_expr(isl.PwAff("[N, M] -> { [(N)] : M >= N; [(M)] : M < N }")) is None


@settings(max_examples=40, deadline=None)
@given(a=st.integers(1, 3), b=st.integers(-4, 4), n=st.integers(1, 12))
def test_inferred_range_is_the_maximal_interval(a, b, n):
    f = fn(f"def s(float(N) A) -> (O) {{ O +=! A({a}*i + {b}) }}")
    lo, hi = rng(f.statements[0], "i", N=n)
    valid = [i for i in range(-20, 30) if 0 <= a * i + b < n]
    if valid:
        assert (lo, hi) == (min(valid), max(valid) + 1)


_ATOMS = ["i", "j", "k", "0", "1", "N", "2*i", "i+j", "i-1", "N-1-i", "i/2", "i%3", "I(i)", "i*j"]
_RHS = ["A(i)", "B(i, j)", "A(i) * B(j, k)", "exp(A(i)) + 1", "I(i) / 2", "T(i)", "A(N) % 2",
        "(A(i) > 0 ? 1 : 2.5)", "float16(I(j)) + alpha", "max(A(i), k)", "A.0 + B.1"]


@settings(max_examples=150, deadline=None)
@given(stmts=st.lists(st.tuples(st.sampled_from(["O", "T", "A"]),
                                st.sampled_from(["i", "i, j", "", "i, i"]),
                                st.sampled_from(["=", "+=!", "+=", "max=!"]),
                                st.sampled_from(_RHS),
                                st.sampled_from(_ATOMS),
                                st.sampled_from(["", " where k in 0:N", " where exists A(i + 1)",
                                                 " where j in 0:(N - 1) / 2"])),
                      min_size=1, max_size=3))
def test_any_program_checks_or_raises_a_located_tc_error(stmts):
    body = "\n".join(f"  {t}({lhs}) {op} {rhs.replace('(i)', f'({idx})', 1)}{w}"
                     for t, lhs, op, rhs, idx, w in stmts)
    text = f"def f(float(N) A, float(N, M) B, int64(M) I, float alpha) -> (O) {{\n{body}\n}}"
    try:
        f = fn(text)
    except SemaError as e:
        assert e.line is not None and str(e).startswith("<string>:")
    else:
        assert [o.name for o in f.outputs] == ["O"]
        for s in f.statements:
            assert s.rhs.dtype is f.tensor(s.tensor).dtype.compute
