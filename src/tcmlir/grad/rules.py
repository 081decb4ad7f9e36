"""Reverse mode through one TC expression: the chain rule, node by node.

`backprop(expr, seed, active)` walks a right-hand side from the top with ``seed`` (the
adjoint of the expression's value, an IR expression over the statement's indices) and
returns, for every `ir.Read` of an *active* tensor (one whose value depends on an input being
differentiated), the adjoint of that read as an IR expression. The caller
(`tcmlir.grad.derive`) turns each into a TC statement that accumulates into the tensor's
gradient. Rules: sums and products by the chain rule; ``min``/``max`` (and ``fmin``/``fmax``)
route the adjoint to the argument taken (the first on ties); ``c ? x : y`` to its taken arm;
each built-in by its derivative (`_PARTIALS`); casts between float types cast the adjoint
back; integer and boolean values carry none. Built-ins without a derivative in TC's list
(``lgamma``, ``tgamma``) are refused with a `GradError`.
"""

from __future__ import annotations

import math
from collections.abc import Callable

from .. import ir
from ..dtypes import DType
from .emit import GradError

__all__ = ["backprop", "depends_on"]

_B = DType.BOOL


def const(v: float, t: DType) -> ir.Const:
    return ir.Const(float(v) if t.is_float else v, t)


def mul(a: ir.Expr, b: ir.Expr) -> ir.Expr:
    if isinstance(a, ir.Const) and a.value == 1:
        return b
    if isinstance(b, ir.Const) and b.value == 1:
        return a
    return ir.Binary("*", a, b, a.dtype)


def add(a: ir.Expr, b: ir.Expr) -> ir.Expr:
    return ir.Binary("+", a, b, a.dtype)


def sub(a: ir.Expr, b: ir.Expr) -> ir.Expr:
    return ir.Binary("-", a, b, a.dtype)


def div(a: ir.Expr, b: ir.Expr) -> ir.Expr:
    return ir.Binary("/", a, b, a.dtype)


def neg(a: ir.Expr) -> ir.Expr:
    return ir.Unary("-", a, a.dtype)


def call(f: str, *args: ir.Expr) -> ir.Expr:
    return ir.Call(f, tuple(args), args[0].dtype)


def cmp(op: str, a: ir.Expr, b: ir.Expr) -> ir.Expr:
    return ir.Binary(op, a, b, _B)


def select(c: ir.Expr, a: ir.Expr, b: ir.Expr) -> ir.Expr:
    return ir.Select(c, a, b, a.dtype)


def sq(a: ir.Expr) -> ir.Expr:
    return mul(a, a)


def _c(x: ir.Expr, v: float) -> ir.Expr:
    return const(v, x.dtype)


_SQRT_PI = math.sqrt(math.pi)
_SQRT_2PI = math.sqrt(2 * math.pi)

# d f(args) / d args[k], as IR over the arguments ``a`` and the call itself ``e``.
Partials = Callable[[tuple[ir.Expr, ...], ir.Expr], tuple[ir.Expr | None, ...]]
_PARTIALS: dict[str, Partials] = {
    "exp": lambda a, e: (e,),
    "exp2": lambda a, e: (mul(e, _c(e, math.log(2))),),
    "exp10": lambda a, e: (mul(e, _c(e, math.log(10))),),
    "expm1": lambda a, e: (call("exp", a[0]),),
    "log": lambda a, e: (div(_c(e, 1), a[0]),),
    "log2": lambda a, e: (div(_c(e, 1), mul(a[0], _c(e, math.log(2)))),),
    "log10": lambda a, e: (div(_c(e, 1), mul(a[0], _c(e, math.log(10)))),),
    "log1p": lambda a, e: (div(_c(e, 1), add(_c(e, 1), a[0])),),
    "sqrt": lambda a, e: (div(_c(e, 0.5), e),),
    "rsqrt": lambda a, e: (div(mul(_c(e, -0.5), e), a[0]),),
    "cbrt": lambda a, e: (div(_c(e, 1), mul(_c(e, 3), sq(e))),),
    "rcbrt": lambda a, e: (div(neg(e), mul(_c(e, 3), a[0])),),
    "sin": lambda a, e: (call("cos", a[0]),),
    "cos": lambda a, e: (neg(call("sin", a[0])),),
    "tan": lambda a, e: (add(_c(e, 1), sq(e)),),
    "sinpi": lambda a, e: (mul(_c(e, math.pi), call("cospi", a[0])),),
    "cospi": lambda a, e: (mul(_c(e, -math.pi), call("sinpi", a[0])),),
    "sinh": lambda a, e: (call("cosh", a[0]),),
    "cosh": lambda a, e: (call("sinh", a[0]),),
    "tanh": lambda a, e: (sub(_c(e, 1), sq(e)),),
    "asin": lambda a, e: (call("rsqrt", sub(_c(e, 1), sq(a[0]))),),
    "acos": lambda a, e: (neg(call("rsqrt", sub(_c(e, 1), sq(a[0])))),),
    "atan": lambda a, e: (div(_c(e, 1), add(_c(e, 1), sq(a[0]))),),
    "asinh": lambda a, e: (call("rsqrt", add(sq(a[0]), _c(e, 1))),),
    "acosh": lambda a, e: (call("rsqrt", sub(sq(a[0]), _c(e, 1))),),
    "atanh": lambda a, e: (div(_c(e, 1), sub(_c(e, 1), sq(a[0]))),),
    "erf": lambda a, e: (mul(_c(e, 2 / _SQRT_PI), call("exp", neg(sq(a[0])))),),
    "erfc": lambda a, e: (mul(_c(e, -2 / _SQRT_PI), call("exp", neg(sq(a[0])))),),
    "erfinv": lambda a, e: (mul(_c(e, _SQRT_PI / 2), call("exp", sq(e))),),
    "erfcinv": lambda a, e: (mul(_c(e, -_SQRT_PI / 2), call("exp", sq(e))),),
    "erfcx": lambda a, e: (sub(mul(mul(_c(e, 2), a[0]), e), _c(e, 2 / _SQRT_PI)),),
    "normcdf": lambda a, e: (mul(_c(e, 1 / _SQRT_2PI), call("exp", mul(_c(e, -0.5), sq(a[0])))),),
    "normcdfinv": lambda a, e: (mul(_c(e, _SQRT_2PI), call("exp", mul(_c(e, 0.5), sq(e)))),),
    "fabs": lambda a, e: (select(cmp(">", a[0], _c(e, 0)), _c(e, 1),
                                 select(cmp("<", a[0], _c(e, 0)), _c(e, -1), _c(e, 0))),),
    "j0": lambda a, e: (neg(call("j1", a[0])),),
    "j1": lambda a, e: (sub(call("j0", a[0]), div(e, a[0])),),
    "y0": lambda a, e: (neg(call("y1", a[0])),),
    "y1": lambda a, e: (sub(call("y0", a[0]), div(e, a[0])),),
    "cyl_bessel_i0": lambda a, e: (call("cyl_bessel_i1", a[0]),),
    "cyl_bessel_i1": lambda a, e: (sub(call("cyl_bessel_i0", a[0]), div(e, a[0])),),
    # piecewise constant: no gradient (as torch's floor/ceil/round/trunc)
    "ceil": lambda a, e: (None,), "floor": lambda a, e: (None,), "round": lambda a, e: (None,),
    "trunc": lambda a, e: (None,), "logb": lambda a, e: (None,),
    "pow": lambda a, e: (mul(a[1], call("pow", a[0], sub(a[1], _c(e, 1)))),
                         mul(e, call("log", a[0]))),
    "atan2": lambda a, e: (div(a[1], add(sq(a[0]), sq(a[1]))),
                           div(neg(a[0]), add(sq(a[0]), sq(a[1])))),
    "hypot": lambda a, e: (div(a[0], e), div(a[1], e)),
    "rhypot": lambda a, e: (neg(mul(a[0], mul(e, sq(e)))), neg(mul(a[1], mul(e, sq(e))))),
    "norm3d": lambda a, e: tuple(div(x, e) for x in a),
    "norm4d": lambda a, e: tuple(div(x, e) for x in a),
    "rnorm3d": lambda a, e: tuple(neg(mul(x, mul(e, sq(e)))) for x in a),
    "rnorm4d": lambda a, e: tuple(neg(mul(x, mul(e, sq(e)))) for x in a),
    "fmax": lambda a, e: (select(cmp(">=", a[0], a[1]), _c(e, 1), _c(e, 0)),
                          select(cmp(">=", a[0], a[1]), _c(e, 0), _c(e, 1))),
    "fmin": lambda a, e: (select(cmp("<=", a[0], a[1]), _c(e, 1), _c(e, 0)),
                          select(cmp("<=", a[0], a[1]), _c(e, 0), _c(e, 1))),
    "fdim": lambda a, e: (select(cmp(">", a[0], a[1]), _c(e, 1), _c(e, 0)),
                          select(cmp(">", a[0], a[1]), _c(e, -1), _c(e, 0))),
    "fdivide": lambda a, e: (div(_c(e, 1), a[1]), neg(div(e, a[1]))),
    # x - n * y with n = (x - f(x, y)) / y an integer: d/dx = 1, d/dy = -n
    "fmod": lambda a, e: (_c(e, 1), neg(div(sub(a[0], e), a[1]))),
    "remainder": lambda a, e: (_c(e, 1), neg(div(sub(a[0], e), a[1]))),
    "copysign": lambda a, e: (mul(call("copysign", _c(e, 1), a[0]),
                                  call("copysign", _c(e, 1), a[1])), None),
    "nextafter": lambda a, e: (_c(e, 1), None),
    "fma": lambda a, e: (a[1], a[0], _c(e, 1)),
}

_NO_DERIVATIVE = {
    "lgamma": "its derivative (digamma) is not a TC built-in",
    "tgamma": "its derivative needs digamma, which is not a TC built-in",
}


def depends_on(expr: ir.Expr, active: Callable[[str], bool]) -> bool:
    """Whether ``expr``'s *value* depends on an active tensor (gather indices do not count)."""
    match expr:
        case ir.Read(tensor=t):
            return active(t)
        case ir.Cast(operand=x):
            return x.dtype.is_float and depends_on(x, active)
        case ir.Select(then=a, orelse=b):
            return depends_on(a, active) or depends_on(b, active)
        case ir.Binary(op=op) if op in ir.COMPARISONS or op in ("&&", "||"):
            return False
        case ir.Unary(op="!"):
            return False
    if not expr.dtype.is_float:
        return False
    return any(depends_on(c, active) for c in ir.children(expr))


def backprop(expr: ir.Expr, seed: ir.Expr, active: Callable[[str], bool]
             ) -> list[tuple[ir.Read, ir.Expr]]:
    """The adjoint of every active read in ``expr``, given the adjoint ``seed`` of its value."""
    out: list[tuple[ir.Read, ir.Expr]] = []
    _walk(expr, seed, active, out)
    return out


def _walk(e: ir.Expr, g: ir.Expr, active, out: list) -> None:
    if not depends_on(e, active):
        return
    match e:
        case ir.Read():
            out.append((e, g))
        case ir.Cast(operand=x):
            _walk(x, g if g.dtype is x.dtype else ir.Cast(g, x.dtype), active, out)
        case ir.Unary(op="-", operand=x):
            _walk(x, neg(g), active, out)
        case ir.Select(cond=c, then=a, orelse=b):
            zero = const(0, g.dtype)
            _walk(a, select(c, g, zero), active, out)
            _walk(b, select(c, zero, g), active, out)
        case ir.Binary(op="+", lhs=a, rhs=b):
            _walk(a, g, active, out)
            _walk(b, g, active, out)
        case ir.Binary(op="-", lhs=a, rhs=b):
            _walk(a, g, active, out)
            _walk(b, neg(g), active, out)
        case ir.Binary(op="*", lhs=a, rhs=b):
            _walk(a, mul(g, b), active, out)
            _walk(b, mul(g, a), active, out)
        case ir.Binary(op="/", lhs=a, rhs=b):
            _walk(a, div(g, b), active, out)
            _walk(b, neg(div(mul(g, a), mul(b, b))), active, out)
        case ir.Binary(op=("min" | "max") as op, lhs=a, rhs=b):
            first = cmp("<=" if op == "min" else ">=", a, b)
            zero = const(0, g.dtype)
            _walk(a, select(first, g, zero), active, out)
            _walk(b, select(first, zero, g), active, out)
        case ir.Binary(op="%", lhs=a, rhs=b):  # fmod
            _walk(a, g, active, out)
            _walk(b, neg(mul(g, call("trunc", div(a, b)))), active, out)
        case ir.Call(func=f, args=args):
            if f in _NO_DERIVATIVE:
                raise GradError(f"cannot differentiate the built-in {f}: {_NO_DERIVATIVE[f]}")
            rule = _PARTIALS.get(f)
            if rule is None:
                raise GradError(f"no derivative rule for the built-in {f}")
            for arg, partial in zip(args, rule(args, e), strict=True):
                if partial is not None:
                    _walk(arg, mul(g, partial), active, out)
        case _:
            raise GradError(f"cannot differentiate the expression node {type(e).__name__} "
                            f"({getattr(e, 'op', '')})")
