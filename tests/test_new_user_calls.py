"""Issue 36, what a new user hit: inputs by their TC names, ``options=`` given as text or a dict,
a string for a scalar, torch's dtype advice through `tcmlir.torch.op`, and the cpu target's
gather bounds message (the index value, the dimension and the extent, as numpy's)."""

from __future__ import annotations

import numpy as np
import pytest

import tcmlir as tc
from tcmlir.errors import CallError, OptionsError

MM = "def mm(float(M, K) A, float(K, N) B) -> (C) { C(m, n) +=! A(m, k) * B(k, n) }"
SCALE = "def scale(float alpha, float(N) X) -> (Y) { Y(i) = alpha * X(i) }"
EMB = "def emb(float(V, D) Emb, int32(N) idx) -> (O) { O(i, d) = Emb(idx(i), d) }"


@pytest.fixture
def mats(rng):
    return rng.standard_normal((3, 5)).astype(np.float32), \
        rng.standard_normal((5, 2)).astype(np.float32)


# ---------------------------------------------------------------- inputs by name


@pytest.mark.parametrize("target", ["numpy", "cpu"])
def test_inputs_by_tc_name(target, mats):
    a, b = mats
    fn = tc.define(MM, target=target)
    np.testing.assert_allclose(fn(A=a, B=b), a @ b, rtol=1e-4, atol=1e-5)
    np.testing.assert_allclose(fn(B=b, A=a), a @ b, rtol=1e-4, atol=1e-5)
    np.testing.assert_allclose(fn(a, B=b), a @ b, rtol=1e-4, atol=1e-5)
    assert fn.compile(B=b, A=a).signature == fn.compile(a, b).signature
    assert fn.signature(a, B=b) == fn.signature(a, b)
    assert fn.size_values(B=b, A=a) == {"M": 3, "K": 5, "N": 2}


def test_bad_input_names_are_call_errors(mats):
    a, b = mats
    fn = tc.define(MM, target="cpu")
    with pytest.raises(CallError, match=r"no input named Bb \(did you mean B\?\); its inputs "
                                        r"are A, B"):
        fn(A=a, Bb=b)
    with pytest.raises(CallError, match="input A given twice, by position and by name"):
        fn(a, A=a)
    with pytest.raises(CallError, match=r"missing input\(s\) A"):
        fn(B=b)
    with pytest.raises(CallError, match="input B given twice"):
        fn(a, b, a, B=b)
    with pytest.raises(CallError, match="no input named C"):
        fn.compile(a, C=b)


def test_autotune_takes_inputs_by_name(mats, tmp_path):
    a, b = mats
    fn = tc.define(MM, target="cpu")
    best = fn.autotune(B=b, A=a, generations=1, population=2, cache=str(tmp_path / "c.db"),
                       progress=False)
    np.testing.assert_allclose(fn(a, b, options=best), a @ b, rtol=1e-4, atol=1e-5)


# ---------------------------------------------------------------- options=


@pytest.mark.parametrize("form", ["preset", "json", "dict"])
def test_options_as_preset_json_or_dict(form, mats):
    a, b = mats
    naive = tc.MappingOptions.naive()
    given = {"preset": "naive", "json": naive.to_json(), "dict": naive.to_dict()}[form]
    fn = tc.define(MM, target="cpu")
    np.testing.assert_allclose(fn(a, b, options=given), a @ b, rtol=1e-4, atol=1e-5)
    assert fn.compile(a, b, options=given).options == naive
    ptx = fn.compile(a, b, options=given, target="cuda", arch="sm_90")
    assert ptx.options == naive and ".entry" in ptx.ptx


@pytest.mark.parametrize("given, match", [
    ("nave", r"options='nave' is not a preset name nor options JSON \(did you mean 'naive'\?\)"
             r"; options= takes tc.MappingOptions, a preset name"),
    ("{bad", r"options='\{bad': mapping options are not valid JSON"),
    ({"tile": 3}, r"options= dict: unknown mapping option\(s\) tile"),
    ({"tile_sizes": "32"}, r"options= dict: option tile_sizes must be a list of integers"),
    (3, r"options= takes tc.MappingOptions.*; got builtins.int"),
])
def test_bad_options_say_what_options_takes(given, match, mats):
    a, b = mats
    fn = tc.define(MM, target="cpu")
    for entry in (fn, fn.compile):
        with pytest.raises(OptionsError, match=match):
            entry(a, b, options=given)
    with pytest.raises(OptionsError, match=match):
        fn.autotune(a, b, options=given, generations=1, population=2, cache=False,
                    progress=False)


# ---------------------------------------------------------------- scalars, torch


@pytest.mark.parametrize("target", ["cpu", "cuda"])
def test_a_string_for_a_scalar_says_scalar(target):
    fn = tc.define(SCALE, target=target)
    x = np.ones(3, np.float32)
    with pytest.raises(CallError, match=r"scale: scalar alpha \(float32\) must be a number, "
                                        r"got builtins.str"):
        fn.compile("x", x, arch="sm_90") if target == "cuda" else fn("x", x)


def test_torch_op_gives_torch_dtype_advice():
    torch = pytest.importorskip("torch")
    import tcmlir.torch as tt

    op = tt.op(tc.define(MM, target="cpu"))
    a, b = torch.ones(3, 5, dtype=torch.float64), torch.ones(5, 2)
    with pytest.raises(CallError, match=r"input A must have dtype float32, got float64 \("
                                        r"convert it, e.g. A.float\(\)\)") as info:
        op(a, b)
    assert "astype" not in str(info.value)
    assert op(B=b, A=a.float()).shape == (3, 2)


# ---------------------------------------------------------------- gathers out of bounds


@pytest.mark.parametrize("bad", [7, -2])
def test_cpu_gather_bounds_name_the_index_dimension_and_extent(bad):
    emb = np.ones((5, 3), np.float32)
    idx = np.zeros(1000, np.int32)
    idx[777] = bad
    with pytest.raises(CallError, match=f"gathered index {bad} in dimension 0 of tensor 'Emb' "
                                        r"is out of bounds \(extent 5\)"):
        tc.define(EMB, target="numpy")(emb, idx)
    for _ in range(2):  # the first call and the remembered plan's
        with pytest.raises(CallError, match=f"emb: gather index {bad} in dimension 0 of tensor "
                                            r"Emb is out of bounds \(extent 5\) in statement 0"):
            tc.define(EMB, target="cpu")(emb, idx)


def test_cpu_gather_bounds_in_a_later_dimension():
    src = "def g(float(V, D) T, int32(N) idx) -> (O) { O(i) = T(0, idx(i)) }"
    with pytest.raises(CallError, match=r"gather index 3 in dimension 1 of tensor T is out of "
                                        r"bounds \(extent 3\)"):
        tc.define(src, target="cpu")(np.ones((2, 3), np.float32), np.array([0, 3], np.int32))
