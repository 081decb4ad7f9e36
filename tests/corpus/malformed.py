"""Malformed programs and bad calls, with the error each must give.

``MALFORMED``: `Malformed(source, error, line, col, message)` tuples: `tc.define(source)` must
raise ``tcmlir.<error>`` located at ``line:col`` (1-based; the column of the culprit token, the
place a user would point at), whose text matches the regular expression ``message``
(case-insensitive). Positions are computed from the named culprit (``at(source, token, nth)``),
so they cannot drift from the sources.

``CALL_ERRORS``: `BadCall(source, make_inputs, substrings)`: defining works, calling with
``make_inputs()`` raises `tcmlir.CallError` whose message contains every substring (the tensor,
the dimension, both values).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import NamedTuple

import numpy as np

__all__ = ["CALL_ERRORS", "MALFORMED", "BadCall", "Malformed", "at"]


class Malformed(NamedTuple):
    source: str
    error: str        # class name in tcmlir: ParseError, SemaError, InferenceError
    line: int
    col: int
    message: str      # regular expression searched in the message (case-insensitive)
    name: str = ""


class BadCall(NamedTuple):
    source: str
    make_inputs: Callable[[], tuple]
    substrings: tuple[str, ...]
    name: str = ""


def at(source: str, token: str, nth: int = 1) -> tuple[int, int]:
    """1-based (line, col) of the ``nth`` occurrence of ``token`` in ``source``."""
    pos = -1
    for _ in range(nth):
        pos = source.index(token, pos + 1)
    line = source.count("\n", 0, pos) + 1
    col = pos - (source.rfind("\n", 0, pos) + 1) + 1
    return line, col


def _m(name, error, source, token, message, nth=1) -> Malformed:
    line, col = at(source, token, nth)
    return Malformed(source, error, line, col, message, name)


MALFORMED: list[Malformed] = [
    # ------------------------------------------------------------ parse errors
    _m("missing_rparen_params", "ParseError",
       "def f(float(N) A -> (B) {\n    B(i) = A(i)\n}\n",
       "->", r"expected"),
    _m("missing_rparen_call", "ParseError",
       "def f(float(N) A) -> (B) {\n    B(i) = exp(A(i) + 1\n}\n",
       "}", r"expected"),
    _m("bad_operator_eq_bang", "ParseError",
       # `=!` is no operator: the initialising forms are `+=!` `*=!` `min=!` `max=!`. Read as
       # `= !A(i)` it would silently give a bool output, so it must be refused where it stands.
       "def f(float(N) A) -> (B) {\n    B(i) =! A(i)\n}\n",
       "=!", r"=!"),
    _m("minus_assign", "ParseError",
       "def f(float(N) A) -> (B) {\n    B(i) -=! A(i)\n}\n",
       "-=!", r"expected|operator|-="),
    _m("unknown_character", "ParseError",
       "def f(float(N) A) -> (B) {\n    B(i) = A(i) @ 2\n}\n",
       "@", r"@"),
    _m("missing_arrow", "ParseError",
       "def f(float(N) A) (B) {\n    B(i) = A(i)\n}\n",
       "(B)", r"->"),
    _m("unterminated_brace", "ParseError",
       # the culprit is the `{` that is never closed
       "def f(float(N) A) -> (B) {\n    B(i) = A(i)\n",
       "{", r"\{|\}|unclosed|unterminated|end of"),
    _m("builtin_arity", "ParseError",
       "def f(float(N) A) -> (B) {\n    B(i) = exp(A(i), 2)\n}\n",
       "exp", r"exp.*argument|argument.*exp"),
    _m("builtin_arity_min", "ParseError",
       "def f(float(N) A) -> (B) {\n    B(i) = min(A(i))\n}\n",
       "min", r"min.*argument|argument.*min"),
    _m("missing_comma_params", "ParseError",
       "def f(float(N) A float(N) C) -> (B) {\n    B(i) = A(i)\n}\n",
       "float", r"expected", nth=2),
    _m("unknown_type", "ParseError",
       "def f(flaot(N) A) -> (B) {\n    B(i) = A(i)\n}\n",
       "flaot", r"flaot"),
    _m("missing_rhs", "ParseError",
       "def f(float(N) A) -> (B) {\n    B(i) =\n}\n",
       "}", r"expected|expression"),
    _m("lhs_index_expression", "ParseError",
       "def f(float(N) A) -> (B) {\n    B(i + 1) = A(i)\n}\n",
       "+", r"expected|index"),
    _m("ternary_without_colon", "ParseError",
       "def f(float(N) A) -> (B) {\n    B(i) = A(i) > 0 ? A(i)\n}\n",
       "}", r":|expected"),
    _m("where_range_missing_bound", "ParseError",
       "def f(float(N) A) -> (B) {\n    B(i) = A(i) where i in 0:\n}\n",
       "}", r"expected|expression"),
    _m("stray_closing_brace", "ParseError",
       "def f(float(N) A) -> (B) {\n    B(i) = A(i)\n}\n}\n",
       "}", r"expected|unexpected|def", nth=2),
    # ------------------------------------------------------------ semantic errors
    _m("unknown_tensor", "SemaError",
       "def f(float(N) A) -> (B) {\n    B(i) = A(i) + X(i)\n}\n",
       "X", r"\bX\b"),
    _m("unknown_function", "SemaError",
       "def f(float(N) A) -> (B) {\n    B(i) = sigmoid(A(i))\n}\n",
       "sigmoid", r"sigmoid"),
    _m("rank_mismatch", "SemaError",
       "def f(float(N, M) A) -> (B) {\n    B(i) = A(i)\n}\n",
       "A(i)", r"rank|dimension|indices|index"),
    _m("scalar_with_indices", "SemaError",
       "def f(float alpha, float(N) A) -> (B) {\n    B(i) = alpha(i) * A(i)\n}\n",
       "alpha(i)", r"alpha"),
    _m("write_input", "SemaError",
       "def f(float(N) A) -> (B) {\n    B(i) = A(i)\n    A(i) = B(i) + 1\n}\n",
       "A(i) =", r"input"),
    _m("unwritten_output", "SemaError",
       "def f(float(N) A) -> (B, C) {\n    B(i) = A(i)\n}\n",
       "C", r"\bC\b"),
    _m("reduction_index_with_eq", "SemaError",
       # the culprit is the index that appears only on the right
       "def f(float(N, M) A) -> (B) {\n    B(i) = A(i, j)\n}\n",
       "j", r"reduc|\+=!"),
    _m("float_index", "SemaError",
       "def f(float(N) A, float(N) X) -> (B) {\n    B(i) = A(X(i))\n}\n",
       "X(i)", r"int"),
    _m("float_literal_index", "SemaError",
       "def f(float(N) A) -> (B) {\n    B(i) = A(i) + A(1.5)\n}\n",
       "1.5", r"int"),
    _m("duplicate_parameter", "SemaError",
       "def f(float(N) A, float(N) A) -> (B) {\n    B(i) = A(i)\n}\n",
       "A", r"duplicate|already|twice", nth=2),
    _m("duplicate_lhs_index", "SemaError",
       "def f(float(N) A) -> (B) {\n    B(i, i) = A(i)\n}\n",
       "i", r"\bi\b", nth=2),
    _m("size_used_as_tensor", "SemaError",
       "def f(float(N) A) -> (B) {\n    B(i) = A(i) + N(i)\n}\n",
       "N(i)", r"\bN\b"),
    _m("range_not_inferable", "InferenceError",
       # j is bounded by nothing: the message must name j and suggest a where clause
       "def f(float(N) A) -> (B) {\n    B(i, j) = A(i)\n}\n",
       "j", r"(?=.*\bj\b)(?=.*where)"),
    _m("range_not_inferable_value_only", "InferenceError",
       "def f(float(N) A) -> (B) {\n    B(i) +=! A(i) * k\n}\n",
       "k", r"(?=.*\bk\b)(?=.*where)"),
    _m("where_bound_not_affine", "SemaError",
       "def f(float(N) A) -> (B) {\n    B(i) = A(i) where i in 0:N * N\n}\n",
       "N * N", r"affine|range"),
    _m("out_of_bounds_where", "InferenceError",
       "def f(float(N) A) -> (B) {\n    B(i) = A(i) where i in 0:N+1\n}\n",
       "A(i) where", r"outside|bounds|range"),
    _m("out_of_bounds_constant", "InferenceError",
       "def f(float(N) A) -> (B) {\n    B(i) = A(i) + A(N)\n}\n",
       "A(N)", r"outside|bounds|range"),
    _m("temporary_read_before_write", "SemaError",
       "def f(float(N) A) -> (B) {\n    B(i) = A(i) + T(i)\n    T(i) = A(i) * 2\n}\n",
       "T(i)", r"\bT\b"),
    _m("float_modulo", "SemaError",
       "def f(float(N) A) -> (B) {\n    B(i) = A(i) % 2.5\n}\n",
       "%", r"%|int|float"),
    _m("dim_ref_out_of_range", "SemaError",
       "def f(float(N) A) -> (B) {\n    B(i) = A(i) * A.2\n}\n",
       "A.2", r"dimension|rank|\b2\b"),
    _m("error_on_later_line", "SemaError",
       "# a comment line\ndef f(float(N) A) -> (B) {\n    B(i) = A(i)\n\n    B(i) = B(i) + Q(i)\n}\n",
       "Q", r"\bQ\b"),
]


def _f32(*shape):
    return np.zeros(shape, dtype=np.float32)


_MATMUL = "def mm(float(M, K) A, float(K, N) B) -> (C) {\n    C(m, n) +=! A(m, k) * B(k, n)\n}\n"

CALL_ERRORS: list[BadCall] = [
    BadCall(_MATMUL, lambda: (_f32(3, 4),), ("2", "1"), "too_few_inputs"),
    BadCall(_MATMUL, lambda: (_f32(3, 4), _f32(4, 5), _f32(5)), ("2", "3"), "too_many_inputs"),
    BadCall(_MATMUL, lambda: (_f32(3, 4, 1), _f32(4, 5)), ("A", "2", "3"), "wrong_rank"),
    BadCall(_MATMUL, lambda: (_f32(3, 4).astype(np.float64), _f32(4, 5)),
            ("A", "float32", "float64"), "wrong_dtype"),
    BadCall(_MATMUL, lambda: (_f32(3, 4), _f32(5, 6)), ("B", "K", "4", "5"), "inconsistent_size"),
    BadCall("def f(float(3, N) A) -> (B) {\n    B(i, j) = A(i, j)\n}\n",
            lambda: (_f32(4, 2),), ("A", "3", "4"), "constant_dim"),
    BadCall("def f(float alpha, float(N) A) -> (B) {\n    B(i) = alpha * A(i)\n}\n",
            lambda: (_f32(3), _f32(3)), ("alpha",), "scalar_given_array"),
    BadCall("def f(float(V, D) E, int32(L) idx) -> (O) {\n    O(i, j) = E(idx(i), j)\n}\n",
            lambda: (_f32(4, 2), _f32(3)), ("idx", "int32", "float32"), "index_tensor_dtype"),
    BadCall("def f(float(N, N) A) -> (B) {\n    B(i) = A(i, i)\n}\n",
            lambda: (_f32(3, 4),), ("N", "3", "4"), "repeated_size_name"),
]
