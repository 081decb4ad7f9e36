"""TC source text from TC IR pieces: the printer the gradient derivation writes its program with.

The derived program (`tcmlir.grad.derive`) is built as IR expressions and printed here as TC
source, which `tcmlir.define` then parses and checks like any user program: the printed text
is the contract (it is what `python -m tcmlir.dump --grad` shows, what the caches key on).

Printing rules: every compound expression is parenthesised (no precedence reasoning); casts
print as ``float64(x)``; ``floordiv``/``floormod`` print as ``/`` and ``%`` (they only occur in
index positions, where TC reads ``/`` and ``%`` as floor operations); size expressions (isl
`PwAff` text) print through `tcmlir.affine.pw_aff_to_expr`.
"""

from __future__ import annotations

import math

from .. import ir
from ..affine import pw_aff_to_expr
from ..dtypes import DType
from ..errors import TCError

__all__ = ["GradError", "format_expr", "format_size", "format_statement"]


class GradError(TCError):
    """A TC definition (or one of its inputs) whose gradient tcmlir cannot derive."""


def _const(value: int | float | bool, dtype: DType) -> str:
    if dtype is DType.BOOL or isinstance(value, bool):
        return "true" if value else "false"
    if dtype.is_float:
        v = float(value)
        if not math.isfinite(v):
            raise GradError(f"cannot write the constant {v} in TC source")
        text = repr(v)
        return f"(-{text[1:]})" if v < 0 or text.startswith("-") else text
    return f"(-{-int(value)})" if int(value) < 0 else str(int(value))


def format_expr(e: ir.Expr) -> str:
    """TC source for an IR expression (fully parenthesised)."""
    match e:
        case ir.Const(value=v, dtype=t):
            return _const(v, t)
        case ir.Index(name=n) | ir.Size(name=n):
            return n
        case ir.Read(tensor=t, indices=idx):
            return f"{t}({', '.join(format_expr(x) for x in idx)})" if idx else t
        case ir.Unary(op=op, operand=x):
            return f"({op}{format_expr(x)})"
        case ir.Binary(op=op, lhs=a, rhs=b) if op in ("min", "max"):
            return f"{op}({format_expr(a)}, {format_expr(b)})"
        case ir.Binary(op=op, lhs=a, rhs=b):
            sym = {"floordiv": "/", "floormod": "%"}.get(op, op)
            return f"({format_expr(a)} {sym} {format_expr(b)})"
        case ir.Select(cond=c, then=t, orelse=f):
            return f"({format_expr(c)} ? {format_expr(t)} : {format_expr(f)})"
        case ir.Call(func=f, args=args):
            return f"{f}({', '.join(format_expr(a) for a in args)})"
        case ir.Cast(operand=x, dtype=t):
            return f"{t}({format_expr(x)})"
    raise AssertionError(f"unknown IR node {e!r}")


def size_expr(s: ir.SizeExpr, what: str) -> ir.Expr:
    """An INT32 IR expression equal to a one-piece size expression, or a GradError."""
    expr = pw_aff_to_expr(s.pw_aff())
    if expr is None:
        raise GradError(f"cannot write the bound {s} of {what} as a TC expression "
                        "(it is piecewise)")
    return expr


def format_size(s: ir.SizeExpr, what: str) -> str:
    return format_expr(size_expr(s, what))


def _op_text(st: ir.Statement) -> str:
    # a reduction over no index that starts from its identity is one assignment: `=` keeps the
    # program recognisable as elementwise or row-wise to the GPU defaults
    if st.reduction is None or (st.init and not st.reduction_indices):
        return "="
    op = {"+": "+=", "*": "*=", "min": "min=", "max": "max="}[st.reduction.value]
    return op + ("!" if st.init else "")


def format_statement(st: ir.Statement) -> str:
    """One TC statement with a ``where`` range for every index (nothing left to inference)."""
    lhs = f"{st.tensor}({', '.join(st.lhs)})" if st.lhs else st.tensor
    text = f"    {lhs} {_op_text(st)} {format_expr(st.rhs)}"
    if st.ranges:
        ranges = ", ".join(
            f"{r.name} in {format_size(r.lo, 'index ' + r.name)}:{format_size(r.hi, 'index ' + r.name)}"
            for r in st.ranges)
        text += f"\n        where {ranges}"
    return text
