"""Malformed TC sources: each gives a ParseError at the exact line/column with a clear message."""

from __future__ import annotations

import pytest

from tcmlir.errors import ParseError, TCError
from tcmlir.lang import parse

HEAD = "def f(float(N) A) -> (B) {\n"


def body(line: str) -> str:
    """A def whose body is ``line`` (on source line 2, indented by 4)."""
    return HEAD + "    " + line + "\n}\n"


CASES = [
    # (source, line, col, message substring, fix substring or None)
    ("", 1, 1, "expected 'def' but found end of input", "one or more `def"),
    ("# just a comment\n", 2, 1, "expected 'def' but found end of input", None),
    ("B(i) = A(i)\n", 1, 1, "expected 'def' but found 'B'", None),
    (body("B(i) = A(i;"), 2, 15, "unexpected character ';'", "no separator"),
    (body("B(i) =! A(i)"), 2, 10, "'=!' is not an operator", "+=!"),
    (body("B(i) = exp(A(i), 2)"), 2, 12, "exp takes 1 argument", "exp takes 1 argument"),
    (body("B(i) = min(A(i))"), 2, 12, "min takes 2 arguments, but 1 was given", None),
    (body("B(i) = fma(A(i), 1)"), 2, 12, "fma takes 3 arguments", None),
    (body("B(i) = A(i) where i in 0 N"), 2, 30, "expected ':' between the bounds", None),
    (body("B(i) = A(i) $ 2"), 2, 17, "unexpected character '$'", None),
    (body("B(i) = A(i) +\x00 1"), 2, 18, "unexpected character '\\x00'", None),
    (body("B(i) = A(i) + é"), 2, 19, "unexpected character 'é'", None),
    (body("B(i) = A(i) & 1"), 2, 17, "unexpected character '&'", "'&&'"),
    (HEAD + "    B(i) = A(i)\n}\n\ndef f(float(N) A) -> (B) {\n    B(i) = A(i)\n}\n", 5, 5,
     "duplicate definition of 'f' (first defined on line 1)", "own name"),
    (body("B(i + 1) = A(i)"), 2, 9, "expected ',' or ')' in the left-hand side indices but found '+'",
     "plain names"),
    (body("B(2) = A(i)"), 2, 7, "expected an index name but found '2'", None),
    # an unclosed body is reported at its '{', where the fix belongs
    (HEAD + "    B(i) = A(i)\n", 1, 26, "'{' of def f is never closed (found end of input)",
     "close the definition"),
    ("def f(float(N) A) -> () {\n}\n", 1, 23, "a definition needs at least one output", "-> (C)"),
    ("def f(float(N) A) (B) {\n}\n", 1, 19, "expected '->' after the parameters but found '('", None),
    ("def f(floaty(N) A) -> (B) {\n}\n", 1, 7, "unknown type floaty", "did you mean `float`?"),
    ("def f(float(,) A) -> (B) {\n}\n", 1, 13, "expected a dimension", None),
    ("def in(float(N) A) -> (B) {\n}\n", 1, 5, "expected a definition name but found 'in'", "reserved"),
    ("def f(float(N) A, float(N)) -> (B) {\n}\n", 1, 27, "expected a tensor name after the type but found ')'",
     None),
    (body("B(i) -= A(i)"), 2, 10, "expected an assignment operator", "no '-='"),
    (body("B(i) min = A(i)"), 2, 10, "expected an assignment operator", "`min=` without a space"),
    (body("B(i) == A(i)"), 2, 10, "expected an assignment operator", "single `=`"),
    (body("B(i) = A(i) * 1f"), 2, 19, "malformed number '1f'", "1.0"),
    (body("B(i) = A(i) * 1e999"), 2, 19, "float literal '1e999' is out of range", None),
    (body("B(i) = A.x"), 2, 14, "expected a dimension number after '.'", None),
    (body("B(i) = A(i) ? 1"), 3, 1, "expected ':' in the conditional expression but found '}'", None),
    (body("B(i) = (A(i) + 1"), 3, 1, "expected ')' to close the parenthesis but found '}'", None),
    (body("B(i) = A(i where i in 0:N"), 2, 16, "expected ',' or ')' in the argument list but found 'where'",
     None),
    (body("B(i) = A(i) where k"), 3, 1, "expected 'in' or '=' in the where clause", None),
    (body("B(i) = A(i) where i in 0:N,"), 3, 1, "expected a where clause but found '}'", None),
    (body("B(i) = float A(i)"), 2, 18, "expected '(' after the type name 'float'", None),
    (body("B(i) = A(i) ||"), 3, 1, "expected an expression but found '}'", None),
    (body("B(i) = max= A(i)"), 2, 12, "expected an expression but found 'max='", "max(a, b)"),
    (body("B(i) = (" * 1 + "(" * 300 + "1" + ")" * 301), 2, 212, "expression nested too deeply", "where"),
    (body("B(i) = A(i)" + " + 1" * 250), 2, 12, "expression nested too deeply", None),
    (body("B(i) = A[i]"), 2, 13, "expected a statement (`C(i) = ...`) or '}' but found '['",
     "parentheses"),
]


@pytest.mark.parametrize(("source", "line", "col", "what", "fix"), CASES,
                         ids=[f"case{k}" for k in range(len(CASES))])
def test_parse_error(source, line, col, what, fix):
    with pytest.raises(ParseError) as info:
        parse(source)
    err = info.value
    assert isinstance(err, TCError)
    text = str(err)
    assert (err.line, err.col) == (line, col), text
    assert what in text
    assert text.startswith(f"<string>:{line}:{col}: error: ")
    lines = text.splitlines()
    caret = next(x for x in lines[2:3] if x.strip().startswith("^"))
    assert caret.index("^") == col - 1 + 2  # two spaces of indent, then the column
    if fix is not None:
        assert any(x.startswith("  fix: ") and fix in x for x in lines), text


def test_file_name_is_reported():
    with pytest.raises(ParseError) as info:
        parse("def f(float(N) A) -> (B) { B(i) = }", name="kernels.tc")
    assert str(info.value).startswith("kernels.tc:1:35: error: expected an expression")


def test_at_least_fifteen_cases():
    assert len(CASES) >= 15


# Issue 36: lines end at "\n", "\r\n" and a lone "\r" (as in every editor); U+2028 and the other
# characters str.splitlines also splits on stay inside their line. The reported line number
# and the quoted line agree, whatever the line breaks.
LINE_BREAK_CASES = [
    # (source, line, col, quoted line)
    ("def f(float(N) A) -> (B) {\n  # note\u2028more\n  B(i) = A(i) + C(i)\n}", 3, 17,
     "  B(i) = A(i) + C(i)"),
    ("def f(float(N) A) -> (B) {\n  B(i) = A(i) +\u2028 1\n}", 2, 16, "  B(i) = A(i) +\u2028 1"),
    ("def f(float(N) A) -> (B) {\r  B(i) = A(i) + C(i)\r}", 2, 17, "  B(i) = A(i) + C(i)"),
    ("def f(float(N) A) -> (B) {\r# c\r  B(i) = A(i) + C(i)\r}", 3, 17, "  B(i) = A(i) + C(i)"),
    ("def f(float(N) A) -> (B) {\r\n\r\n  B(i) = A(i) + C(i)\r\n}", 3, 17, "  B(i) = A(i) + C(i)"),
    ("def f(float(N) A) -> (B) {\n  # a\x0cb\x85c\u2029d\n  B(i) = A(i) $\n}", 3, 15,
     "  B(i) = A(i) $"),
    ("def f(float(N) A) -> (B) {\r  B(i) = A(i) + \r}", 3, 1, "}"),
]


@pytest.mark.parametrize("source, line, col, quoted", LINE_BREAK_CASES)
def test_lines_count_as_the_editor_does(source, line, col, quoted):
    import tcmlir as tc

    with pytest.raises(TCError) as info:
        tc.define(source)
    err = info.value
    assert (err.line, err.col) == (line, col)
    text = str(err).split("\n")
    assert text[0].startswith(f"<string>:{line}:{col}: error:")
    assert text[1] == "  " + quoted
    assert text[2].index("^") == 2 + col - 1
