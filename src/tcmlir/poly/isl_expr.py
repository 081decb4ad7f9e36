"""isl syntax of a quasi-affine IR index expression, for access relations in `poly.scop`.

Uses `tcmlir.affine.to_isl` (the shared converter) when it is importable, and a small private
converter otherwise, so the polyhedral layer does not depend on the order modules land in.
Returns None for an expression that is not quasi-affine (a gather, a product of indices, ...).
"""

from __future__ import annotations

from .. import ir

__all__ = ["to_isl"]

try:  # pragma: no cover - depends on which modules are present
    from ..affine import to_isl as _shared_to_isl
except ImportError:  # pragma: no cover
    _shared_to_isl = None


def to_isl(expr: ir.Expr) -> str | None:
    if _shared_to_isl is not None:
        return _shared_to_isl(expr)
    return _private_to_isl(expr)


def _const(expr: ir.Expr) -> int | None:
    text = _private_to_isl(expr)
    if text is None:
        return None
    try:
        return int(text)
    except ValueError:
        return None


def _private_to_isl(expr: ir.Expr) -> str | None:
    match expr:
        case ir.Const(value=v) if isinstance(v, int) and not isinstance(v, bool):
            return str(v)
        case ir.Index(name=n) | ir.Size(name=n):
            return n
        case ir.Cast(operand=x) if not x.dtype.is_float:
            return _private_to_isl(x)
        case ir.Unary(op="-", operand=x):
            inner = _private_to_isl(x)
            return None if inner is None else f"(-({inner}))"
        case ir.Binary(op=op, lhs=a, rhs=b) if op in ("+", "-", "min", "max"):
            ta, tb = _private_to_isl(a), _private_to_isl(b)
            if ta is None or tb is None:
                return None
            return f"({ta} {op} {tb})" if op in "+-" else f"{op}({ta}, {tb})"
        case ir.Binary(op="*", lhs=a, rhs=b):
            ta, tb = _private_to_isl(a), _private_to_isl(b)
            if ta is None or tb is None or (_const(a) is None and _const(b) is None):
                return None
            return f"({ta} * {tb})"
        case ir.Binary(op="floordiv" | "floormod" as op, lhs=a, rhs=b):
            ta, cb = _private_to_isl(a), _const(b)
            if ta is None or cb is None or cb <= 0:
                return None
            return f"floor(({ta}) / {cb})" if op == "floordiv" else f"(({ta}) mod {cb})"
    return None
