"""Parser and printer: representative programs, precedence, golden text, round trips, robustness."""

from __future__ import annotations

import os
import sys

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

sys.path.insert(0, os.path.dirname(__file__))

from strategies_ast import DUMMY, exprs, programs, token_soups

from tcmlir.errors import ParseError
from tcmlir.lang import ast, parse
from tcmlir.lang.lexer import tokenize
from tcmlir.lang.printer import format_def, format_expr, format_program


def I(name: str) -> ast.Ident:  # noqa: E743 - short builders keep expected trees readable
    return ast.Ident(name, span=DUMMY)


def N(v: int) -> ast.IntLit:
    return ast.IntLit(v, span=DUMMY)


def F(v: float) -> ast.FloatLit:
    return ast.FloatLit(v, span=DUMMY)


def B(op: str, a: ast.Expr, b: ast.Expr) -> ast.Binary:
    return ast.Binary(op, a, b, span=DUMMY)


def U(op: str, a: ast.Expr) -> ast.Unary:
    return ast.Unary(op, a, span=DUMMY)


def T(c: ast.Expr, a: ast.Expr, b: ast.Expr) -> ast.Ternary:
    return ast.Ternary(c, a, b, span=DUMMY)


def Acc(t: str, *ix: ast.Expr) -> ast.Access:
    return ast.Access(I(t), tuple(ix), span=DUMMY)


def rhs(expr_text: str) -> ast.Expr:
    """The right-hand side of a one-statement def whose rhs is ``expr_text``."""
    return parse(f"def f() -> (O) {{ O = {expr_text} }}").defs[0].body[0].rhs


MATMUL = """
def matmul(float(M, K) A, float(K, N) B) -> (C) {
    C(m, n) +=! A(m, k) * B(k, n)
}
"""


def test_matmul():
    d = parse(MATMUL).get("matmul")
    assert d is not None
    assert [p.name.name for p in d.params] == ["A", "B"]
    assert d.params[0] == ast.Param(I("A"), "float", (I("M"), I("K")), span=DUMMY)
    assert d.returns == (ast.Param(I("C"), None, None, span=DUMMY),)
    (s,) = d.body
    assert s == ast.Stmt(I("C"), (I("m"), I("n")), "+=", True,
                         B("*", Acc("A", I("m"), I("k")), Acc("B", I("k"), I("n"))), (), span=DUMMY)


def test_spans_point_at_source():
    text = "def f(float(N) A) -> (B) {\n  B(i) = A(i) + 1\n}"
    s = parse(text).defs[0].body[0]
    assert (s.span.line, s.span.col) == (2, 3)
    assert text[s.span.start:s.span.end] == "B(i) = A(i) + 1"
    assert text[s.rhs.span.start:s.rhs.span.end] == "A(i) + 1"
    assert text[s.rhs.rhs.span.start:s.rhs.rhs.span.end] == "1"


def test_conv_with_where_clauses_lets_and_exists():
    text = """
    def conv(float(N, C, H, W) I, float(F, C, KH, KW) W1) -> (O) {
        O(n, f, h, w) +=! I(n, c, h + kh, w + kw) * W1(f, c, kh, kw)
            where kh in 0:KH, kw in 0:KW, s = kh * 2, exists I(n, c, h, w)
    }
    """
    s = parse(text).defs[0].body[0]
    assert s.where == (
        ast.RangeConstraint(I("kh"), N(0), I("KH"), span=DUMMY),
        ast.RangeConstraint(I("kw"), N(0), I("KW"), span=DUMMY),
        ast.Let(I("s"), B("*", I("kh"), N(2)), span=DUMMY),
        ast.Exists(Acc("I", I("n"), I("c"), I("h"), I("w")), span=DUMMY),
    )
    assert s.rhs.lhs.indices[2] == B("+", I("h"), I("kh"))


def test_casts_dimrefs_gathers_bools_and_builtins():
    assert rhs("float(i) + double(A.1)") == B(
        "+", ast.Cast("float", I("i"), span=DUMMY),
        ast.Cast("double", ast.DimRef(I("A"), 1, span=DUMMY), span=DUMMY))
    assert rhs("E(idx(i), j)") == Acc("E", Acc("idx", I("i")), I("j"))
    assert rhs("true && !false") == B("&&", ast.BoolLit(True, span=DUMMY),
                                      U("!", ast.BoolLit(False, span=DUMMY)))
    assert rhs("fma(a, b, c)") == ast.Call("fma", (I("a"), I("b"), I("c")), span=DUMMY)
    assert rhs("max(min(a, b), exp(c))") == ast.Call(
        "max", (ast.Call("min", (I("a"), I("b")), span=DUMMY),
                ast.Call("exp", (I("c"),), span=DUMMY)), span=DUMMY)
    assert rhs("exp") == I("exp")  # a built-in's name without '(' is a plain name
    assert rhs("bfloat16(x) * uint8(y)").lhs.dtype == "bfloat16"


@pytest.mark.parametrize(("text", "value"), [
    ("1.5", 1.5), ("2.", 2.0), (".5", 0.5), ("1e-3", 1e-3), ("3.0e+2", 300.0), ("1.5f", 1.5),
    ("2.f", 2.0), ("1E3", 1000.0), ("5e-324", 5e-324),
])
def test_float_literals(text, value):
    assert rhs(text) == F(value)


def test_int_literal_and_dimref_lexing():
    assert rhs("007") == N(7)
    assert rhs("A.12") == ast.DimRef(I("A"), 12, span=DUMMY)
    assert rhs("A . 0") == ast.DimRef(I("A"), 0, span=DUMMY)
    assert rhs("x*.5") == B("*", I("x"), F(0.5))


def test_ternaries_nest_to_the_right():
    assert rhs("a ? b : c ? d : e") == T(I("a"), I("b"), T(I("c"), I("d"), I("e")))
    assert rhs("a ? b ? c : d : e") == T(I("a"), T(I("b"), I("c"), I("d")), I("e"))
    assert rhs("(a ? b : c) ? d : e") == T(T(I("a"), I("b"), I("c")), I("d"), I("e"))
    assert rhs("a || b ? c + 1 : d") == T(B("||", I("a"), I("b")), B("+", I("c"), N(1)), I("d"))


@pytest.mark.parametrize(("text", "tree"), [
    ("a || b && c", B("||", I("a"), B("&&", I("b"), I("c")))),
    ("a && b || c", B("||", B("&&", I("a"), I("b")), I("c"))),
    ("a && b < c", B("&&", I("a"), B("<", I("b"), I("c")))),
    ("a == b + c", B("==", I("a"), B("+", I("b"), I("c")))),
    ("a < b == c", B("==", B("<", I("a"), I("b")), I("c"))),  # one comparison level, left-assoc
    ("a + b * c", B("+", I("a"), B("*", I("b"), I("c")))),
    ("a - b - c", B("-", B("-", I("a"), I("b")), I("c"))),
    ("a - (b - c)", B("-", I("a"), B("-", I("b"), I("c")))),
    ("a / b % c", B("%", B("/", I("a"), I("b")), I("c"))),
    ("-a * b", B("*", U("-", I("a")), I("b"))),
    ("-(a * b)", U("-", B("*", I("a"), I("b")))),
    ("!a || b", B("||", U("!", I("a")), I("b"))),
    ("- -a", U("-", U("-", I("a")))),
    ("a * -1", B("*", I("a"), U("-", N(1)))),
    ("a >= b != c <= d", B("<=", B("!=", B(">=", I("a"), I("b")), I("c")), I("d"))),
])
def test_precedence(text, tree):
    assert rhs(text) == tree


@pytest.mark.parametrize(("op_text", "op", "init"), [
    ("=", "=", False), ("+=", "+=", False), ("*=", "*=", False), ("min=", "min=", False),
    ("max=", "max=", False), ("+=!", "+=", True), ("*=!", "*=", True), ("min=!", "min=", True),
    ("max=!", "max=", True),
])
def test_statement_operators(op_text, op, init):
    s = parse(f"def f(float(N) A) -> (O) {{ O(i) {op_text} A(i) }}").defs[0].body[0]
    assert (s.op, s.init) == (op, init)
    s = parse(f"def f(float(N) A) -> (O) {{ O(i){op_text}A(i) }}").defs[0].body[0]
    assert (s.op, s.init) == (op, init)


def test_min_is_builtin_and_operator():
    s = parse("def f(float(N) A) -> (O) { O min=! min(A(i), 0) }").defs[0].body[0]
    assert s.op == "min=" and s.init and s.indices == ()
    assert s.rhs == ast.Call("min", (Acc("A", I("i")), N(0)), span=DUMMY)
    assert rhs("max(a, b) == c") == B("==", ast.Call("max", (I("a"), I("b")), span=DUMMY), I("c"))


def test_comments_scalars_constant_dims_annotated_outputs_several_defs():
    text = """# leading comment
    def scale(float alpha, float(N, 4) X) # after the params
        -> (float(N, 4) Y, s)   # annotated and bare outputs
    {   # body
        Y(i, j) = alpha * X(i, j)  # a statement
        # a whole-line comment
        s +=! Y(i, j)
    }
    # between defs
    def empty_lhs(float(N) A) -> (t) { t() = A(0) }  # end"""
    p = parse(text)
    scale, second = p.defs
    assert scale.params[0] == ast.Param(I("alpha"), "float", (), span=DUMMY)
    assert scale.params[1].dims == (I("N"), N(4))
    assert scale.returns[0] == ast.Param(I("Y"), "float", (I("N"), N(4)), span=DUMMY)
    assert scale.returns[1] == ast.Param(I("s"), None, None, span=DUMMY)
    assert len(scale.body) == 2 and scale.body[1].indices == ()
    assert second.body[0].indices == ()  # `t()` is the same as `t`
    assert p.get("empty_lhs") is second and p.get("nope") is None


def test_statements_need_no_separator():
    d = parse("def f(float(N) A) -> (B, C) { B(i) = A(i) C(i) = B(i) where i in 0:N }").defs[0]
    assert [s.tensor.name for s in d.body] == ["B", "C"]


def test_tokens_have_spans():
    toks = tokenize("x min=! a\n  # c\n  A.1 1.5f")
    assert [t.kind for t in toks] == ["IDENT", "min=!", "IDENT", "IDENT", ".", "INT", "FLOAT", "EOF"]
    assert [(t.span.line, t.span.col) for t in toks[3:7]] == [(3, 3), (3, 4), (3, 5), (3, 7)]
    assert toks[6].value == 1.5 and toks[6].text == "1.5f"


# ---------------------------------------------------------------- printer

def test_golden_matmul():
    assert format_program(parse(MATMUL)) == (
        "def matmul(float(M, K) A, float(K, N) B) -> (C) {\n"
        "    C(m, n) +=! A(m, k) * B(k, n)\n"
        "}\n")


def test_golden_two_defs_with_where():
    text = """def a(float alpha,int32(N,3) X)->(float(N) Y,s){Y(i)max=!alpha*-float(X(i,j))where j in 0:3
    s=(Y(0)+1.)*2 where z=(a?b:c)?d:e, exists X(0,0)}
    def b(double(N)Z)->(W){W(i)=Z(i)-(Z(i)-1)where i in (x?0:1):N}"""
    assert format_program(parse(text)) == (
        "def a(float alpha, int32(N, 3) X) -> (float(N) Y, s) {\n"
        "    Y(i) max=! alpha * -float(X(i, j)) where j in 0:3\n"
        "    s = (Y(0) + 1.0) * 2 where z = (a ? b : c) ? d : e, exists X(0, 0)\n"
        "}\n"
        "\n"
        "def b(double(N) Z) -> (W) {\n"
        "    W(i) = Z(i) - (Z(i) - 1) where i in (x ? 0 : 1):N\n"
        "}\n")


@pytest.mark.parametrize(("text", "printed"), [
    ("((a + b)) * (c)", "(a + b) * c"),
    ("a + (b + c)", "a + (b + c)"),
    ("(a + b) + c", "a + b + c"),
    ("-(-a)", "--a"),
    ("!(a < b)", "!(a < b)"),
    ("a ? (b ? c : d) : (e ? f : g)", "a ? b ? c : d : e ? f : g"),
    ("1e20 + 1e-5 + 0.1", "1e+20 + 1e-05 + 0.1"),
    ("A.1 * E(idx(i), j)", "A.1 * E(idx(i), j)"),
])
def test_minimal_parentheses(text, printed):
    e = rhs(text)
    assert format_expr(e) == printed
    assert rhs(printed) == e


def test_format_def_has_no_trailing_newline():
    d = parse(MATMUL).defs[0]
    assert format_def(d).endswith("}") and format_program(parse(MATMUL)).endswith("}\n")


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(programs())
def test_round_trip_random_programs(program):
    text = format_program(program)
    again = parse(text)
    assert again == program
    assert format_program(again) == text


@settings(max_examples=200, deadline=None)
@given(exprs)
def test_round_trip_random_expressions(e):
    assert rhs(format_expr(e)) == e


# ---------------------------------------------------------------- robustness

def _only_parse_errors(text: str) -> None:
    try:
        parse(text)
    except ParseError as err:
        assert str(err).startswith("<string>:")
        assert err.line is not None and err.col is not None


@settings(max_examples=400, deadline=None)
@given(st.binary(max_size=200))
def test_random_bytes_give_only_parse_errors(data):
    _only_parse_errors(data.decode("latin-1"))
    _only_parse_errors(data.decode("utf-8", errors="surrogateescape"))


@settings(max_examples=400, deadline=None)
@given(st.text(max_size=120))
def test_random_text_gives_only_parse_errors(text):
    _only_parse_errors(text)


@settings(max_examples=400, deadline=None)
@given(token_soups)
def test_token_soups_give_only_parse_errors(text):
    _only_parse_errors(text)
    _only_parse_errors("def f(float(N) A) -> (O) { " + text + " }")
    _only_parse_errors("def f(float(N) A) -> (O) { O(i) = " + text + " }")


def test_deep_nesting_is_a_parse_error_not_a_recursion_error():
    for text in ["(" * 5000 + "a" + ")" * 5000, "-" * 5000 + "a", "!" * 5000 + "a",
                 "exp(" * 5000 + "a" + ")" * 5000, " + ".join(["a"] * 5000),
                 "a ? " * 3000 + "b" + " : c" * 3000, "c ? d : " * 3000 + "e"]:
        with pytest.raises(ParseError, match="nested too deeply"):
            rhs(text)


def test_moderate_nesting_is_fine():
    assert format_expr(rhs("(" * 150 + "a" + ")" * 150)) == "a"
    assert format_expr(rhs("exp(" * 150 + "a" + ")" * 150)) == "exp(" * 150 + "a" + ")" * 150
    assert format_expr(rhs(" + ".join(["a"] * 150))) == " + ".join(["a"] * 150)


def test_crlf_and_tabs_are_whitespace():
    text = "def f(float(N) A) -> (B) {\r\n\tB(i) = A(i)\t# tab\r\n}\r\n"
    s = parse(text).defs[0].body[0]
    assert (s.span.line, s.span.col) == (2, 2)
    assert format_program(parse(text)) == "def f(float(N) A) -> (B) {\n    B(i) = A(i)\n}\n"


def test_max_depth_parses_and_prints():
    for inner in ["exp(" * 199 + "a" + ")" * 199, "-" * 199 + "a", " - ".join(["a"] * 200),
                  "a ? " * 199 + "b" + " : c" * 199, "(" * 199 + "a" + ")" * 199]:
        e = rhs(inner)
        assert format_expr(rhs(format_expr(e))) == format_expr(e)
