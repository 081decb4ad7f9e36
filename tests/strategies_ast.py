"""Hypothesis strategies for well-formed TC ASTs (syntax only; not necessarily sema-valid).

Every generated AST is one the parser can produce: names avoid keywords, type names and
built-ins, literals are finite and non-negative (negatives are ``Unary('-', lit)``), and all
spans are one fixed dummy span (spans are not compared). Used by the parser round-trip tests;
other test modules may import it (``sys.path.insert(0, tests_dir)`` first).
"""

from __future__ import annotations

import math

from hypothesis import strategies as st

from tcmlir.errors import Span
from tcmlir.lang import ast
from tcmlir.lang.lexer import KEYWORDS, TYPE_NAMES

__all__ = [
    "DUMMY",
    "TOKENS",
    "defs",
    "exprs",
    "names",
    "programs",
    "statements",
    "token_soups",
]

DUMMY = Span(0, 0, 1, 1)
_RESERVED = KEYWORDS | TYPE_NAMES | set(ast.BUILTINS)

names = st.from_regex(r"\A[A-Za-z_][A-Za-z0-9_]{0,6}\Z").filter(lambda s: s not in _RESERVED)
idents = names.map(lambda n: ast.Ident(n, span=DUMMY))
type_names = st.sampled_from(sorted(TYPE_NAMES))
_floats = st.floats(min_value=0.0, allow_nan=False, allow_infinity=False).map(abs)

leaves = st.one_of(
    idents,
    st.integers(min_value=0, max_value=2**64).map(lambda v: ast.IntLit(v, span=DUMMY)),
    _floats.filter(math.isfinite).map(lambda v: ast.FloatLit(v, span=DUMMY)),
    st.booleans().map(lambda v: ast.BoolLit(v, span=DUMMY)),
    st.builds(lambda t, k: ast.DimRef(t, k, span=DUMMY), idents, st.integers(0, 12)),
)


def _extend(children: st.SearchStrategy[ast.Expr]) -> st.SearchStrategy[ast.Expr]:
    ops = [op for level in ast.BINARY_OPS for op in level]
    arg_lists = st.lists(children, min_size=1, max_size=3).map(tuple)
    return st.one_of(
        st.builds(lambda op, a, b: ast.Binary(op, a, b, span=DUMMY), st.sampled_from(ops),
                  children, children),
        st.builds(lambda op, a: ast.Unary(op, a, span=DUMMY), st.sampled_from(["-", "!"]),
                  children),
        st.builds(lambda c, a, b: ast.Ternary(c, a, b, span=DUMMY), children, children, children),
        st.builds(lambda t, e: ast.Cast(t, e, span=DUMMY), type_names, children),
        st.builds(lambda t, ix: ast.Access(t, ix, span=DUMMY), idents, arg_lists),
        st.sampled_from(sorted(ast.BUILTINS)).flatmap(
            lambda f: st.lists(children, min_size=ast.BUILTINS[f], max_size=ast.BUILTINS[f])
            .map(lambda args: ast.Call(f, tuple(args), span=DUMMY))),
    )


exprs = st.recursive(leaves, _extend, max_leaves=12)

clauses = st.one_of(
    st.builds(lambda i, lo, hi: ast.RangeConstraint(i, lo, hi, span=DUMMY), idents, exprs, exprs),
    st.builds(lambda n, v: ast.Let(n, v, span=DUMMY), idents, exprs),
    st.builds(lambda e: ast.Exists(e, span=DUMMY), exprs),
)


@st.composite
def statements(draw: st.DrawFn) -> ast.Stmt:
    op = draw(st.sampled_from(ast.ASSIGN_OPS))
    init = op != "=" and draw(st.booleans())
    return ast.Stmt(
        draw(idents),
        tuple(draw(st.lists(idents, max_size=3))),
        op,
        init,
        draw(exprs),
        tuple(draw(st.lists(clauses, max_size=3))),
        span=DUMMY,
    )


_dims = st.lists(st.one_of(idents, st.integers(0, 1024).map(lambda v: ast.IntLit(v, span=DUMMY))),
                 max_size=3).map(tuple)
params = st.builds(lambda n, t, d: ast.Param(n, t, d, span=DUMMY), idents, type_names, _dims)
returns = st.one_of(idents.map(lambda n: ast.Param(n, None, None, span=DUMMY)), params)


@st.composite
def defs(draw: st.DrawFn, name: str | None = None) -> ast.Def:
    return ast.Def(
        ast.Ident(name or draw(names), span=DUMMY),
        tuple(draw(st.lists(params, max_size=3))),
        tuple(draw(st.lists(returns, min_size=1, max_size=2))),
        tuple(draw(st.lists(statements(), max_size=3))),
        span=DUMMY,
    )


@st.composite
def programs(draw: st.DrawFn) -> ast.Program:
    def_names = draw(st.lists(names, min_size=1, max_size=3, unique=True))
    return ast.Program(tuple(draw(defs(n)) for n in def_names), span=DUMMY)


# Every kind of token, for "token soup" robustness tests.
TOKENS = sorted(
    KEYWORDS | TYPE_NAMES | {
        "+", "-", "*", "/", "%", "(", ")", "[", "]", "?", ":", ",", "=", "{", "}", ">", "<", "!",
        ".", "->", "<=", ">=", "==", "!=", "&&", "||", "+=", "*=", "min=", "max=", "+=!", "*=!",
        "min=!", "max=!", "A", "B", "i", "j", "exp", "fma", "0", "1", "42", "1.5", ".5", "2.",
        "1e-3", "3.0e+2", "1.5f", "#", "\n",
    })
token_soups = st.lists(st.sampled_from(TOKENS), max_size=40).map(" ".join)
