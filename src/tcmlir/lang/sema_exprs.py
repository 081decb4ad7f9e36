"""Typing the expressions of a statement (part of semantic analysis, `tcmlir.lang.sema`).

`ExprChecker` is the half of sema's checker that turns AST expressions into typed IR: names
(sizes, tensors, scalars, lets, indices), accesses and their recorded `Access`es (with the
``?:`` guards they are under), TC's C-like promotion with weakly typed literals, explicit
casts, built-ins, ``T.k``. Lets are built once per context and shared (the IR is a DAG).
"""

from __future__ import annotations

import difflib
from dataclasses import dataclass, field

import numpy as np

from .. import ir
from ..affine import condition_to_isl, const_value, is_isl_name, pw_aff_to_expr, to_isl
from ..dtypes import DType, parse_dtype, promote
from ..errors import Span
from ..reference_builtins import saturating_int
from . import ast
from .lexer import TYPE_NAMES
from .parser import MAX_DEPTH, did_you_mean
from .printer import format_expr
from .ranges import Access

__all__ = ["NOT_BUILTINS", "ExprChecker", "StmtState", "TensorInfo", "did_you_mean",
           "unknown_callable"]

_ARITH = ("+", "-", "*", "/", "%")
_COMPARE = ("<", "<=", ">", ">=", "==", "!=")
_I32 = DType.INT32


# Functions users reach for that TC does not have, and how to write them in TC instead.
NOT_BUILTINS = {
    "sigmoid": "1 / (1 + exp(-x))", "relu": "fmax(x, 0)", "abs": "fabs(x)",
    "silu": "x / (1 + exp(-x))", "softplus": "log1p(exp(x))", "square": "x * x",
    "gelu": "0.5 * x * (1 + erf(x * 0.70710678))", "clamp": "fmin(fmax(x, lo), hi)",
}


def unknown_callable(name: str, tensors) -> tuple[str, str]:
    """The message and fix for ``name(...)`` where ``name`` is no tensor: the closest tensor,
    built-in, type (a cast) or common function TC lacks (with how to write it), else the
    lists of tensors and built-ins."""
    if name in NOT_BUILTINS:
        return (f"{name} is not a TC built-in function",
                f"write {NOT_BUILTINS[name]}; the built-ins are {', '.join(sorted(ast.BUILTINS))}")
    tensors = list(tensors)
    close = difflib.get_close_matches(name, [*tensors, *ast.BUILTINS, *TYPE_NAMES, *NOT_BUILTINS],
                                      n=1)
    best = close[0] if close else None
    if best in NOT_BUILTINS:
        return (f"unknown function {name}", f"did you mean `{best}`? TC has no {best} built-in: "
                f"write {NOT_BUILTINS[best]}")
    if best in TYPE_NAMES:
        return f"unknown function or type {name}", f"did you mean the cast `{best}(...)`?"
    if best is not None:
        return (f"unknown {'tensor' if best in tensors else 'function'} {name}",
                f"did you mean `{best}`?")
    fix = f"the tensors here are {', '.join(tensors) or 'none'}"
    if name.islower() and len(name) > 2:  # looks like a function name (tensors: `A`, `W1`)
        return (f"unknown tensor or function {name}",
                f"{fix}; the built-in functions are {', '.join(sorted(ast.BUILTINS))}")
    return f"unknown tensor {name}", fix


@dataclass
class TensorInfo:
    name: str
    role: ir.Role
    dtype: DType | None
    shape: tuple[ir.SizeExpr, ...] | None
    span: Span | None
    dims: tuple[ast.Ident | ast.IntLit, ...] | None = None
    written: bool = False


@dataclass
class StmtState:
    """Per-statement state while lowering."""

    lhs: tuple[str, ...]
    lets: dict[str, tuple[int, ast.Let]]
    indices: list[str] = field(default_factory=list)
    first_use: dict[str, Span | None] = field(default_factory=dict)
    accesses: list[Access] = field(default_factory=list)
    let_limit: int = 1 << 30
    let_stack: tuple[str, ...] = ()
    used_lets: set[str] = field(default_factory=set)
    exists: bool = False
    let_memo: dict[tuple, tuple[ir.Expr, bool]] = field(default_factory=dict)
    guards: list[str] = field(default_factory=list)  # isl conditions of the enclosing ?: arms
    guard_exprs: list[ir.Expr] = field(default_factory=list)  # the conditions they come from


class ExprChecker:
    """Expression typing; mixed into sema's checker, which owns the attributes used here."""

    stmt: StmtState | None
    sizes: list[str]
    tensors: dict[str, TensorInfo]
    depth: int

    def _index(self, ident: ast.Ident) -> ir.Index:
        st = self.stmt
        assert st is not None
        if ident.name not in st.indices:
            if not is_isl_name(ident.name):
                raise self.err(ident, f"{ident.name} is a reserved word and cannot name an index")
            st.indices.append(ident.name)
            st.first_use[ident.name] = ident.span
        return ir.Index(ident.name, span=ident.span)

    # ------------------------------------------------------------ expressions

    def expr(self, e: ast.Expr, mode: str) -> tuple[ir.Expr, bool]:
        """The typed IR of ``e`` and whether it is a weakly typed literal expression.

        ``mode``: "value", "index" (inside tensor arguments) or "bound" (sizes only).
        The IR may nest no deeper than `MAX_DEPTH` once lets are substituted (each let is
        within the parser's limit, a chain of them need not be).
        """
        self.depth += 1
        try:
            if self.depth > MAX_DEPTH:
                raise self.err(e, f"expression nested too deeply once lets are substituted "
                               f"(more than {MAX_DEPTH} levels)",
                               "compute part of it into an intermediate tensor")
            return self._expr(e, mode)
        finally:
            self.depth -= 1

    def _expr(self, e: ast.Expr, mode: str) -> tuple[ir.Expr, bool]:
        match e:
            case ast.IntLit(value=v):
                if not -(2**63) <= v < 2**63:
                    raise self.err(e, f"integer literal {v} does not fit in 64 bits")
                return ir.Const(v, _I32 if -(2**31) <= v < 2**31 else DType.INT64, span=e.span), True
            case ast.FloatLit(value=v):
                return ir.Const(v, DType.FLOAT32, span=e.span), True
            case ast.BoolLit(value=v):
                return ir.Const(v, DType.BOOL, span=e.span), False
            case ast.Ident():
                return self._ident(e, mode)
            case ast.DimRef():
                return self._dimref(e), False
            case ast.Access():
                return self._access(e, mode), False
            case ast.Cast(dtype=name, operand=x):
                t = parse_dtype(name)
                if t is None:
                    raise self.err(e, f"unknown type {name}")
                inner, _ = self.expr(x, mode)
                return self._coerce(inner, t.compute, e.span), False
            case ast.Unary(op="!", operand=x):
                inner, _ = self.expr(x, mode)
                return ir.Unary("!", self._truth(inner), DType.BOOL, span=e.span), False
            case ast.Unary(op="-", operand=x):
                inner, weak = self.expr(x, mode)
                if inner.dtype is DType.BOOL:
                    inner = self._coerce(inner, _I32)
                if isinstance(inner, ir.Const):
                    return ir.Const(-inner.value, inner.dtype, span=e.span), weak
                return ir.Unary("-", inner, inner.dtype, span=e.span), weak
            case ast.Binary(op=op, lhs=a, rhs=b) if op in ("&&", "||"):
                la, _ = self.expr(a, mode)
                lb, _ = self.expr(b, mode)
                return ir.Binary(op, self._truth(la), self._truth(lb), DType.BOOL, span=e.span), False
            case ast.Binary(op=op, lhs=a, rhs=b):
                la, lb, t, weak = self._unify(a, b, mode, arith=op in _ARITH)
                if op in _COMPARE:
                    return ir.Binary(op, la, lb, DType.BOOL, span=e.span), False
                if op == "%" and t.is_float:
                    raise self.err(self._op_span(e), f"% needs integer operands, found {t}", "use fmod(a, b)")
                if mode != "value" and t.is_int and op in ("/", "%"):  # floor, as isl does
                    op = "floordiv" if op == "/" else "floormod"
                return ir.Binary(op, la, lb, t, span=e.span), weak
            case ast.Ternary(cond=c, then=a, orelse=b):
                cond, _ = self.expr(c, mode)
                cond = self._truth(cond)
                la, wa = self._guarded(a, mode, cond, condition_to_isl(cond, True))
                lb, wb = self._guarded(b, mode, cond, condition_to_isl(cond, False))
                t = _common(la.dtype, wa, lb.dtype, wb)
                return ir.Select(cond, self._coerce(la, t), self._coerce(lb, t), t,
                                 span=e.span), wa and wb
            case ast.Call():
                return self._call(e, mode)
        raise self.err(e, f"unsupported expression {type(e).__name__}")  # pragma: no cover

    def _guarded(self, e: ast.Expr, mode: str, cond: ir.Expr,
                 guard: str | None) -> tuple[ir.Expr, bool]:
        """``expr(e)`` with the accesses in ``e`` known to happen only where ``guard`` (the
        affine part of ``cond`` or of its negation) holds."""
        st = self.stmt
        if st is None or guard is None:
            return self.expr(e, mode)
        st.guards.append(guard)
        st.guard_exprs.append(cond)
        try:
            return self.expr(e, mode)
        finally:
            st.guards.pop()
            st.guard_exprs.pop()

    def _op_span(self, e: ast.Binary) -> Span:
        """The span of a binary operator itself (found in the source text), else of ``e``."""
        text = self.source.text
        at = text.find(e.op, e.lhs.span.end, e.rhs.span.start) if text else -1
        return self.source.span(at, at + len(e.op)) if at >= 0 else e.span

    def _unify(self, a: ast.Expr, b: ast.Expr, mode: str, arith: bool):
        la, wa = self.expr(a, mode)
        lb, wb = self.expr(b, mode)
        t = _common(la.dtype, wa, lb.dtype, wb)
        if arith and t is DType.BOOL:
            t = _I32
        return self._coerce(la, t), self._coerce(lb, t), t, wa and wb

    def _coerce(self, x: ir.Expr, t: DType, span: Span | None = None) -> ir.Expr:
        if x.dtype is t:
            return x
        if isinstance(x, ir.Const):
            v = x.value
            if t.is_float:
                value: int | float | bool = float(v)
            elif t is DType.BOOL:
                value = bool(v)
            else:  # saturating, as at run time
                value = int(saturating_int(np.float64(v), t.numpy)) if isinstance(v, float) \
                    else int(np.asarray(int(v), dtype=np.int64).astype(t.numpy))  # wraps
            return ir.Const(value, t, span=span or x.span)
        return ir.Cast(x, t, span=span or x.span)

    def _truth(self, x: ir.Expr) -> ir.Expr:
        if x.dtype is DType.BOOL:
            return x
        return ir.Binary("!=", x, ir.Const(0.0 if x.dtype.is_float else 0, x.dtype), DType.BOOL,
                         span=x.span)

    def _call(self, e: ast.Call, mode: str) -> tuple[ir.Expr, bool]:
        if e.func not in ast.BUILTINS:
            raise self.err(e, *unknown_callable(e.func, self.tensors))
        if len(e.args) != ast.BUILTINS[e.func]:
            raise self.err(e, f"{e.func} takes {ast.BUILTINS[e.func]} arguments, "
                           f"found {len(e.args)}")
        if e.func in ("min", "max"):
            la, lb, t, weak = self._unify(e.args[0], e.args[1], mode, arith=True)
            return ir.Binary(e.func, la, lb, t, span=e.span), weak
        args = [self.expr(a, mode) for a in e.args]
        t = DType.FLOAT64 if any(x.dtype is DType.FLOAT64 and not w for x, w in args) \
            else DType.FLOAT32
        return ir.Call(e.func, tuple(self._coerce(x, t) for x, _ in args), t, span=e.span), False

    def _ident(self, e: ast.Ident, mode: str) -> tuple[ir.Expr, bool]:
        st, n = self.stmt, e.name
        if st is not None and n in st.lets:
            pos, let = st.lets[n]
            if pos >= st.let_limit or n in st.let_stack:
                raise self.err(e, f"let {n} is used before its definition")
            st.used_lets.add(n)
            # one IR per let and context, shared by every use: the IR is a DAG, and sema
            # (accesses, ranges, bounds) sees each let once however often it is used
            key = (n, mode, st.exists, tuple(st.guards))
            if key in st.let_memo:
                return st.let_memo[key]
            saved = (st.let_limit, st.let_stack)
            st.let_limit, st.let_stack = pos, (*st.let_stack, n)
            try:
                st.let_memo[key] = self.expr(let.value, mode)
                return st.let_memo[key]
            finally:
                st.let_limit, st.let_stack = saved
        if n in self.sizes:
            return ir.Size(n, span=e.span), False
        if n in self.tensors:
            t = self._readable(e)
            if t.shape:
                raise self.err(e, f"{n} is a tensor of rank {len(t.shape)}; it needs "
                               f"{len(t.shape)} {'index' if len(t.shape) == 1 else 'indices'}")
            return self._read(t, (), e), False
        if n in self.written_later:
            raise self.err(e, f"{n} is read before any statement writes it",
                           f"write {n} in an earlier statement")
        if mode == "bound" or st is None:
            raise self.err(e, f"unknown name {n}: a range bound may only use sizes and "
                           "constants", did_you_mean(n, self.sizes))
        return self._index(e), False

    def _readable(self, ident: ast.Ident) -> TensorInfo:
        t = self.tensors[ident.name]
        if not t.written:
            raise self.err(ident, f"{ident.name} is read before any statement writes it",
                           f"write {ident.name} in an earlier statement")
        return t

    def _read(self, t: TensorInfo, args: tuple[ir.Expr, ...], node) -> ir.Read:
        assert t.dtype is not None and self.stmt is not None
        text = format_expr(node)
        kind = "exists" if self.stmt.exists else "read"
        guard = " and ".join(self.stmt.guards) or None
        self.stmt.accesses.append(Access(t.name, args, kind, node.span, text, guard,
                                         tuple(self.stmt.guard_exprs)))
        return ir.Read(t.name, args, t.dtype.compute, span=node.span)

    def _access(self, e: ast.Access, mode: str) -> ir.Expr:
        n = e.tensor.name
        if n in self.sizes:
            raise self.err(e.tensor, f"{n} is a size, not a tensor")
        if n not in self.tensors:
            if n in self.written_later:
                raise self.err(e.tensor, f"{n} is read before any statement writes it",
                               f"write {n} in an earlier statement")
            raise self.err(e.tensor, *unknown_callable(n, self.tensors))
        if mode == "bound" or self.stmt is None:
            raise self.err(e, "a range bound may only use sizes and constants, not tensor reads")
        t = self._readable(e.tensor)
        assert t.shape is not None
        if len(e.indices) != len(t.shape):
            raise self.err(e, f"{n} has rank {len(t.shape)} but is accessed with "
                           f"{len(e.indices)} {'index' if len(e.indices) == 1 else 'indices'}")
        args = []
        for a in e.indices:
            x, _ = self.expr(a, "index")
            if not x.dtype.is_int:
                raise self.err(a, f"index of {n} must be an integer, found {x.dtype}")
            if to_isl(x) is None:  # a gather or non-affine: a may-access checked at run time
                divs = [y for y in ir.walk(x) if isinstance(y, ir.Binary)
                        and y.op in ("floordiv", "floormod")]
                if any((c := const_value(y.rhs)) is not None and c <= 0 for y in divs):
                    raise self.err(a, f"a division in an index of {n} needs a positive "
                                   "divisor")
            args.append(x)
        return self._read(t, tuple(args), e)

    def _dimref(self, e: ast.DimRef) -> ir.Expr:
        n = e.tensor.name
        if n not in self.tensors:
            raise self.err(e.tensor, f"unknown tensor {n}", did_you_mean(n, self.tensors))
        t = self.tensors[n]
        if t.shape is None:
            raise self.err(e, f"the shape of {n} is not known here: it is inferred by a "
                           "later statement")
        if not 0 <= e.dim < len(t.shape):
            raise self.err(e, f"{n} has rank {len(t.shape)}; dimension {e.dim} does not exist",
                           f"dimensions of {n} are numbered 0 to {len(t.shape) - 1}"
                           if t.shape else f"{n} is a scalar")
        if t.dims is not None:
            dim = t.dims[e.dim]
            if isinstance(dim, ast.IntLit):
                return ir.Const(dim.value, _I32, span=e.span)
            return ir.Size(dim.name, span=e.span)
        value = pw_aff_to_expr(self.solver.pw_aff(t.shape[e.dim]))
        if value is None:
            raise self.err(e, f"{n}.{e.dim} is a piecewise size ({t.shape[e.dim]}); it cannot "
                           "be used as a value", "name the size with an annotated output")
        return value


def _common(ta: DType, wa: bool, tb: DType, wb: bool) -> DType:
    """The operand type of a binary op; a weak (literal) side adapts to the other side."""
    if wa == wb:
        return promote(ta, tb)
    lit, other = (ta, tb) if wa else (tb, ta)
    if lit.is_float:
        return other if other.is_float else DType.FLOAT32
    if other is DType.BOOL or lit is DType.INT64:
        return promote(lit, other)
    return other
