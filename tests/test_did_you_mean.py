"""Did-you-mean for misspelt built-ins and types, in the located error (issue 13, item 8)."""

from __future__ import annotations

import pytest

import tcmlir as tc
from tcmlir.lang import ast


def _error(src: str) -> tc.TCError:
    with pytest.raises(tc.TCError) as info:
        tc.define(src)
    return info.value


@pytest.mark.parametrize("src, col, message, fix", [
    ("def f(float(N) A) -> (B) { B(i) = sigmod(A(i)) }", 35, "unknown function sigmod",
     "did you mean `sigmoid`? TC has no sigmoid built-in: write 1 / (1 + exp(-x))"),
    ("def f(float(N) A) -> (B) { B(i) = tanhh(A(i)) }", 35, "unknown function tanhh",
     "did you mean `tanh`?"),
    ("def f(float(N) A) -> (B) { B(i) = flaot(A(i)) }", 35, "unknown function or type flaot",
     "did you mean the cast `float(...)`?"),
    ("def f(flaot(N) A) -> (B) { B(i) = A(i) }", 7, "unknown type flaot",
     "did you mean `float`?"),
    ("def f(float(N) A, dobule alpha) -> (B) { B(i) = A(i) * alpha }", 19,
     "unknown type dobule", "did you mean `double`?"),
    ("def f(float(N) A) -> (flaot(N) B) { B(i) = A(i) }", 23, "unknown type flaot",
     "did you mean `float`?"),
    ("def f(float(N) Input) -> (B) { B(i) = Inptu(i) }", 39, "unknown tensor Inptu",
     "did you mean `Input`?"),
])
def test_did_you_mean_in_the_located_error(src, col, message, fix):
    text = str(_error(src))
    assert text.startswith(f"<string>:1:{col}: error: {message}\n"), text
    assert text.splitlines()[1].strip() == src  # the source line, then the caret
    assert text.splitlines()[-1] == f"  fix: {fix}"


def test_a_function_tc_lacks_gets_its_tc_spelling_and_the_builtins():
    text = str(_error("def f(float(N) A) -> (B) { B(i) = sigmoid(A(i)) }"))
    assert "error: sigmoid is not a TC built-in function" in text
    assert "fix: write 1 / (1 + exp(-x)); the built-ins are acos," in text
    assert all(name in text for name in ast.BUILTINS)


def test_an_unknown_function_without_a_close_match_lists_tensors_and_builtins():
    text = str(_error("def f(float(N) A) -> (B) { B(i) = zzyzx(A(i)) }"))
    assert "error: unknown tensor or function zzyzx" in text
    assert "the tensors here are A, B; the built-in functions are acos" in text
    # a tensor-like name keeps the short message
    text = str(_error("def f(float(N) A) -> (O) { O(i) = Q(i) }"))
    assert "error: unknown tensor Q" in text and "built-in" not in text


def test_an_unknown_type_without_a_close_match_lists_the_types():
    text = str(_error("def f(quux(N) A) -> (B) { B(i) = A(i) }"))
    assert "error: unknown type quux" in text and "fix: the types are bfloat16, bool," in text
