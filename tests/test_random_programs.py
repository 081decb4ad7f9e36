"""Random programs run on the reference interpreter and agree with a numpy model built
alongside their source; random token soups and mutated corpus programs only ever raise TCError."""

from __future__ import annotations

import os

import numpy as np
import pytest
from conftest import target_params
from corpus import as_tuple
from corpus.programs import CASES
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from strategies_programs import TC_TOKENS, check_against_model, model_close, programs, token_soups

import tcmlir as tc

SETTINGS = settings(max_examples=60, deadline=None, database=None,
                    suppress_health_check=[HealthCheck.too_slow])


@SETTINGS
@given(program=programs(), seed=st.integers(0, 2**32 - 1))
def test_random_program_matches_numpy_model(program, seed):
    source, sizes, numpy_fn = program
    inputs = program.make_inputs(np.random.default_rng(seed))
    fn = tc.define(source, target="numpy")
    got = as_tuple(fn(*inputs))
    want = numpy_fn(*inputs)
    assert len(got) == len(want), source
    for k, (g, w, shape) in enumerate(zip(got, want, program.output_shapes, strict=True)):
        g = np.asarray(g)
        assert g.shape == shape, f"output {k}: shape {g.shape}, expected {shape}\n{source}{sizes}"
        assert g.dtype == np.float32, f"output {k}: dtype {g.dtype}\n{source}"
        assert model_close(g, w), (
            f"output {k} differs from the numpy model\n{source}{sizes}\n"
            f"got {g!r}\nexpected {w!r}")


COMPILED_TARGETS = [p for p in target_params() if p.values[0] != "numpy"]  # cpu, cuda (gpu)


@pytest.mark.parametrize("target", COMPILED_TARGETS)
def test_random_program_compiled_matches_reference(target):
    """compiled == the numpy model on random programs (every output fully written: poisoned)."""

    @settings(max_examples=25, deadline=None, database=None,
              suppress_health_check=[HealthCheck.too_slow])
    @given(program=programs(), seed=st.integers(0, 2**32 - 1))
    def check(program, seed):
        inputs = program.make_inputs(np.random.default_rng(seed))
        check_against_model(program, inputs, target)

    check()


@settings(max_examples=int(os.environ.get("TCMLIR_FUZZ_EXAMPLES", "100")), deadline=None,
          database=None, suppress_health_check=[HealthCheck.too_slow])
@given(program=programs())
def test_random_program_compiles_for_cuda(program):
    """Every random program compiles to PTX under a plain call's cuda options, no GPU needed
    (the GPU run above found a code generator error this catches here: isl fused two row phases
    under one guard, `test_gpu_rows.test_fused_row_phases`)."""
    fn = tc.define(program.source)
    kernel = fn.compile(*program.make_inputs(np.random.default_rng(0)), target="cuda",
                        arch="sm_90")
    assert ".entry" in kernel.ptx, program.source


def _define_or_tcerror(source: str) -> None:
    try:
        tc.define(source, target="numpy")
    except tc.TCError:
        pass  # the only acceptable way to refuse
    except RecursionError:
        pytest.fail(f"RecursionError on {source!r}")


@settings(max_examples=300, deadline=None, database=None)
@given(token_soups())
def test_token_soup_only_raises_tcerror(source):
    _define_or_tcerror(source)


@settings(max_examples=300, deadline=None, database=None)
@given(
    case=st.sampled_from(CASES),
    edits=st.lists(st.tuples(st.sampled_from(["delete", "insert", "replace"]),
                             st.floats(0, 1, exclude_max=True),
                             st.sampled_from(TC_TOKENS)), min_size=1, max_size=3),
)
def test_mutated_corpus_program_only_raises_tcerror(case, edits):
    """Broken versions of real programs: a TCError or (if still valid) a definition."""
    source = case.source
    for op, where, token in edits:
        pos = int(where * len(source))
        if op == "delete":
            source = source[:pos] + source[pos + 1:]
        elif op == "insert":
            source = source[:pos] + token + source[pos:]
        else:
            source = source[:pos] + token + source[pos + len(token):]
    _define_or_tcerror(source)


def test_deeply_nested_expression_is_a_tcerror_or_works():
    depth = 2000
    source = ("def f(float(N) A) -> (B) {\n    B(i) = " + "(" * depth + "A(i)" + ")" * depth
              + "\n}\n")
    _define_or_tcerror(source)
