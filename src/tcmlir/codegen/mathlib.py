"""TC's built-in math functions in LLVM IR, shared by every target.

A built-in is either *primitive* (the target lowers it: the host through an LLVM intrinsic or
libm, the NVPTX target through libdevice) or *derived*: computed here from primitives and plain
arithmetic (``rsqrt = 1/sqrt``, ``normcdf = 0.5*erfc(-x/sqrt2)``, ...). `emit_builtin` is the one
entry point the expression lowering calls; the target strategy's ``math`` method does the rest.

Functions without a libm counterpart (``erfinv``, ``erfcinv``, ``normcdfinv``, ``cyl_bessel_i0``,
``cyl_bessel_i1``) are computed from approximations refined or evaluated in double precision
(see each helper); ``erfcx`` switches to its asymptotic series where ``exp(x*x)`` would overflow.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING

from llvmlite import ir

if TYPE_CHECKING:  # pragma: no cover
    from .target import Target

__all__ = ["DERIVED", "PRIMITIVES", "emit_builtin"]

# Built-ins a target must provide (C names, double versions; float versions add an 'f').
PRIMITIVES = frozenset({
    "sqrt", "exp", "log", "fabs", "floor", "ceil", "trunc", "round", "pow", "copysign", "fmin",
    "fmax", "fma", "exp2", "log2", "log10", "sin", "cos", "tan", "asin", "acos", "atan", "atan2",
    "sinh", "cosh", "tanh", "asinh", "acosh", "atanh", "cbrt", "erf", "erfc", "expm1", "log1p",
    "lgamma", "tgamma", "j0", "j1", "y0", "y1", "hypot", "fmod", "remainder", "nextafter", "logb",
    "fdim",
})

Builder = ir.IRBuilder
Math = Callable[[str, Sequence[ir.Value]], ir.Value]


def _c(ty: ir.Type, v: float) -> ir.Constant:
    return ir.Constant(ty, v)


def _rsqrt(b: Builder, m: Math, x: ir.Value) -> ir.Value:
    return b.fdiv(_c(x.type, 1.0), m("sqrt", [x]))


def _exp10(b: Builder, m: Math, x: ir.Value) -> ir.Value:
    return m("pow", [_c(x.type, 10.0), x])


def _sinpi(b: Builder, m: Math, x: ir.Value) -> ir.Value:
    # sin(pi*x) with the argument reduced first so that integers give exact zeros
    r = b.fsub(x, b.fmul(_c(x.type, 2.0), m("round", [b.fmul(x, _c(x.type, 0.5))])))
    return m("sin", [b.fmul(_c(x.type, math.pi), r)])


def _cospi(b: Builder, m: Math, x: ir.Value) -> ir.Value:
    r = b.fsub(x, b.fmul(_c(x.type, 2.0), m("round", [b.fmul(x, _c(x.type, 0.5))])))
    a = m("fabs", [r])  # in [0, 1]; cos(pi a) = sin(pi (0.5 - a)) keeps cospi(0.5) exactly 0
    return m("sin", [b.fmul(_c(x.type, math.pi), b.fsub(_c(x.type, 0.5), a))])


def _fdivide(b: Builder, m: Math, x: ir.Value, y: ir.Value) -> ir.Value:
    return b.fdiv(x, y)


def _rhypot(b: Builder, m: Math, x: ir.Value, y: ir.Value) -> ir.Value:
    return b.fdiv(_c(x.type, 1.0), m("hypot", [x, y]))


def _norm(b: Builder, m: Math, *xs: ir.Value) -> ir.Value:
    # scale by the largest magnitude so that squares neither overflow nor underflow
    mags = [m("fabs", [x]) for x in xs]
    big = mags[0]
    for v in mags[1:]:
        big = m("fmax", [big, v])
    zero = b.fcmp_ordered("==", big, _c(big.type, 0.0))
    safe = b.select(zero, _c(big.type, 1.0), big)
    acc = _c(big.type, 0.0)
    for v in mags:
        s = b.fdiv(v, safe)
        acc = b.fadd(acc, b.fmul(s, s))
    res = b.fmul(safe, m("sqrt", [acc]))
    inf = _c(big.type, math.inf)
    res = b.select(b.fcmp_ordered("==", big, inf), inf, res)
    return b.select(zero, _c(big.type, 0.0), res)


def _rnorm(b: Builder, m: Math, *xs: ir.Value) -> ir.Value:
    return b.fdiv(_c(xs[0].type, 1.0), _norm(b, m, *xs))


def _rcbrt(b: Builder, m: Math, x: ir.Value) -> ir.Value:
    return b.fdiv(_c(x.type, 1.0), m("cbrt", [x]))


def _normcdf(b: Builder, m: Math, x: ir.Value) -> ir.Value:
    arg = b.fmul(x, _c(x.type, -1.0 / math.sqrt(2.0)))
    return b.fmul(_c(x.type, 0.5), m("erfc", [arg]))


def _poly(b: Builder, x: ir.Value, coeffs: Sequence[float]) -> ir.Value:
    """Horner: coeffs from the highest power down."""
    acc = _c(x.type, coeffs[0])
    for c in coeffs[1:]:
        acc = b.fadd(b.fmul(acc, x), _c(x.type, c))
    return acc


def _in_double(fn: Callable[..., ir.Value]) -> Callable[..., ir.Value]:
    """Evaluate a helper in double precision and round back (for float32 operands)."""

    def wrapped(b: Builder, m: Math, *xs: ir.Value) -> ir.Value:
        ty = xs[0].type
        if isinstance(ty, ir.DoubleType):
            return fn(b, m, *xs)
        res = fn(b, m, *(b.fpext(x, ir.DoubleType()) for x in xs))
        return b.fptrunc(res, ty)

    return wrapped


# Giles, "Approximating the erfinv function" (GPU Computing Gems), single-precision branch,
# then two Newton steps on erf in double: accurate to double precision except right at +-1.
_ERFINV_LO = (2.81022636e-08, 3.43273939e-07, -3.5233877e-06, -4.39150654e-06, 0.00021858087,
              -0.00125372503, -0.00417768164, 0.246640727, 1.50140941)
_ERFINV_HI = (-0.000200214257, 0.000100950558, 0.00134934322, -0.00367342844, 0.00573950773,
              -0.0076224613, 0.00943887047, 1.00167406, 2.83297682)


def _erfinv_double(b: Builder, m: Math, y: ir.Value) -> ir.Value:
    one = _c(y.type, 1.0)
    w = b.fneg(m("log", [b.fmul(b.fsub(one, y), b.fadd(one, y))]))
    lo = _poly(b, b.fsub(w, _c(y.type, 2.5)), _ERFINV_LO)
    hi = _poly(b, b.fsub(m("sqrt", [w]), _c(y.type, 3.0)), _ERFINV_HI)
    x = b.fmul(b.select(b.fcmp_ordered("<", w, _c(y.type, 5.0)), lo, hi), y)
    k = _c(y.type, 2.0 / math.sqrt(math.pi))
    for _ in range(2):
        # x -= (erf(x) - y) / (2/sqrt(pi) * exp(-x^2))
        d = b.fmul(k, m("exp", [b.fneg(b.fmul(x, x))]))
        x = b.fsub(x, b.fdiv(b.fsub(m("erf", [x]), y), d))
    ax = m("fabs", [y])
    edge = b.fcmp_ordered("==", ax, one)
    x = b.select(edge, m("copysign", [_c(y.type, math.inf), y]), x)
    return b.select(b.fcmp_unordered(">", ax, one), _c(y.type, math.nan), x)


_erfinv = _in_double(_erfinv_double)


@_in_double
def _erfcinv(b: Builder, m: Math, y: ir.Value) -> ir.Value:
    # start from erfinv(1 - y) (or, where 1 - y rounds to 1, from the tail asymptote
    # x^2 = -log(y x sqrt(pi))), then Newton on log(erfc(x)) - log(y): quadratic even for tiny y
    x = _erfinv_double(b, m, b.fsub(_c(y.type, 1.0), y))
    t = m("sqrt", [b.fneg(m("log", [y]))])
    tail = m("sqrt", [b.fneg(m("log", [b.fmul(y, b.fmul(t, _c(y.type, math.sqrt(math.pi))))]))])
    fin = b.fcmp_ordered("<", m("fabs", [x]), _c(y.type, math.inf))
    x = b.select(fin, x, tail)
    k = _c(y.type, -2.0 / math.sqrt(math.pi))
    for _ in range(4):
        e = m("erfc", [x])
        d = b.fmul(k, m("exp", [b.fneg(b.fmul(x, x))]))
        x = b.fsub(x, b.fdiv(b.fmul(m("log", [b.fdiv(e, y)]), e), d))
    x = b.select(b.fcmp_ordered("==", y, _c(y.type, 0.0)), _c(y.type, math.inf), x)
    x = b.select(b.fcmp_ordered("==", y, _c(y.type, 2.0)), _c(y.type, -math.inf), x)
    bad = b.or_(b.fcmp_unordered("<", y, _c(y.type, 0.0)), b.fcmp_unordered(">", y, _c(y.type, 2.0)))
    return b.select(bad, _c(y.type, math.nan), x)


def _normcdfinv(b: Builder, m: Math, p: ir.Value) -> ir.Value:
    two = b.fmul(p, _c(p.type, 2.0))
    return b.fmul(_c(p.type, -math.sqrt(2.0)), _erfcinv(b, m, two))


@_in_double
def _erfcx(b: Builder, m: Math, x: ir.Value) -> ir.Value:
    direct = b.fmul(m("exp", [b.fmul(x, x)]), m("erfc", [x]))
    # asymptotic series 1/(x sqrt(pi)) * sum (-1)^n (2n-1)!! / (2x^2)^n for large x
    inv = b.fdiv(_c(x.type, 1.0), b.fmul(_c(x.type, 2.0), b.fmul(x, x)))
    term, total = _c(x.type, 1.0), _c(x.type, 1.0)
    for n in range(1, 8):
        term = b.fmul(term, b.fmul(inv, _c(x.type, -(2 * n - 1))))
        total = b.fadd(total, term)
    asym = b.fdiv(total, b.fmul(x, _c(x.type, math.sqrt(math.pi))))
    return b.select(b.fcmp_ordered(">", x, _c(x.type, 25.0)), asym, direct)


# Cephes-style power series for small |x| and the asymptotic expansion for large |x|,
# both in double: I0/I1 to about 1e-14 relative.
def _bessel_i(order: int) -> Callable[..., ir.Value]:
    @_in_double
    def emit(b: Builder, m: Math, x: ir.Value) -> ir.Value:
        ax = m("fabs", [x])
        q = b.fmul(_c(x.type, 0.25), b.fmul(ax, ax))
        term = _c(x.type, 1.0) if order == 0 else b.fmul(ax, _c(x.type, 0.5))
        total = term
        for k in range(1, 60):
            term = b.fmul(term, b.fdiv(q, _c(x.type, float(k * (k + order)))))
            total = b.fadd(total, term)
        mu = 4.0 * order * order
        inv = b.fdiv(_c(x.type, 1.0), b.fmul(_c(x.type, 8.0), ax))
        t, s = _c(x.type, 1.0), _c(x.type, 1.0)
        for k in range(1, 12):
            t = b.fmul(t, b.fmul(inv, _c(x.type, -(mu - (2 * k - 1) ** 2) / k)))
            s = b.fadd(s, t)
        pre = b.fdiv(m("exp", [ax]), m("sqrt", [b.fmul(ax, _c(x.type, 2.0 * math.pi))]))
        asym = b.fmul(pre, s)
        res = b.select(b.fcmp_ordered(">", ax, _c(x.type, 30.0)), asym, total)
        if order == 1:
            res = m("copysign", [res, x])
        return res

    return emit


DERIVED: dict[str, Callable[..., ir.Value]] = {
    "rsqrt": _rsqrt, "exp10": _exp10, "sinpi": _sinpi, "cospi": _cospi, "fdivide": _fdivide,
    "rhypot": _rhypot, "norm3d": _norm, "norm4d": _norm, "rnorm3d": _rnorm, "rnorm4d": _rnorm,
    "rcbrt": _rcbrt, "normcdf": _normcdf, "erfinv": _erfinv, "erfcinv": _erfcinv,
    "normcdfinv": _normcdfinv, "erfcx": _erfcx, "cyl_bessel_i0": _bessel_i(0),
    "cyl_bessel_i1": _bessel_i(1),
}


def emit_builtin(b: Builder, target: Target, name: str, args: Sequence[ir.Value]) -> ir.Value:
    """The value of built-in ``name`` on float operands (all of one type).

    Raises KeyError for a name that is neither primitive nor derived (the caller reports it).
    """
    module = b.module

    def prim(fname: str, xs: Sequence[ir.Value]) -> ir.Value:
        return target.math(b, module, fname, list(xs))

    if name in PRIMITIVES:
        return prim(name, args)
    return DERIVED[name](b, prim, *args)
