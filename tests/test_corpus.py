"""Every corpus program, at every size assignment, on every available target, against its
independent numpy oracle (tests/corpus/programs.py)."""

from __future__ import annotations

import functools

import numpy as np
import pytest
from conftest import target_params
from corpus import assert_outputs_close, check_against_reference, poisoned_like, run_program
from corpus.programs import CASES, case_by_name

import tcmlir as tc

CASE_PARAMS = [
    pytest.param(case, sizes, id=f"{case.name}[{','.join(f'{k}={v}' for k, v in sizes.items())}]")
    for case in CASES
    for sizes in case.sizes
]


@functools.cache
def _define(source: str, entry: str | None, target: str):
    return tc.define(source, name=entry, target=target)


def test_corpus_is_well_formed():
    names = [c.name for c in CASES]
    assert len(names) == len(set(names)), "case names must be unique"
    assert len(CASES) >= 35
    for c in CASES:
        assert c.sizes, c.name
        assert "def " in c.source, c.name


@pytest.mark.parametrize("target", target_params())
@pytest.mark.parametrize(("case", "sizes"), CASE_PARAMS)
def test_case(case, sizes, target, rng):
    fn = _define(case.source, case.entry, target)
    inputs = case.make_inputs(rng, **sizes)
    originals = [np.copy(x) for x in inputs]
    expected = case.expected(*[np.copy(x) for x in inputs])

    got = run_program(fn, inputs)
    assert_outputs_close(got, expected, case.rtol, context=f"{case.name} {sizes} (fresh outputs)")

    if case.full_write:
        # every element must be written: poison what is passed in, then compare again
        outs = tuple(poisoned_like(e) for e in expected)
        got = run_program(fn, inputs, outputs=outs)
        assert_outputs_close(got, expected, case.rtol, context=f"{case.name} {sizes} (outputs=)")
        assert_outputs_close(outs, expected, case.rtol,
                             context=f"{case.name} {sizes}: the arrays passed with outputs=")

    for k, (x, x0) in enumerate(zip(inputs, originals, strict=True)):
        assert np.array_equal(x, x0, equal_nan=True), f"input {k} was modified"


@pytest.mark.parametrize("target", target_params())
def test_accumulate_into_given_outputs(target, rng):
    """`+=` without `!` adds to whatever the output holds when it is passed with outputs=."""
    case = case_by_name("accumulate_into_fresh_output")
    fn = _define(case.source, case.entry, target)
    (A,) = case.make_inputs(rng, M=7, N=5)
    start = rng.uniform(-1, 1, size=7).astype(np.float32)
    out = start.copy()
    got = run_program(fn, [A], outputs=[out])
    expected = (start.astype(np.float64) + A.astype(np.float64).sum(1)).astype(np.float32)
    assert_outputs_close(got, (expected,), context="returned")
    assert_outputs_close((out,), (expected,), context="the array passed with outputs=")


@pytest.mark.parametrize("target", target_params())
def test_bang_reinitialises_given_outputs(target, rng):
    """`+=!` starts from zero even when the output passed in holds something else."""
    case = case_by_name("reduce_sum_rows_cols")
    fn = _define(case.source, case.entry, target)
    (A,) = case.make_inputs(rng, M=5, N=3)
    outs = (np.full(5, 100.0, dtype=np.float32), np.full(3, -100.0, dtype=np.float32))
    got = run_program(fn, [A], outputs=outs)
    assert_outputs_close(got, case.expected(A))


@pytest.mark.parametrize("target", target_params())
def test_repeated_calls_and_sizes(target, rng):
    """One defined function serves several sizes in turn and does not leak state between calls."""
    case = case_by_name("matmul")
    fn = tc.define(case.source, target=target)
    for sizes in [dict(M=3, K=5, N=7), dict(M=1, K=2, N=1), dict(M=3, K=5, N=7)]:
        inputs = case.make_inputs(rng, **sizes)
        assert_outputs_close(run_program(fn, inputs), case.expected(*inputs), context=str(sizes))


def test_check_against_reference_helper(rng):
    """The helper backend tests reuse: numpy against itself passes, and returns the outputs."""
    case = case_by_name("softmax_outputs")
    inputs = case.make_inputs(rng, N=3, D=5)
    got = check_against_reference(case.source, inputs, "numpy")
    assert_outputs_close(got, case.expected(*inputs))


def test_assert_outputs_close_catches_poison():
    expected = (np.ones(3, dtype=np.float32),)
    with pytest.raises(AssertionError):
        assert_outputs_close((poisoned_like(expected[0]),), expected)
    with pytest.raises(AssertionError):
        assert_outputs_close((np.ones(3, dtype=np.float64),), expected)
    ints = np.arange(3, dtype=np.int32)
    with pytest.raises(AssertionError):
        assert_outputs_close((poisoned_like(ints),), (ints,))
