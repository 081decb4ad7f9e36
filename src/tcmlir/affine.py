"""Quasi-affine integer expressions of the TC IR and their isl text.

`to_isl` turns an integer IR expression over indices (`ir.Index`), sizes (`ir.Size`) and
constants into isl syntax when it is quasi-affine: ``+ -``, multiplication where one side is a
constant, unary ``-``, and ``floordiv``/``floormod`` by a positive constant. Anything else
(a tensor read, a product of two variables, ``min``, a select, a float) gives None.

`condition_to_isl` gives the affine part of a boolean condition (a guard of ``?:``) and
`guarded_reads` pairs every read of an expression with the guards it is evaluated under: an
access in the taken arm of ``c ? x : y`` only happens where ``c`` holds, and the bounds proof
and the polyhedral model use that (the code generators evaluate only the taken arm of a
select whose arms read tensors).

`pw_aff_to_expr` goes the other way for a single-piece isl `PwAff` over the size parameters
(used for ``T.k`` of a tensor whose shape was inferred).
"""

from __future__ import annotations

import math
import re

import islpy as isl

from . import ir
from .dtypes import DType

__all__ = ["condition_to_isl", "const_value", "domain_guard", "guarded_reads", "is_isl_name",
           "pw_aff_to_expr", "statement_rhs", "to_isl"]

_IDENT = re.compile(r"[A-Za-z_][A-Za-z0-9_]*\Z")
_NAME_CACHE: dict[str, bool] = {}


def is_isl_name(name: str) -> bool:
    """Whether ``name`` is an identifier that isl reads back as a plain name (not a keyword)."""
    if name in _NAME_CACHE:
        return _NAME_CACHE[name]
    ok = False
    if _IDENT.match(name):
        try:
            pa = isl.PwAff.read_from_str(isl.DEFAULT_CONTEXT, f"[{name}] -> {{ [({name})] }}")
            ok = pa.dim(isl.dim_type.param) == 1 and pa.get_dim_name(isl.dim_type.param, 0) == name
            st = isl.Set.read_from_str(isl.DEFAULT_CONTEXT, f"{{ [{name}] : {name} >= 0 }}")
            ok = ok and st.get_dim_name(isl.dim_type.set, 0) == name
        except isl.Error:
            ok = False
    _NAME_CACHE[name] = ok
    return ok


def const_value(expr: ir.Expr) -> int | None:
    """The value of an integer expression built from constants only, else None."""
    match expr:
        case ir.Const(value=v, dtype=t) if t.is_int and isinstance(v, int) and not isinstance(v, bool):
            return v
        case ir.Cast(operand=x, dtype=t) if t.is_int:
            return const_value(x)
        case ir.Unary(op="-", operand=x):
            v = const_value(x)
            return None if v is None else -v
        case ir.Binary(op=op, lhs=a, rhs=b) if op in ("+", "-", "*", "floordiv", "floormod", "min", "max"):
            va, vb = const_value(a), const_value(b)
            if va is None or vb is None:
                return None
            if op == "+":
                return va + vb
            if op == "-":
                return va - vb
            if op == "*":
                return va * vb
            if op in ("min", "max"):
                return min(va, vb) if op == "min" else max(va, vb)
            if vb == 0:
                return None
            return va // vb if op == "floordiv" else va % vb
    return None


def to_isl(expr: ir.Expr) -> str | None:
    """isl syntax of a quasi-affine integer expression over Index/Size/Const, else None.

    Names are written as they are; callers make sure they are valid isl names (`is_isl_name`).
    """
    if expr.dtype.is_float or expr.dtype is DType.BOOL:
        return None
    v = const_value(expr)
    if v is not None:
        return f"({v})"
    match expr:
        case ir.Index(name=n) | ir.Size(name=n):
            return n if _IDENT.match(n) else None
        case ir.Cast(operand=x, dtype=t) if t.is_int and x.dtype.is_int:
            return to_isl(x)
        case ir.Unary(op="-", operand=x):
            s = to_isl(x)
            return None if s is None else f"(-{s})"
        case ir.Binary(op=op, lhs=a, rhs=b) if op in ("+", "-"):
            sa, sb = to_isl(a), to_isl(b)
            return None if sa is None or sb is None else f"({sa} {op} {sb})"
        case ir.Binary(op="*", lhs=a, rhs=b):
            ca, cb = const_value(a), const_value(b)
            if ca is not None:
                s = to_isl(b)
                return None if s is None else f"({ca} * {s})"
            if cb is not None:
                s = to_isl(a)
                return None if s is None else f"({cb} * {s})"
            return None
        case ir.Binary(op=op, lhs=a, rhs=b) if op in ("floordiv", "floormod"):
            c = const_value(b)
            s = to_isl(a)
            if c is None or c <= 0 or s is None:
                return None
            return f"floor(({s})/{c})" if op == "floordiv" else f"(({s}) mod {c})"
    return None


_NEGATE = {"<": ">=", "<=": ">", ">": "<=", ">=": "<", "==": "!=", "!=": "=="}


def condition_to_isl(expr: ir.Expr, positive: bool = True) -> str | None:
    """An isl condition implied by ``expr`` being ``positive`` (true, or false when not), or
    None when no affine consequence is known. Exact for comparisons of quasi-affine integer
    expressions combined with ``&& || !``; other parts are dropped where that is sound."""
    match expr:
        case ir.Const(value=v, dtype=DType.BOOL):
            return None if bool(v) == positive else "1 = 0"
        case ir.Unary(op="!", operand=x):
            return condition_to_isl(x, not positive)
        case ir.Binary(op=op, lhs=a, rhs=b) if op in _NEGATE:
            if not (a.dtype.is_signed and b.dtype.is_signed):  # unsigned wraps: not affine
                return None
            sa, sb = to_isl(a), to_isl(b)
            if sa is None or sb is None:
                return None
            rel = op if positive else _NEGATE[op]
            if rel == "!=":
                return f"({sa} < {sb} or {sa} > {sb})"
            return f"({sa} {'=' if rel == '==' else rel} {sb})"
        case ir.Binary(op=op, lhs=a, rhs=b) if op in ("&&", "||"):
            ca, cb = condition_to_isl(a, positive), condition_to_isl(b, positive)
            if (op == "&&") == positive:  # a conjunction: either part alone is implied
                parts = [c for c in (ca, cb) if c is not None]
                return " and ".join(parts) if parts else None
            if ca is None or cb is None:  # a disjunction needs both sides
                return None
            return f"({ca} or {cb})"
    return None


def _exactly_affine(expr: ir.Expr) -> bool:
    """Whether `condition_to_isl` gives ``expr`` exactly (drops no part of it)."""
    match expr:
        case ir.Const(dtype=DType.BOOL):
            return True
        case ir.Unary(op="!", operand=x):
            return _exactly_affine(x)
        case ir.Binary(op=op, lhs=a, rhs=b) if op in _NEGATE:
            return (a.dtype.is_signed and b.dtype.is_signed and to_isl(a) is not None
                    and to_isl(b) is not None)
        case ir.Binary(op=op, lhs=a, rhs=b) if op in ("&&", "||"):
            return _exactly_affine(a) and _exactly_affine(b)
    return False


def domain_guard(st: ir.Statement) -> tuple[str, ir.Expr] | None:
    """``(condition, rhs)`` when the statement's instances where an affine ``condition`` (isl
    syntax over its indices and sizes) fails do nothing: a ``+``/``*`` reduction whose
    right-hand side is ``c ? x : e`` or ``c ? e : x``, ``e`` the reduction's identity (``0``
    for ``+=``) and ``c`` exactly affine. The polyhedral model then iterates only where the
    condition holds (`poly.scop`: its domain is the box intersected with it) and the code
    generators evaluate ``rhs``, the arm ``x``, without the select: a padded convolution
    written with a guard has the loop bounds and the multiply-adds of a valid one. Skipping
    ``acc + 0`` / ``acc * 1`` leaves every value as it was (a ``-0.0`` stays ``-0.0`` where
    the select would give ``+0.0``); NaN and Inf in the unselected arm never enter."""
    if st.reduction not in (ir.Reduction.ADD, ir.Reduction.MUL) or st.rhs.dtype is DType.BOOL:
        return None
    match st.rhs:
        case ir.Select(cond=c, then=x, orelse=y):
            pass
        case _:
            return None
    if not _exactly_affine(c):
        return None
    identity = st.reduction.identity(st.rhs.dtype)
    for arm, other, positive in ((y, x, True), (x, y, False)):
        if isinstance(arm, ir.Const) and arm.dtype == st.rhs.dtype and arm.value == identity:
            cond = condition_to_isl(c, positive)
            return ("1 = 1" if cond is None else cond), other
    return None


def statement_rhs(st: ir.Statement) -> ir.Expr:
    """The value a code generator emits for one instance of ``st`` in the polyhedral model's
    domain: its right-hand side, less a select `domain_guard` moved into the domain."""
    guard = domain_guard(st)
    return st.rhs if guard is None else guard[1]


def guarded_reads(expr: ir.Expr, guard: str | None = None):
    """Every `ir.Read` in ``expr`` (gather indices included) with the isl condition on the
    indices and sizes under which it is evaluated (None: always)."""
    match expr:
        case ir.Select(cond=c, then=x, orelse=y):
            yield from guarded_reads(c, guard)
            for arm, positive in ((x, True), (y, False)):
                cond = condition_to_isl(c, positive)
                both = guard if cond is None else cond if guard is None else f"{guard} and {cond}"
                yield from guarded_reads(arm, both)
            return
        case ir.Read():
            yield expr, guard
    for child in ir.children(expr):
        yield from guarded_reads(child, guard)


# ---------------------------------------------------------------- isl -> IR


def _val(v: isl.Val) -> tuple[int, int]:
    return int(v.get_num_si()), int(v.get_den_val().to_python())


def _aff_to_expr(aff: isl.Aff) -> ir.Expr | None:
    terms: list[tuple[tuple[int, int], ir.Expr | None]] = [(_val(aff.get_constant_val()), None)]
    for i in range(aff.dim(isl.dim_type.param)):
        c = _val(aff.get_coefficient_val(isl.dim_type.param, i))
        if c[0]:
            terms.append((c, ir.Size(aff.get_dim_name(isl.dim_type.param, i))))
    if aff.dim(isl.dim_type.in_) and any(
        aff.get_coefficient_val(isl.dim_type.in_, i).get_num_si()
        for i in range(aff.dim(isl.dim_type.in_))
    ):
        return None
    for i in range(aff.dim(isl.dim_type.div)):
        c = _val(aff.get_coefficient_val(isl.dim_type.div, i))
        if c[0]:
            inner = _aff_to_expr(aff.get_div(i))
            if inner is None:
                return None
            terms.append((c, inner))
    terms.append(terms.pop(0))  # the constant last: N - K + 1
    den = 1
    for (_, d), _t in terms:
        den = den * d // math.gcd(den, d)
    result: ir.Expr | None = None
    for (num, d), term in terms:
        k = num * (den // d)
        if k == 0:
            continue
        if term is None:
            part: ir.Expr = ir.Const(abs(k), DType.INT32)
        elif abs(k) == 1:
            part = term
        else:
            part = ir.Binary("*", ir.Const(abs(k), DType.INT32), term, DType.INT32)
        if result is None:
            result = part if k > 0 else ir.Unary("-", part, DType.INT32)
        else:
            result = ir.Binary("+" if k > 0 else "-", result, part, DType.INT32)
    if result is None:
        result = ir.Const(0, DType.INT32)
    if den != 1:
        result = ir.Binary("floordiv", result, ir.Const(den, DType.INT32), DType.INT32)
    return result


def pw_aff_to_expr(pa: isl.PwAff) -> ir.Expr | None:
    """An INT32 IR expression (Size/Const, ``+ - *``, ``floordiv``) equal to a one-piece PwAff.

    None when the PwAff has several pieces or depends on set dimensions.
    """
    pieces: list[isl.Aff] = []
    pa.foreach_piece(lambda _set, aff: pieces.append(aff))
    if len(pieces) != 1:
        return None
    return _aff_to_expr(pieces[0])
