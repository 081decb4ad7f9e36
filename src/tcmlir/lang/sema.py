"""Semantic analysis: one checked TC definition (AST) becomes a typed `ir.Function`.

Names are resolved (sizes, tensors, scalars, lets, index variables), every access is checked
(rank, read-only inputs, read before write, integer and affine indices), expressions are typed
with TC's C-like promotion (literals are weakly typed) and casts are made explicit, lets and
``T.k`` are substituted, and range inference (`tcmlir.lang.ranges`) gives every index its range,
every inferred tensor its shape, and proves each affine access in bounds.

Errors are `SemaError` / `InferenceError` located in the source given to `check_program`.
"""

from __future__ import annotations

import difflib
import warnings
from dataclasses import dataclass, field

from .. import ir
from ..affine import condition_to_isl, const_value, is_isl_name, pw_aff_to_expr, to_isl
from ..dtypes import DType, parse_dtype, promote
from ..errors import PreconditionWarning, SemaError, Source, Span, format_located
from ..reference_builtins import saturating_int
from . import ast
from .half_accumulate import accumulate_halves_in_float32
from .parser import MAX_DEPTH
from .printer import format_expr
from .ranges import Access, Bounds, RangeSolver

__all__ = ["MAX_EXPR_NODES", "MAX_RANK", "MAX_STATEMENTS", "check_program"]

_REDUCTIONS = {"+=": ir.Reduction.ADD, "*=": ir.Reduction.MUL, "min=": ir.Reduction.MIN,
               "max=": ir.Reduction.MAX}
_ARITH = ("+", "-", "*", "/", "%")
_COMPARE = ("<", "<=", ">", ">=", "==", "!=")
_I32 = DType.INT32


def check_program(program: ast.Program, entry: str | None = None, *,
                  source: Source | None = None) -> ir.Function:
    """Check the definition ``entry`` (optional when there is one) and build its TC IR."""
    src = source if source is not None else Source("", "<string>")
    names = [d.name.name for d in program.defs]
    if entry is None:
        if len(program.defs) != 1:
            raise SemaError.at(src, None, f"the source defines {len(names)} functions "
                               f"({', '.join(names)}); name the one to use",
                               f"pass name= (the CLIs: --name), one of: {', '.join(names)}")
        definition = program.defs[0]
    else:
        found = program.get(entry)
        if found is None:
            raise SemaError.at(src, None, f"no definition named {entry!r}; the source defines "
                               f"{', '.join(names) or 'nothing'}", _did_you_mean(entry, names))
        definition = found
    return _Checker(definition, src).run()


#: Documented limits that answer at once instead of stalling isl (README "Limits"): the rank
#: of a tensor and the indices of one statement, and the statements of one definition.
MAX_RANK = 16
MAX_STATEMENTS = 200

#: The most IR nodes a right-hand side may have once lets are substituted (each let is
#: built once and shared, but the code generators and the reference walk trees).
MAX_EXPR_NODES = 10_000


def _tree_size(e: ir.Expr, seen: dict[int, int]) -> int:
    """The number of nodes of ``e`` as a tree (shared sub-DAGs counted once per use)."""
    if id(e) not in seen:
        seen[id(e)] = 1 + sum(_tree_size(c, seen) for c in ir.children(e))
    return seen[id(e)]


def _user_stacklevel() -> int:
    """The `warnings.warn` stacklevel of the first caller outside the tcmlir package."""
    import os
    import sys

    package = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    frame, level = sys._getframe(1), 1
    while frame is not None and os.path.abspath(frame.f_code.co_filename).startswith(package):
        frame, level = frame.f_back, level + 1
    return level


def _did_you_mean(name: str, candidates) -> str | None:
    close = difflib.get_close_matches(name, list(candidates), n=1)
    return f"did you mean `{close[0]}`?" if close else None


@dataclass
class _Tensor:
    name: str
    role: ir.Role
    dtype: DType | None
    shape: tuple[ir.SizeExpr, ...] | None
    span: Span | None
    dims: tuple[ast.Ident | ast.IntLit, ...] | None = None
    written: bool = False


@dataclass
class _Stmt:
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


class _Checker:
    def __init__(self, d: ast.Def, source: Source):
        self.d = d
        self.source = source
        self.sizes: list[str] = []
        self.tensors: dict[str, _Tensor] = {}
        self.stmt: _Stmt | None = None
        self.depth = 0  # of the IR being built (lets substituted)

    def err(self, node, what: str, fix: str | None = None) -> SemaError:
        span = node if isinstance(node, Span) or node is None else node.span
        return SemaError.at(self.source, span, what, fix)

    # ------------------------------------------------------------ signature

    def _check_name(self, ident: ast.Ident, what: str) -> None:
        n = ident.name
        if n in self.tensors:
            raise self.err(ident, f"{what} {n} is already a tensor name", "give it another name")
        if n in self.sizes:
            raise self.err(ident, f"{what} {n} is already a size name", "give it another name")
        if n in ast.BUILTINS and what != "size":  # `y0(i)` would be a call, `y0` alone is not
            raise self.err(ident, f"{what} {n} has the name of a built-in function",
                           "give it another name")
        if not is_isl_name(n):
            raise self.err(ident, f"{n} is a reserved word and cannot name a {what}")

    def _param(self, p: ast.Param, role: ir.Role) -> None:
        what = "tensor" if role is ir.Role.INPUT else "output"
        self._check_name(p.name, what)
        dtype = None
        if p.dtype is not None:
            dtype = parse_dtype(p.dtype)
            if dtype is None:
                raise self.err(p, f"unknown type {p.dtype}")
        shape = None
        if p.dims is not None and len(p.dims) > MAX_RANK:
            raise self.err(p, f"{p.name.name} has rank {len(p.dims)}; tcmlir supports at most "
                           f"{MAX_RANK} dimensions", "reshape it to fewer dimensions")
        if p.dims is not None:
            dims = []
            for dim in p.dims:
                if isinstance(dim, ast.IntLit):
                    if dim.value < 1:
                        raise self.err(dim, f"a dimension must be >= 1, found {dim.value}")
                    dims.append(ir.SizeExpr.constant(dim.value))
                    continue
                if dim.name not in self.sizes:
                    if role is ir.Role.OUTPUT:
                        raise self.err(dim, f"size {dim.name} of output {p.name.name} is not a "
                                       "size of any input", "use a size name of an input")
                    self._check_name(dim, "size")
                    self.sizes.append(dim.name)
                dims.append(ir.SizeExpr.param(dim.name))
            shape = tuple(dims)
        self.tensors[p.name.name] = _Tensor(p.name.name, role, dtype, shape, p.name.span, p.dims)

    # ------------------------------------------------------------ driver

    def run(self) -> ir.Function:
        d = self.d
        if len(d.body) > MAX_STATEMENTS:
            raise self.err(d.name, f"{d.name.name} has {len(d.body)} statements; tcmlir "
                           f"compiles at most {MAX_STATEMENTS} per definition",
                           "split it into several definitions")
        for p in d.params:
            self._param(p, ir.Role.INPUT)
        for p in d.returns:
            self._param(p, ir.Role.OUTPUT)
        self.written_later = {s.tensor.name for s in d.body}
        reserved = [*self.tensors, *(i.name for s in d.body for i in s.indices)]
        self.solver = RangeSolver(self.sizes, reserved, self.source)
        for t in self.tensors.values():
            t.written = t.role is ir.Role.INPUT
        done = [self._statement(s) for s in d.body]
        for p in d.returns:
            if not self.tensors[p.name.name].written:
                raise self.err(p.name, f"output {p.name.name} is never written",
                               f"add a statement `{p.name.name}(...) = ...`")
        shapes = {t.name: t.shape for t in self.tensors.values()}
        statements = []
        preconditions: list[str] = []
        for name, stmt, ranges, accesses, op, rhs in done:
            self.solver.check_order_independent(ranges, accesses, name,
                                                [i.name for i in stmt.indices], op != "=")
            for pre in self.solver.check_bounds(ranges, accesses, shapes):
                preconditions.append(pre.condition)
                if not pre.warn:
                    continue
                warnings.warn(PreconditionWarning(format_located(
                    self.source, pre.span, f"{pre.access} stays in bounds only when the sizes "
                    f"satisfy {pre.condition}; tcmlir requires {pre.condition} of every call",
                    kind="warning")), stacklevel=_user_stacklevel())
            irr = tuple(ir.IndexRange(v, self.solver.size_expr(lo), self.solver.size_expr(hi))
                        for v, (lo, hi) in ranges.items())
            red = _REDUCTIONS.get(op)
            statements.append(ir.Statement(name, tuple(i.name for i in stmt.indices), red,
                                           stmt.init, rhs, irr, span=stmt.span))

        def final(t: _Tensor) -> ir.Tensor:
            assert t.dtype is not None and t.shape is not None
            shape = t.shape if t.role is ir.Role.INPUT else \
                tuple(self.solver.size_expr(self.solver.pw_aff(s)) for s in t.shape)
            return ir.Tensor(t.name, t.dtype, shape, t.role, span=t.span)

        by_role = {r: tuple(final(t) for t in self.tensors.values() if t.role is r) for r in ir.Role}
        everything = {t.name: t for ts in by_role.values() for t in ts}
        reserved = [*self.sizes, *(i.name for s in d.body for i in s.indices)]
        statements, accumulators = accumulate_halves_in_float32(statements, everything, reserved)
        by_role[ir.Role.TEMP] += tuple(accumulators)
        return ir.Function(d.name.name, tuple(self.sizes), self.solver.context_text(),
                           by_role[ir.Role.INPUT], by_role[ir.Role.OUTPUT], by_role[ir.Role.TEMP],
                           tuple(statements), source=self.source,
                           preconditions=tuple(preconditions))

    # ------------------------------------------------------------ statements

    def _statement(self, s: ast.Stmt):
        name = s.tensor.name
        target = self.tensors.get(name)
        if name in self.sizes:
            raise self.err(s.tensor, f"{name} is a size, not a tensor; it cannot be written")
        if target is not None and target.role is ir.Role.INPUT:
            raise self.err(s.tensor, f"cannot write {name}: inputs are read-only",
                           "write to an output or a new temporary tensor instead")
        if target is None:
            self._check_name(s.tensor, "tensor")
            target = _Tensor(name, ir.Role.TEMP, None, None, s.tensor.span)
            self.tensors[name] = target
        if not target.written and s.op != "=" and not s.init and target.role is ir.Role.TEMP:
            raise self.err(s, f"temporary {name} is accumulated into before it is initialised",
                           f"use `{s.op}!` to start from the reduction's identity")
        lhs: list[str] = []
        for ident in s.indices:
            if ident.name in self.sizes or ident.name in self.tensors:
                raise self.err(ident, f"{ident.name} is not an index variable: the left-hand "
                               "side takes distinct index variables")
            if ident.name in lhs:
                raise self.err(ident, f"index {ident.name} appears twice on the left-hand side")
            if not is_isl_name(ident.name):
                raise self.err(ident, f"{ident.name} is a reserved word and cannot name an index")
            lhs.append(ident.name)
        lets: dict[str, tuple[int, ast.Let]] = {}
        for pos, clause in enumerate(s.where):
            if isinstance(clause, ast.Let):
                n = clause.name.name
                if n in self.sizes or n in self.tensors or n in lhs or n in lets:
                    raise self.err(clause.name, f"let {n} reuses a name already in scope",
                                   "give it another name")
                lets[n] = (pos, clause)
        st = self.stmt = _Stmt(tuple(lhs), lets, list(lhs), {i.name: i.span for i in s.indices})
        rhs, _ = self.expr(s.rhs, "value")
        size = _tree_size(rhs, {})
        if size > MAX_EXPR_NODES:
            raise self.err(s.rhs, f"the right-hand side has {size} nodes once lets are "
                           f"substituted (at most {MAX_EXPR_NODES})",
                           "compute the repeated parts into intermediate tensors")
        used_lets = set(st.used_lets)
        explicit: dict[str, Bounds] = {}
        for pos, clause in enumerate(s.where):
            st.let_limit = pos
            if isinstance(clause, ast.RangeConstraint):
                v = clause.index.name
                if v in self.sizes or v in self.tensors or v in lets:
                    raise self.err(clause.index, f"{v} is not an index variable")
                if v in explicit:
                    raise self.err(clause.index, f"index {v} has two ranges")
                self._index(clause.index)
                lo, hi = (self._bound(b, v) for b in (clause.lo, clause.hi))
                explicit[v] = (self.solver.pw_aff(lo), self.solver.pw_aff(hi))
            elif isinstance(clause, ast.Exists):
                st.exists = True
                self.expr(clause.expr, "value")
                st.exists = False
            elif clause.name.name not in used_lets:  # an unused let: checked, then forgotten
                saved = (list(st.indices), dict(st.first_use), list(st.accesses))
                self.expr(clause.value, "value")
                st.indices, st.first_use, st.accesses = saved
        st.let_limit = 1 << 30
        if len(st.indices) > MAX_RANK:
            raise self.err(s, f"the statement has {len(st.indices)} indices; tcmlir supports "
                           f"at most {MAX_RANK} per statement", "split it into several statements")
        reduction = [v for v in st.indices if v not in lhs]
        if reduction and s.op == "=":
            v = reduction[0]
            raise self.err(st.first_use[v], f"index {v} appears only on the right-hand side; "
                           "use a reduction such as +=!", f"write `{name}(...) +=! ...` "
                           f"or add {v} to the left-hand side")
        if target.shape is not None and len(target.shape) != len(lhs):
            raise self.err(s.tensor, f"{name} has rank {len(target.shape)} but is written with "
                           f"{len(lhs)} {'index' if len(lhs) == 1 else 'indices'}")
        lhs_args = tuple(ir.Index(i.name, span=i.span) for i in s.indices)
        text = f"{name}({', '.join(lhs)})" if lhs else name
        st.accesses.append(Access(name, lhs_args, "write", s.tensor.span, text))
        shapes = {t.name: t.shape for t in self.tensors.values()}
        ranges = self.solver.infer(st.indices, explicit, st.accesses, shapes, st.first_use)
        if target.shape is None:
            dims = []
            for d, v in enumerate(lhs):
                hi = ranges[v][1]
                self.solver.require_positive(hi, s.tensor.span, f"the size of {name}'s dimension {d}")
                dims.append(self.solver.size_expr(hi))
            target.shape = tuple(dims)
        if target.dtype is None:
            target.dtype = self._inferred_storage(rhs)
        rhs = self._coerce(rhs, target.dtype.compute)
        target.written = True
        self.stmt = None
        return name, s, ranges, tuple(st.accesses), s.op, rhs

    def _inferred_storage(self, rhs: ir.Expr) -> DType:
        """The type of an unannotated tensor: the rhs's, except that arithmetic on half types
        (computed in float32) stores back in that half type when every float tensor read is
        of it, as in CUDA and PyTorch (``O(i) = A(i) * B(i)`` on float16 gives float16)."""
        if rhs.dtype is not DType.FLOAT32:
            return rhs.dtype
        stored = {self.tensors[e.tensor].dtype for e in ir.walk(rhs)
                  if isinstance(e, ir.Read) and e.dtype.is_float and e.tensor in self.tensors}
        if len(stored) == 1 and next(iter(stored)) in (DType.FLOAT16, DType.BFLOAT16):
            return next(iter(stored))
        return rhs.dtype

    def _index(self, ident: ast.Ident) -> ir.Index:
        st = self.stmt
        assert st is not None
        if ident.name not in st.indices:
            if not is_isl_name(ident.name):
                raise self.err(ident, f"{ident.name} is a reserved word and cannot name an index")
            st.indices.append(ident.name)
            st.first_use[ident.name] = ident.span
        return ir.Index(ident.name, span=ident.span)

    def _bound(self, e: ast.Expr, v: str) -> str:
        value, _ = self.expr(e, "bound")
        text = to_isl(value) if value.dtype.is_int else None
        if text is None:
            raise self.err(e, f"the range of {v} must be an integer expression affine in the "
                           f"sizes, found `{format_expr(e)}`")
        return text

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
                import numpy as np

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
            raise self.err(e, f"unknown function {e.func}", _did_you_mean(e.func, ast.BUILTINS))
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
                           "constants", _did_you_mean(n, self.sizes))
        return self._index(e), False

    def _readable(self, ident: ast.Ident) -> _Tensor:
        t = self.tensors[ident.name]
        if not t.written:
            raise self.err(ident, f"{ident.name} is read before any statement writes it",
                           f"write {ident.name} in an earlier statement")
        return t

    def _read(self, t: _Tensor, args: tuple[ir.Expr, ...], node) -> ir.Read:
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
            cands = [*self.tensors, *ast.BUILTINS]
            what = "function" if difflib.get_close_matches(n, list(ast.BUILTINS), n=1) and not \
                difflib.get_close_matches(n, list(self.tensors), n=1) else "tensor"
            raise self.err(e.tensor, f"unknown {what} {n}", _did_you_mean(n, cands))
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
            raise self.err(e.tensor, f"unknown tensor {n}", _did_you_mean(n, self.tensors))
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
