"""isl AST expressions -> LLVM values (i64; comparisons and logic give i1).

`isl_expr(builder, expr, lookup)` lowers one expression of an isl AST (loop bounds, guards,
statement arguments, buffer coordinates), ``lookup`` giving the value of each id (iterators,
sizes, block and thread indices); sums, differences and products of constants fold (the
iterators `lower.GroupWalker.walk_iterations` binds to constants). `id_names` lists the ids an
expression reads.
"""

from __future__ import annotations

from collections.abc import Callable

import islpy as isl
from llvmlite import ir

from ..errors import CodegenError
from .exprs import I64

__all__ = ["id_names", "isl_expr"]

_T = isl.ast_expr_op_type


def id_names(expr: isl.AstExpr) -> set[str]:
    """The names of the ids ``expr`` reads."""
    if expr.get_type() == isl.ast_expr_type.id:
        return {expr.get_id().get_name()}
    if expr.get_type() == isl.ast_expr_type.op:
        return set().union(*(id_names(expr.get_op_arg(i)) for i in range(expr.get_op_n_arg())))
    return set()


def _floordiv(b: ir.IRBuilder, a: ir.Value, d: ir.Value) -> ir.Value:
    q, r = b.sdiv(a, d), b.srem(a, d)
    zero = ir.Constant(a.type, 0)
    fix = b.and_(b.icmp_signed("!=", r, zero),
                 b.xor(b.icmp_signed("<", r, zero), b.icmp_signed("<", d, zero)))
    return b.sub(q, b.zext(fix, a.type))


def isl_expr(b: ir.IRBuilder, expr: isl.AstExpr, lookup: Callable[[str], ir.Value]) -> ir.Value:
    """An isl AST expression in i64 (comparisons and logic give i1)."""
    kind = expr.get_type()
    if kind == isl.ast_expr_type.int:
        return ir.Constant(I64, int(expr.get_val().to_python()))
    if kind == isl.ast_expr_type.id:
        return lookup(expr.get_id().get_name())
    op = expr.get_op_type()
    args = [isl_expr(b, expr.get_op_arg(i), lookup) for i in range(expr.get_op_n_arg())]
    if op in _FOLD and all(isinstance(a, ir.Constant) and a.type == I64 for a in args):
        # (iterators the walk binds to constants, `GroupWalker.walk_iterations`)
        value = _FOLD[op](*(int(a.constant) for a in args))
        return ir.Constant(I64, (value + 2**63) % 2**64 - 2**63)  # i64 wraps
    if op in _ISL_BINOPS:
        return getattr(b, _ISL_BINOPS[op])(*args)
    if op in _ISL_CMP:
        return b.icmp_signed(_ISL_CMP[op], *args)
    if op == _T.minus:
        return b.neg(args[0])
    if op == _T.fdiv_q:
        return _floordiv(b, *args)
    if op in (_T.min, _T.max):
        acc = args[0]
        for v in args[1:]:
            acc = b.select(b.icmp_signed("<" if op == _T.min else ">", acc, v), acc, v)
        return acc
    if op in (_T.select, _T.cond):
        return b.select(args[0], args[1], args[2])
    raise CodegenError(f"cannot lower isl AST expression {expr.to_C_str()} (op {op})")


_ISL_BINOPS = {
    _T.add: "add", _T.sub: "sub", _T.mul: "mul", _T.div: "sdiv", _T.pdiv_q: "sdiv",
    _T.pdiv_r: "srem", _T.zdiv_r: "srem", _T.and_: "and_", _T.and_then: "and_",
    _T.or_: "or_", _T.or_else: "or_",
}
_FOLD = {_T.add: lambda x, y: x + y, _T.sub: lambda x, y: x - y, _T.mul: lambda x, y: x * y}
_ISL_CMP = {_T.eq: "==", _T.le: "<=", _T.lt: "<", _T.ge: ">=", _T.gt: ">"}
