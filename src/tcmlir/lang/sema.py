"""Semantic analysis: one checked TC definition (AST) becomes a typed `ir.Function`.

Names are resolved (sizes, tensors, scalars, lets, index variables), every access is checked
(rank, read-only inputs, read before write, integer indices), expressions are typed
(`tcmlir.lang.sema_exprs`: TC's C-like promotion, explicit casts, lets shared, ``T.k``), and
range inference (`tcmlir.lang.ranges`) gives every index its range, every inferred tensor its
shape, and proves each affine access in bounds — or finds the sizes it needs (a precondition,
warned about with `PreconditionWarning`) — and that no statement depends on the order of its
own instances. Half-type ``+``/``*`` reductions are rewritten to accumulate in float32
(`tcmlir.lang.half_accumulate`). Documented limits: `MAX_RANK`, `MAX_STATEMENTS`,
`MAX_EXPR_NODES` and the parser's `MAX_DEPTH` (for the IR with lets substituted too).

Errors are `SemaError` / `InferenceError` located in the source given to `check_program`.
"""

from __future__ import annotations

import warnings

from .. import ir
from ..affine import is_isl_name, to_isl
from ..dtypes import DType, parse_dtype
from ..errors import PreconditionWarning, SemaError, Source, Span, format_located
from . import ast
from .half_accumulate import accumulate_halves_in_float32
from .printer import format_expr
from .ranges import Access, Bounds, RangeSolver
from .sema_exprs import ExprChecker, StmtState, TensorInfo, did_you_mean

__all__ = ["MAX_EXPR_NODES", "MAX_RANK", "MAX_STATEMENTS", "check_program"]

_REDUCTIONS = {"+=": ir.Reduction.ADD, "*=": ir.Reduction.MUL, "min=": ir.Reduction.MIN,
               "max=": ir.Reduction.MAX}


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
                               f"{', '.join(names) or 'nothing'}", did_you_mean(entry, names))
        definition = found
    return _Checker(definition, src).run()


#: Documented limits that answer at once instead of stalling isl (docs/language.md, "Limits"): the rank
#: of a tensor and the indices of one statement, and the statements of one definition.
MAX_RANK = 16
MAX_STATEMENTS = 1000

#: The most IR nodes a right-hand side may have once lets are substituted (each let is
#: built once and shared, but the code generators and the reference walk trees).
MAX_EXPR_NODES = 10_000


def _tree_size(e: ir.Expr, seen: dict[int, int]) -> int:
    """The number of nodes of ``e`` as a tree (shared sub-DAGs counted once per use)."""
    if id(e) not in seen:
        seen[id(e)] = 1 + sum(_tree_size(c, seen) for c in ir.children(e))
    return seen[id(e)]


def _reduction_order(indices: list[str], lhs: list[str], accesses: list[Access]) -> list[str]:
    """``indices`` with the reduction indices ordered by their first use in a tensor access
    (then the others, as they came): the loop order of the polyhedral model. A guard written
    first (``(h + kh >= 1 && ...) ? I(n, c, h + kh - 1, ...) * W(f, c, kh, kw) : 0``) thus
    does not put the window loops outside the channel loop, which would make the input tile
    of one reduction step all channels' (too large for shared memory)."""
    first: dict[str, int] = {}
    for access in accesses:
        for arg in access.args:
            for x in ir.walk(arg):
                if isinstance(x, ir.Index) and x.name not in first:
                    first[x.name] = len(first)
    reduction = [v for v in indices if v not in lhs]
    reduction.sort(key=lambda v: first.get(v, len(first)))
    return [v for v in indices if v in lhs] + reduction


def _user_stacklevel() -> int:
    """The `warnings.warn` stacklevel of the first caller outside the tcmlir package."""
    import os
    import sys

    package = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    frame, level = sys._getframe(1), 1
    while frame is not None and os.path.abspath(frame.f_code.co_filename).startswith(package):
        frame, level = frame.f_back, level + 1
    return level


class _Checker(ExprChecker):
    def __init__(self, d: ast.Def, source: Source):
        self.d = d
        self.source = source
        self.sizes: list[str] = []
        self.tensors: dict[str, TensorInfo] = {}
        self.stmt: StmtState | None = None
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
        self.tensors[p.name.name] = TensorInfo(p.name.name, role, dtype, shape, p.name.span, p.dims)

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

        def final(t: TensorInfo) -> ir.Tensor:
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
            target = TensorInfo(name, ir.Role.TEMP, None, None, s.tensor.span)
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
        st = self.stmt = StmtState(tuple(lhs), lets, list(lhs), {i.name: i.span for i in s.indices})
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
        st.indices = _reduction_order(st.indices, lhs, st.accesses)
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

    def _bound(self, e: ast.Expr, v: str) -> str:
        value, _ = self.expr(e, "bound")
        text = to_isl(value) if value.dtype.is_int else None
        if text is None:
            raise self.err(e, f"the range of {v} must be an integer expression affine in the "
                           f"sizes, found `{format_expr(e)}`")
        return text
