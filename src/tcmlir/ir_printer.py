"""Readable text of the TC IR (``python -m tcmlir.dump --stage ir``)."""

from __future__ import annotations

from .ir import (
    Binary,
    Call,
    Cast,
    Const,
    Expr,
    Function,
    Index,
    Read,
    Select,
    Size,
    Statement,
    Unary,
)

__all__ = ["format_expr", "format_function", "format_statement"]


def format_expr(e: Expr) -> str:
    match e:
        case Const(value=v, dtype=t):
            return f"{v!r}:{t}"
        case Index(name=n) | Size(name=n):
            return n
        case Read(tensor=t, indices=idx):
            return f"{t}({', '.join(map(format_expr, idx))})" if idx else t
        case Unary(op=op, operand=x):
            return f"{op}{format_expr(x)}"
        case Binary(op=op, lhs=a, rhs=b) if op in ("min", "max", "floordiv", "floormod"):
            return f"{op}({format_expr(a)}, {format_expr(b)})"
        case Binary(op=op, lhs=a, rhs=b):
            return f"({format_expr(a)} {op} {format_expr(b)})"
        case Select(cond=c, then=t, orelse=f):
            return f"({format_expr(c)} ? {format_expr(t)} : {format_expr(f)})"
        case Call(func=f, args=args):
            return f"{f}({', '.join(map(format_expr, args))})"
        case Cast(operand=x, dtype=t):
            return f"{t}({format_expr(x)})"
    raise AssertionError(f"unknown IR node {e!r}")


def format_statement(s: Statement) -> str:
    lhs = f"{s.tensor}({', '.join(s.lhs)})" if s.lhs else s.tensor
    op = "=" if s.reduction is None else ("+=" if s.reduction.value == "+" else
                                         "*=" if s.reduction.value == "*" else f"{s.reduction.value}=")
    bang = "!" if s.init else ""
    ranges = ", ".join(f"{r.name} in [{r.lo}, {r.hi})" for r in s.ranges)
    return f"{lhs} {op}{bang} {format_expr(s.rhs)}  for {ranges}" if ranges else \
        f"{lhs} {op}{bang} {format_expr(s.rhs)}"


def format_function(fn: Function) -> str:
    def sig(t):
        dims = ", ".join(str(d) for d in t.shape)
        return f"{t.dtype}({dims}) {t.name}" if t.shape else f"{t.dtype} {t.name}"

    lines = [f"func {fn.name}({', '.join(map(sig, fn.inputs))}) -> ({', '.join(map(sig, fn.outputs))})"]
    lines.append(f"  sizes: {', '.join(fn.sizes) or '-'}   context: {fn.context}")
    for cond in fn.preconditions:
        lines.append(f"  requires {cond}")
    for t in fn.temporaries:
        lines.append(f"  temporary {sig(t)}")
    for k, s in enumerate(fn.statements):
        lines.append(f"  S{k}: {format_statement(s)}")
    return "\n".join(lines)
