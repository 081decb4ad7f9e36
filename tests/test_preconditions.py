"""Size preconditions (issue 18): an access in bounds only for some sizes makes those sizes a
precondition of every call — a warning at define, a `CallError` at a call outside them — and an
access in bounds for no size stays an error at define."""

from __future__ import annotations

import warnings

import numpy as np
import pytest
from conftest import target_params
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import tcmlir as tc
from tcmlir.dump import main as dump_main

GATHER = ("def f(float(N, W) input, int32(L) index) -> (output) {\n"
          "    output(l, w) = input(index(l), w) where l in 0:2\n}")
SEGMENTED = ("def segdot(float(N) X, float(K) W, int32(KP1) Idx) -> (O) {\n"
             "    O(k) = W(k) * (X(Idx(k + 1)) - X(Idx(k))) where k in 0:K\n}")


def _define(src: str, target: str) -> tuple[tc.TCFunction, list[warnings.WarningMessage]]:
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        fn = tc.define(src, target=target)
    return fn, [w for w in caught if issubclass(w.category, tc.PreconditionWarning)]


def test_gather_program_is_accepted_with_a_located_warning():
    fn, caught = _define(GATHER, "numpy")
    assert len(caught) == 1
    text = str(caught[0].message)
    assert text.startswith("<string>:2:26: warning: index(l) ")
    assert "L >= 2" in text and "^~~~~~~~" in text
    assert caught[0].filename == __file__  # points at the user's define, not into tcmlir
    assert fn.ir.preconditions == ("L >= 2",)


@pytest.mark.parametrize("target", target_params())
def test_gather_program_runs_when_the_precondition_holds(target):
    fn, _ = _define(GATHER, target)
    rng = np.random.default_rng(0)
    a = rng.random((5, 3), dtype=np.float32)
    idx = np.array([3, 1, 4], dtype=np.int32)
    np.testing.assert_array_equal(fn(a, idx), a[[3, 1]])
    with pytest.raises(tc.CallError, match=r"L=1.*precondition L >= 2"):
        fn(a, idx[:1])


@pytest.mark.parametrize("target", target_params())
def test_segmented_program_needs_k_plus_one_entries(target):
    fn, caught = _define(SEGMENTED, target)
    assert len(caught) == 1 and "Idx(k + 1)" in str(caught[0].message)
    (cond,) = fn.ir.preconditions
    assert cond.replace(" ", "") in ("KP1>K", "KP1>=1+K", "KP1>=K+1", "K<KP1", "K<=-1+KP1")
    rng = np.random.default_rng(1)
    x = rng.random(7, dtype=np.float32)
    w = rng.random(3, dtype=np.float32)
    idx = np.array([0, 2, 5, 6], dtype=np.int32)
    np.testing.assert_allclose(fn(x, w, idx), w * (x[idx[1:]] - x[idx[:-1]]), rtol=1e-6)
    with pytest.raises(tc.CallError, match=r"K=3.*KP1=3"):
        fn(x, w, idx[:3])


def test_precondition_in_the_ir_dump(tmp_path, capsys):
    path = tmp_path / "f.tc"
    path.write_text(GATHER)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        assert dump_main([str(path), "--stage", "ir"]) == 0
    out = capsys.readouterr().out
    assert "requires L >= 2" in out and "L >= 2" in out.split("context:")[1]


@pytest.mark.parametrize("src", [
    "def f(float(N) A) -> (O) { O(i) = A(i + N) where i in 0:N }",
    "def f(float(N) A) -> (O) { O(i) = A(i - 1) where i in 0:N }",
    "def f(float(N) A, float(M) B) -> (O) { O(i) = A(i) + B(i) where i in -1:3 }",
])
def test_unsafe_for_every_size_is_still_rejected(src):
    with pytest.raises(tc.InferenceError, match=r"may read outside .* whatever the sizes"):
        tc.define(src, target="numpy")


def test_proved_program_has_no_precondition_and_no_warning():
    fn, caught = _define("def f(float(N) A) -> (O) { O(i) = A(i) }", "numpy")
    assert caught == [] and fn.ir.preconditions == ()


# ---------------------------------------------------------------- random programs

_BOUND = st.one_of(st.integers(-3, 6).map(lambda c: ("", c)),
                   st.tuples(st.sampled_from(["N", "M"]), st.integers(-3, 3)))


def _text(bound: tuple[str, int]) -> str:
    name, c = bound
    if not name:
        return str(c)
    return name if c == 0 else f"{name} {'+' if c > 0 else '-'} {abs(c)}"


def _value(bound: tuple[str, int], sizes: dict[str, int]) -> int:
    name, c = bound
    return (sizes[name] if name else 0) + c


def _valid(prog, sizes: dict[str, int]) -> bool:
    a, c1, c2, lo, hi = prog
    lo_v, hi_v = _value(lo, sizes), _value(hi, sizes)
    if hi_v < 1 or lo_v < 0 < hi_v:  # the output's extent, and writes below 0
        return False
    return all(0 <= a * i + c1 < sizes["N"] and 0 <= i + c2 < sizes["M"] for i in range(lo_v, hi_v))


def _source(prog) -> str:
    a, c1, c2, lo, hi = prog
    return (f"def f(float(N) A, float(M) B) -> (O) {{ O(i) = A({a} * i + {c1}) + B(i + {c2}) "
            f"where i in {_text(lo)}:{_text(hi)} }}")


_SMALL = [{"N": n, "M": m} for n in range(1, 25) for m in range(1, 25)]


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(prog=st.tuples(st.sampled_from([-1, 1, 2]), st.integers(-3, 4), st.integers(-3, 4),
                      _BOUND, _BOUND),
       calls=st.lists(st.tuples(st.integers(1, 12), st.integers(1, 12)), min_size=1, max_size=4))
def test_random_where_ranges_run_in_bounds_or_are_refused(prog, calls):
    a, c1, c2, lo, _hi = prog
    src = _source(prog)
    try:
        fn, _ = _define(src, "numpy")
    except tc.InferenceError:
        assert not any(_valid(prog, s) for s in _SMALL), src
        return
    assert any(_valid(prog, s) for s in _SMALL), src
    for n, m in calls:
        sizes = {"N": n, "M": m}
        av = np.arange(n, dtype=np.float32)
        bv = 100 * np.arange(m, dtype=np.float32)
        if not _valid(prog, sizes):
            with pytest.raises(tc.CallError):
                fn(av, bv)
            continue
        out = fn(av, bv)
        expected = np.zeros(_value(_hi, sizes), dtype=np.float32)
        for i in range(max(0, _value(lo, sizes)), len(expected)):
            expected[i] = av[a * i + c1] + bv[i + c2]
        np.testing.assert_array_equal(out, expected, err_msg=src)
