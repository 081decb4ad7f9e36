"""Malformed programs give the right `TCError` subclass, at the right place, with a message a
user can act on; bad calls give a `CallError` naming the tensor, the dimension and both values."""

from __future__ import annotations

import re

import pytest
from corpus.malformed import CALL_ERRORS, MALFORMED

import tcmlir as tc


def _define_error(source: str) -> tc.TCError:
    try:
        tc.define(source, target="numpy")
    except tc.TCError as err:
        return err
    pytest.fail("tc.define accepted a malformed program")


def test_error_classes_form_a_hierarchy():
    for cls in (tc.ParseError, tc.SemaError, tc.InferenceError, tc.CallError):
        assert issubclass(cls, tc.TCError)
    assert issubclass(tc.InferenceError, tc.SemaError)


def test_corpus_size():
    assert len(MALFORMED) >= 25
    assert len({m.name for m in MALFORMED}) == len(MALFORMED)


@pytest.mark.parametrize("case", MALFORMED, ids=[m.name for m in MALFORMED])
def test_malformed(case):
    err = _define_error(case.source)
    expected_cls = getattr(tc, case.error)
    text = str(err)
    assert isinstance(err, expected_cls), (
        f"expected {case.error}, got {type(err).__name__}: {text}")
    assert (err.line, err.col) == (case.line, case.col), (
        f"located at {err.line}:{err.col}, expected {case.line}:{case.col}:\n{text}")

    lines = text.splitlines()
    head = f"<string>:{case.line}:{case.col}: error:"
    assert lines[0].startswith(head), f"first line should start with {head!r}:\n{text}"
    # the message proper: the first line and any `fix:` (not the quoted source line)
    message = "\n".join([lines[0], *lines[3:]])
    assert re.search(case.message, message, re.IGNORECASE), (
        f"message should match {case.message!r}:\n{text}")

    # the quoted source line, then a caret under the culprit's first character
    source_line = case.source.splitlines()[case.line - 1]
    assert len(lines) >= 3, f"no source line and caret:\n{text}"
    assert lines[1] == f"  {source_line}", f"second line should quote the source line:\n{text}"
    caret = lines[2]
    assert caret.strip() and set(caret.strip()) <= {"^", "~"}, f"no caret line:\n{text}"
    assert caret.index("^") == 2 + case.col - 1, f"caret not under column {case.col}:\n{text}"


def test_error_names_the_source():
    src = "def f(float(N) A) -> (B) {\n    B(i) = A(i) + X(i)\n}\n"
    with pytest.raises(tc.TCError) as info:
        tc.define(src, target="numpy")
    assert str(info.value).startswith("<string>:2:19: error:")


def test_range_error_suggests_where():
    src = "def f(float(N) A) -> (B) {\n    B(i, j) = A(i)\n}\n"
    with pytest.raises(tc.InferenceError) as info:
        tc.define(src, target="numpy")
    assert "where" in str(info.value)
    assert "j" in str(info.value)


@pytest.mark.parametrize("case", CALL_ERRORS, ids=[c.name for c in CALL_ERRORS])
def test_bad_call(case):
    fn = tc.define(case.source, target="numpy")
    inputs = case.make_inputs()
    with pytest.raises(tc.CallError) as info:
        fn(*inputs)
    text = str(info.value)
    for piece in case.substrings:
        assert piece in text, f"{piece!r} missing from the CallError message: {text}"


def test_bad_outputs_shape():
    src = "def f(float(N) A) -> (B) {\n    B(i) = A(i)\n}\n"
    fn = tc.define(src, target="numpy")
    import numpy as np

    a = np.zeros(4, dtype=np.float32)
    with pytest.raises(tc.CallError) as info:
        fn(a, outputs=(np.zeros(5, dtype=np.float32),))
    assert "B" in str(info.value) and "4" in str(info.value) and "5" in str(info.value)


def test_unknown_entry():
    src = "def f(float(N) A) -> (B) {\n    B(i) = A(i)\n}\n"
    with pytest.raises(tc.TCError) as info:
        tc.define(src, name="g", target="numpy")
    assert "g" in str(info.value)


def test_several_defs_need_a_name():
    src = ("def f(float(N) A) -> (B) {\n    B(i) = A(i)\n}\n"
           "def g(float(N) A) -> (B) {\n    B(i) = A(i) * 2\n}\n")
    with pytest.raises(tc.TCError):
        tc.define(src, target="numpy")
