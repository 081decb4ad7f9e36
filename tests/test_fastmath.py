"""The host's inline float32 exp/exp2/expm1/log/log2/tanh (`tcmlir.codegen.fastmath`).

Each function is compiled as ``O(i) = f(A(i))`` on target ``cpu`` and compared with numpy in
float64 on about 2^20 float32 arguments: every 2^k-th bit pattern of the function's domain
(so all binades, subnormals included) plus a dense uniform sample of the interesting range,
plus the special values and the overflow/underflow thresholds. Errors are measured in float32
ulps of the exact (float64) result; special values must match exactly, signed zeros included.
The optimised IR must contain vector float code: the point of emitting these inline is that
loops using them vectorise.
"""

from __future__ import annotations

import os

import numpy as np
import pytest

import tcmlir as tc

F32 = np.float32
TINY = float(np.finfo(F32).smallest_subnormal)
MAXF = float(np.finfo(F32).max)

# function -> (numpy float64 reference, max ulp allowed, dense range)
FUNCS = {
    "exp": (np.exp, 2.0, (-105.0, 90.0)),
    "exp2": (np.exp2, 2.0, (-152.0, 129.0)),
    "expm1": (np.expm1, 3.0, (-20.0, 90.0)),
    "log": (np.log, 2.0, (0.0, 4.0)),
    "log2": (np.log2, 2.0, (0.0, 4.0)),
    "tanh": (np.tanh, 3.0, (-10.0, 10.0)),
}

SPECIAL = [0.0, -0.0, np.inf, -np.inf, np.nan, TINY, -TINY, 2.0 ** -126, -(2.0 ** -126), 1.0,
           -1.0, MAXF, -MAXF, 88.72283, 88.72284, 88.7229, -87.33655, -103.9720, -103.9721,
           -104.0, 127.99999, 128.0, -149.0, -149.5, -150.0, -17.0, -18.0, 0.625, -0.625, 9.0,
           9.02, 1e-3, -1e-3, 1e-20, 0.5, 2.0]


def arguments(lo: float, hi: float, seed: int = 0) -> np.ndarray:
    """Every 4096th float32 bit pattern of either sign (all binades), 2^19 uniform points of
    [lo, hi] and the special values."""
    pos = np.arange(0, 0x7F800000, 4096, dtype=np.uint32).view(F32)
    rng = np.random.default_rng(seed)
    dense = rng.uniform(lo, hi, 1 << 19).astype(F32)
    return np.concatenate([pos, -pos, dense, np.array(SPECIAL, dtype=F32)])


def compiled(name: str):
    src = f"def f(float(N) A) -> (O) {{ O(i) = {name}(A(i)) }}"
    return tc.define(src, target="cpu")


def ulp_error(got: np.ndarray, want: np.ndarray) -> np.ndarray:
    """|got - want| in float32 ulps of ``want`` (float64); 0 where both are the same
    non-finite value, inf where only one is non-finite or the two disagree on NaN."""
    got = got.astype(np.float64)
    with np.errstate(invalid="ignore", over="ignore"):
        wf = want.astype(F32).astype(np.float64)  # correctly rounded float32 result
        _, e = np.frexp(np.where(np.isfinite(want), want, 1.0))
        ulp = np.maximum(np.ldexp(1.0, e - 24), TINY)
        err = np.abs(got - want) / ulp
    finite = np.isfinite(wf) & np.isfinite(got)
    same = (got == wf) | (np.isnan(got) & np.isnan(wf))
    return np.where(finite, err, np.where(same, 0.0, np.inf))


def run_fn(name: str, x: np.ndarray) -> np.ndarray:
    return np.asarray(compiled(name).compile(x).launch(x))


@pytest.mark.parametrize("name", list(FUNCS))
def test_accuracy(name):
    ref, bound, (lo, hi) = FUNCS[name]
    x = arguments(lo, hi)
    got = run_fn(name, x)
    with np.errstate(all="ignore"):
        want = ref(x.astype(np.float64))
    if name == "tanh":  # near 0: 1e-7 absolute is enough
        err = np.where(np.abs(want) < 1e-3, np.abs(got - want) / 1e-7, ulp_error(got, want))
    else:
        err = ulp_error(got, want)
    worst = int(np.argmax(err))
    assert err[worst] <= bound, (
        f"{name}({x[worst]!r}) = {got[worst]!r}, want {want[worst]!r}: {err[worst]:.2f} ulp")


def special_cases():
    inf, nan = np.inf, np.nan
    return [
        ("exp", [0.0, -0.0, inf, -inf, nan, 88.8, -104.0, 1.0],
         [1.0, 1.0, inf, 0.0, nan, inf, 0.0, np.float32(np.e)]),
        ("exp2", [0.0, inf, -inf, nan, 128.0, -149.0, -150.0, 10.0, -126.0],
         [1.0, inf, 0.0, nan, inf, TINY, 0.0, 1024.0, 2.0 ** -126]),
        ("expm1", [0.0, -0.0, inf, -inf, nan, 89.0, -18.0],
         [0.0, -0.0, inf, -1.0, nan, inf, -1.0]),
        ("log", [0.0, -0.0, -1.0, -inf, inf, nan, 1.0, TINY],
         [-inf, -inf, nan, nan, inf, nan, 0.0, np.log(TINY)]),
        ("log2", [0.0, -0.0, -TINY, inf, nan, 1.0, 1024.0, TINY, 2.0 ** -126, 0.5],
         [-inf, -inf, nan, inf, nan, 0.0, 10.0, -149.0, -126.0, -1.0]),
        ("tanh", [0.0, -0.0, inf, -inf, nan, 9.02, -9.5, 20.0, TINY, -TINY],
         [0.0, -0.0, 1.0, -1.0, nan, 1.0, -1.0, 1.0, TINY, -TINY]),
    ]


@pytest.mark.parametrize("name,args,want", special_cases(), ids=[c[0] for c in special_cases()])
def test_special_values(name, args, want):
    x = np.array(args, dtype=F32)
    got = run_fn(name, x)
    want = np.array(want, dtype=F32)
    np.testing.assert_array_equal(got, want)  # NaN == NaN here
    np.testing.assert_array_equal(np.signbit(got[~np.isnan(got)]), np.signbit(want[~np.isnan(want)]))


def test_float64_keeps_libm():
    """Only float32 takes the inline path; double precision still calls the intrinsics/libm."""
    fn = tc.define("def f(double(N) A) -> (O) { O(i) = tanh(exp(A(i))) }", target="cpu")
    x = np.linspace(-3, 3, 101)
    k = fn.compile(x)
    assert '@"tanh"(' in k.llvm_ir and "llvm.exp.f64" in k.llvm_ir
    np.testing.assert_allclose(k.launch(x), np.tanh(np.exp(x)), rtol=1e-14)


@pytest.mark.parametrize("name", list(FUNCS))
def test_vectorised(name, monkeypatch):
    """The loop around each function vectorises: no libm call, vector floats in the optimised IR."""
    monkeypatch.setenv("TCMLIR_ALWAYS_COMPILE", "1")
    x = np.linspace(0.5, 2.0, 4096, dtype=F32)
    k = compiled(name).compile(x, options=tc.MappingOptions.naive().tile(0))
    for libm in (f'@"{name}f"(', f"llvm.{name}.f32"):
        assert libm not in k.llvm_ir
    opt = k.runner.optimized_ir
    assert "<16 x float>" in opt or "<8 x float>" in opt or "<4 x float>" in opt, opt


def test_chain_vectorised_and_correct(monkeypatch):
    """The benchmark's exp/tanh chain: vector code, and numpy's float32 answer."""
    monkeypatch.setenv("TCMLIR_ALWAYS_COMPILE", "1")
    fn = tc.define("def chainm(float(N) A, float(N) B) -> (O) "
                   "{ O(i) = tanh(A(i)) * B(i) + exp(-A(i)) }", target="cpu")
    rng = np.random.default_rng(1)
    a, b = (rng.standard_normal(10007, dtype=F32) * 4 for _ in range(2))
    k = fn.compile(a, b)
    assert "x float>" in k.runner.optimized_ir
    a64, b64 = a.astype(np.float64), b.astype(np.float64)
    np.testing.assert_allclose(k.launch(a, b), np.tanh(a64) * b64 + np.exp(-a64), rtol=2e-6,
                               atol=1e-6)


if __name__ == "__main__":  # pragma: no cover - prints the accuracy table
    os.environ.setdefault("TCMLIR_ALWAYS_COMPILE", "1")
    for fname, (reference, _, (a_lo, a_hi)) in FUNCS.items():
        xs = arguments(a_lo, a_hi)
        res = run_fn(fname, xs)
        with np.errstate(all="ignore"):
            exact = reference(xs.astype(np.float64))
        e = ulp_error(res, exact)
        i = int(np.argmax(e))
        print(f"{fname:6} max {e[i]:.3f} ulp at x={xs[i]!r} (got {res[i]!r}, want {exact[i]!r})")
