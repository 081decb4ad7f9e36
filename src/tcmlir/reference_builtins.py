"""TC's built-in functions (CUDA math) on numpy arrays, for the reference interpreter.

`call_builtin(name, args, dtype)` evaluates one built-in elementwise. Precision: every built-in
is computed in float64 and the result is rounded once to the call's dtype (float32 calls thus
get results that are at most one rounding away from the float64 value, usually the correctly
rounded float32). The exception is ``nextafter``, which only makes sense in the call's own type
and is computed there. ``fma`` on float64 operands is ``x*y+z`` with two roundings (Python 3.11
has no fused multiply-add); on float32 operands the product is exact in float64.

Special functions numpy lacks come from `math` (erf, erfc, lgamma, tgamma; normcdf is written
with erfc) or, when it happens to be importable, from ``scipy.special`` (erfcx, erfinv,
erfcinv, normcdfinv, j0, j1, y0, y1, cyl_bessel_i1). Without scipy those raise
`tcmlir.errors.CodegenError` naming the built-in.
"""

from __future__ import annotations

import math
from collections.abc import Callable

import numpy as np

from .errors import CodegenError

__all__ = ["SCIPY_BUILTINS", "call_builtin", "saturating_int", "scipy_special"]

_F64 = np.float64


def _special_or_none():
    try:
        import scipy.special as special
    except ImportError:  # pragma: no cover - depends on the environment
        return None
    return special


_SPECIAL_UNSET = object()
_special_cache: object = _SPECIAL_UNSET


def scipy_special():
    """``scipy.special`` if importable, else None (cached; tests may patch this function)."""
    global _special_cache
    if _special_cache is _SPECIAL_UNSET:
        _special_cache = _special_or_none()
    return _special_cache


# ---------------------------------------------------------------- helpers written with numpy


def _round_half_away(x):
    """C ``round``: halfway cases away from zero (numpy's ``round`` is half-to-even)."""
    t = np.trunc(x)
    return np.where(np.abs(x - t) >= 0.5, t + np.copysign(1.0, x), t)


def _remainder(x, y):
    """IEEE ``remainder``: ``x - n*y`` with ``n`` the integer nearest ``x/y``, ties to even.

    Done with exact operations only (``fmod`` is exact), so no quotient is ever rounded.
    """
    ay = np.abs(y)
    s = np.abs(np.fmod(x, 2.0 * ay))  # in [0, 2|y|); trunc quotient's parity decided below
    odd = s >= ay
    s = np.where(odd, s - ay, s)  # now in [0, |y|), exact
    half = ay - s  # exact when s >= |y|/2, and the comparisons below stay right otherwise
    flip = (s > half) | ((s == half) & odd)
    s = np.where(flip, s - ay, s)
    return np.where(s == 0, np.copysign(0.0, x), np.copysign(1.0, x) * s)


def _fdim(x, y):
    r = np.where(x > y, x - y, 0.0)
    return np.where(np.isnan(x) | np.isnan(y), np.nan, r)


def _logb(x):
    _, e = np.frexp(x)
    r = (e - 1).astype(_F64)
    r = np.where(x == 0, -np.inf, r)
    r = np.where(np.isinf(x), np.inf, r)
    return np.where(np.isnan(x), np.nan, r)


def _pi_parts(x):
    """``x = n/2 + f`` with ``n`` an integer (as float) and ``|f| <= 1/4``, both exact."""
    n = np.rint(2.0 * x)
    f = x - 0.5 * n
    return np.fmod(n, 4.0) % 4.0, np.pi * f


def _sinpi(x):
    q, t = _pi_parts(x)
    s, c = np.sin(t), np.cos(t)
    r = np.select([q == 0, q == 1, q == 2], [s, c, -s], -c)
    return np.where(x == 0, x, r)  # keep the sign of zero


def _cospi(x):
    q, t = _pi_parts(x)
    s, c = np.sin(t), np.cos(t)
    return np.select([q == 0, q == 1, q == 2], [c, -s, -c], s)


def _norm(*xs):
    r = np.abs(xs[0])
    for x in xs[1:]:
        r = np.hypot(r, x)
    return r


# ---------------------------------------------------------------- helpers through `math`


def _lgamma1(x: float) -> float:
    try:
        return math.lgamma(x)
    except (ValueError, OverflowError):
        return math.inf  # poles (0, negative integers) and overflow


def _tgamma1(x: float) -> float:
    if x == 0:
        return math.copysign(math.inf, x)
    try:
        return math.gamma(x)
    except ValueError:
        return math.nan  # negative integers, -inf
    except OverflowError:
        return math.inf


def _scalar_fn(f: Callable[[float], float]) -> Callable:
    uf = np.frompyfunc(f, 1, 1)

    def apply(x):
        return np.asarray(uf(np.asarray(x, dtype=_F64)), dtype=_F64)

    return apply


_erfc = _scalar_fn(math.erfc)


def _normcdf(x):
    return 0.5 * _erfc(-x / math.sqrt(2.0))


# ---------------------------------------------------------------- the table

_NUMPY: dict[str, Callable] = {
    "acos": np.arccos, "acosh": np.arccosh, "asin": np.arcsin, "asinh": np.arcsinh,
    "atan": np.arctan, "atan2": np.arctan2, "atanh": np.arctanh, "cbrt": np.cbrt,
    "ceil": np.ceil, "copysign": np.copysign, "cos": np.cos, "cosh": np.cosh,
    "cospi": _cospi, "cyl_bessel_i0": np.i0, "exp10": lambda x: np.power(10.0, x),
    "exp2": np.exp2, "exp": np.exp, "expm1": np.expm1, "fabs": np.abs, "fdim": _fdim,
    "fdivide": np.divide, "floor": np.floor, "fma": lambda x, y, z: x * y + z,
    "fmax": np.fmax, "fmin": np.fmin, "fmod": np.fmod, "hypot": np.hypot,
    "log10": np.log10, "log1p": np.log1p, "log2": np.log2, "logb": _logb, "log": np.log,
    "norm3d": _norm, "norm4d": _norm, "pow": np.power,
    "rcbrt": lambda x: 1.0 / np.cbrt(x), "remainder": _remainder,
    "rhypot": lambda x, y: 1.0 / np.hypot(x, y),
    "rnorm3d": lambda *xs: 1.0 / _norm(*xs), "rnorm4d": lambda *xs: 1.0 / _norm(*xs),
    "round": _round_half_away, "rsqrt": lambda x: 1.0 / np.sqrt(x), "sin": np.sin,
    "sinh": np.sinh, "sinpi": _sinpi, "sqrt": np.sqrt, "tan": np.tan, "tanh": np.tanh,
    "trunc": np.trunc,
    # through math
    "erf": _scalar_fn(math.erf), "erfc": _erfc, "lgamma": _scalar_fn(_lgamma1),
    "tgamma": _scalar_fn(_tgamma1), "normcdf": _normcdf,
}

# built-in -> its name in scipy.special
SCIPY_BUILTINS: dict[str, str] = {
    "erfcx": "erfcx", "erfinv": "erfinv", "erfcinv": "erfcinv", "normcdfinv": "ndtri",
    "j0": "j0", "j1": "j1", "y0": "y0", "y1": "y1", "cyl_bessel_i1": "i1",
}


def call_builtin(name: str, args: list[np.ndarray], dtype: np.dtype, *, where: str = "") -> np.ndarray:
    """Evaluate built-in ``name`` on ``args`` (arrays), giving an array of numpy ``dtype``.

    ``where`` (e.g. a formatted source location) is appended to error messages.
    """
    dtype = np.dtype(dtype)
    if name == "nextafter":
        x, y = (np.asarray(a).astype(dtype, copy=False) for a in args)
        return np.nextafter(x, y)
    xs = [np.asarray(a).astype(_F64, copy=False) for a in args]
    fn = _NUMPY.get(name)
    if fn is None and name in SCIPY_BUILTINS:
        special = scipy_special()
        if special is None:
            raise CodegenError(
                f"the numpy reference needs scipy for the built-in '{name}' "
                f"(pip install scipy){where}"
            )
        fn = getattr(special, SCIPY_BUILTINS[name])
    if fn is None:
        raise CodegenError(f"the numpy reference does not know the built-in '{name}'{where}")
    return np.asarray(fn(*xs)).astype(dtype, copy=False)


def saturating_int(v: np.ndarray, dt: np.dtype) -> np.ndarray:
    """Float -> integer conversion as every target does it: truncate toward zero, clamp to
    the type's range, NaN -> 0."""
    info = np.iinfo(dt)
    v = np.asarray(v, dtype=np.float64)
    hi, lo = v >= 2.0 ** (info.bits - (1 if info.min < 0 else 0)), v <= float(info.min) - 1.0
    safe = np.where(np.isnan(v) | hi | lo, 0.0, v)
    return np.where(hi, info.max, np.where(lo, info.min, np.trunc(safe).astype(dt))).astype(dt)
