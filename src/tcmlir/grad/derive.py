"""Reverse-mode differentiation of a TC definition into a new TC definition.

`derive(fn, wrt)` takes a checked `ir.Function` and returns a `GradProgram`: the TC source of a
definition ``<name>_grad(<inputs>, <one gradient per output>) -> (<one gradient per input in
wrt>)``. It is ordinary TC, so it is defined, compiled, tuned and cached like any other.

How the program is made:

1. **Versions.** Statements that rewrite a tensor (``O = O + B`` after ``O +=! ...``) make a new
   version, named ``O_v1`` ...; each read names the version it sees. A partial rewrite or a
   ``+=`` onto an earlier version first copies the old version. Versions that depend on no
   input in ``wrt`` are inactive.
2. **Forward recomputation.** The renamed forward statements that the adjoints read are
   recomputed at the top of the gradient program (dead ones are dropped): nothing is saved
   between the calls.
3. **Adjoints, statements in reverse.** For a statement writing version ``W`` with gradient
   ``dW``: the adjoint of its right-hand side is ``dW(lhs)`` (``=`` and ``+=!``: a reduction's
   gradient is broadcast over the reduced indices), or for ``max=!``/``min=!`` ``dW(lhs)`` at the
   first arg-extremum only (found by one ``min=!`` statement per reduced index, lexicographically)
   and 0 elsewhere. `rules.backprop` pushes it through the expression; each active read's
   adjoint becomes a ``+=`` statement into the read version's gradient, its index map inverted
   by `indexing.invert_read` (indices only on the right become reductions). Gradients of
   outputs that later statements also read add the incoming gradient to theirs.

Refused, with a `GradError` naming the input and the reason (at definition time): gathers and
non-affine indices of active tensors (a scatter-add), ``*=`` reductions, reductions other than
``+=`` onto an existing value without ``!``, half-precision tensors (gradients are exact only
in float32/float64), built-ins without a TC derivative.
"""

from __future__ import annotations

import dataclasses
import warnings
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any

from .. import ir
from ..dtypes import DType
from ..errors import PreconditionWarning, Source, TCError, format_located
from ..lang.ast import BUILTINS
from .emit import GradError, format_expr, format_size, format_statement, size_expr
from .indexing import invert_read, substitute
from .rules import backprop, depends_on

__all__ = ["GradProgram", "derive"]

_I, _B = DType.INT32, DType.BOOL
_BIG = 2**31 - 1
_DIFFERENTIABLE = (DType.FLOAT32, DType.FLOAT64)


@dataclass(frozen=True)
class GradProgram:
    """The derived gradient definition of ``forward``.

    ``source`` is its TC text (entry ``entry``); its inputs are the forward inputs followed by
    ``seeds``, the gradients of the forward outputs named in ``outputs`` (the float ones, in
    output order); its outputs are the gradients of ``wrt`` (forward inputs, in input order).
    """

    forward: ir.Function
    entry: str
    source: str
    wrt: tuple[str, ...]
    seeds: tuple[str, ...]
    outputs: tuple[str, ...]

    checked: Any = field(default=None, compare=False, repr=False)  # (Source, ast, ir.Function)

    def define(self, *, target: str = "auto", options_factory: Any = None) -> Any:
        """The derived definition as a `TCFunction` (what ``tcmlir.define(self.source)`` gives,
        without checking the text again): its own in-memory and on-disk cache entries."""
        from ..api import TCFunction
        from ..targets import check_target

        check_target(target)
        source, program, fn = self.checked
        return TCFunction(source, program, fn, target, options_factory)

    def __str__(self) -> str:
        return self.source


@dataclass(eq=False)
class _Version:
    name: str
    tensor: ir.Tensor
    active: bool
    seed: str | None = None        # the output-gradient input (final version of an output)
    grad: str | None = None        # the accumulator, once something contributes
    contributions: int = 0


@dataclass(eq=False)
class _Step:
    stmt: ir.Statement             # renamed: writes `writes.name`, reads versions
    writes: _Version
    prev: _Version | None          # the version copied first (partial rewrite, `+=` onto it)
    partial: bool                  # prev is overwritten only on stmt's box
    copy: ir.Statement | None = None
    origin: ir.Statement | None = None


@dataclass
class _Builder:
    fn: ir.Function
    wrt: tuple[str, ...]
    used: set[str] = field(default_factory=set)
    versions: dict[str, _Version] = field(default_factory=dict)   # current version per tensor
    by_name: dict[str, _Version] = field(default_factory=dict)
    steps: list[_Step] = field(default_factory=list)
    adjoint: list[ir.Statement] = field(default_factory=list)
    aliases: dict[str, ir.Expr] = field(default_factory=dict)      # size text -> seed size

    def box(self, t: ir.Tensor) -> tuple[tuple[str, ...], tuple[ir.IndexRange, ...]]:
        """Fresh indices over the whole of ``t``, with their ranges."""
        idx = tuple(self.fresh(f"i{d}") for d in range(t.rank))
        return idx, tuple(ir.IndexRange(n, ir.SizeExpr.constant(0), e)
                          for n, e in zip(idx, t.shape, strict=True))

    def fresh(self, base: str) -> str:
        name, k = base, 1
        while name in self.used:
            name, k = f"{base}_{k}", k + 1
        self.used.add(name)
        return name

    def error(self, st: ir.Statement | None, what: str, fix: str | None = None) -> GradError:
        src = self.fn.source
        if src is not None and st is not None and st.span is not None:
            return GradError(format_located(src, st.span, what, fix), span=st.span, source=src)
        return GradError(f"{self.fn.name}: {what}" + (f"\n  fix: {fix}" if fix else ""))

    # -------------------------------------------------------------- value-position bounds

    def bound(self, s: ir.SizeExpr, what: str) -> ir.Expr:
        expr = size_expr(s, what)
        if not any(isinstance(x, ir.Binary) and x.op == "floordiv" for x in ir.walk(expr)):
            return expr
        alias = self.aliases.get(_key(s))
        if alias is None:  # TC's `/` on values truncates: not the floor isl proves bounds with
            raise GradError(f"{self.fn.name}: the bound {s} of {what} has a floor division, "
                            "which a value-position guard cannot state exactly")
        return alias

    def active(self, name: str) -> bool:
        v = self.by_name.get(name)
        return v is not None and v.active

    # -------------------------------------------------------------- forward: versions

    def new_version(self, t: ir.Tensor, active: bool) -> _Version:
        k = sum(1 for v in self.by_name.values() if v.tensor.name == t.name)
        name = t.name if k == 0 else self.fresh(f"{t.name}_v{k}")
        v = _Version(name, t, active)
        self.by_name[name] = v
        self.versions[t.name] = v
        return v

    def rename(self, e: ir.Expr) -> ir.Expr:
        match e:
            case ir.Read(tensor=t, indices=idx):
                return dataclasses.replace(e, tensor=self.versions[t].name,
                                           indices=tuple(self.rename(x) for x in idx))
            case ir.Unary(operand=x) | ir.Cast(operand=x):
                return dataclasses.replace(e, operand=self.rename(x))
            case ir.Binary(lhs=a, rhs=b):
                return dataclasses.replace(e, lhs=self.rename(a), rhs=self.rename(b))
            case ir.Select(cond=c, then=t, orelse=f):
                return dataclasses.replace(e, cond=self.rename(c), then=self.rename(t),
                                           orelse=self.rename(f))
            case ir.Call(args=args):
                return dataclasses.replace(e, args=tuple(self.rename(a) for a in args))
        return e

    def forward(self) -> None:
        for t in self.fn.inputs:
            self.new_version(t, t.name in self.wrt)
        for st in self.fn.statements:
            t = self.fn.tensor(st.tensor)
            reads_self = any(isinstance(x, ir.Read) and x.tensor == t.name for x in ir.walk(st.rhs))
            prev = self.versions.get(t.name)
            if len(set(st.lhs)) != len(st.lhs):
                raise self.error(st, f"cannot differentiate a write with a repeated index "
                                     f"({t.name}({', '.join(st.lhs)}))")
            red = st.reduction
            if red is ir.Reduction.MUL:
                raise self.error(st, "cannot differentiate a *= reduction (the gradient of a "
                                     "product of many factors is not a TC expression when one "
                                     "is zero)", fix="write the product with exp(+=! log(..)) "
                                     "if the factors are positive")
            accumulate = red is not None and not st.init and prev is not None
            if red is not None and not st.init and red is not ir.Reduction.ADD:
                raise self.error(st, f"cannot differentiate {red.value}= without '!' (it reduces "
                                     f"onto the earlier contents of {t.name})",
                                 fix=f"write {red.value}=! ")
            if prev is None and reads_self:
                raise self.error(st, f"{t.name} is read before it is written (its zeros)")
            if st.init and reads_self:
                raise self.error(st, f"cannot differentiate a {red.value}=! statement that reads "
                                     f"the tensor it initialises ({t.name})")
            rhs = self.rename(st.rhs)
            full = prev is None or _covers(st, t)
            partial = prev is not None and not full and not accumulate
            keeps_prev = accumulate or partial
            active = depends_on(rhs, self.active) or (keeps_prev and prev.active)
            v = self.new_version(t, active)
            copy = None
            if keeps_prev:
                idx, ranges = self.box(t)
                copy = ir.Statement(v.name, idx, None, False,
                                    ir.Read(prev.name, tuple(map(ir.Index, idx)), t.dtype.compute),
                                    ranges)
            renamed = dataclasses.replace(st, tensor=v.name, rhs=rhs)
            self.steps.append(_Step(renamed, v, prev if keeps_prev else None, partial, copy, st))

    # -------------------------------------------------------------- reverse

    def accumulator(self, v: _Version) -> str:
        if v.grad is None:
            v.grad = self.fresh(f"{v.name}_grad") if v.tensor.role is not ir.Role.INPUT else v.grad
        v.contributions += 1
        return v.grad

    def contribute(self, v: _Version, lhs: tuple[str, ...], ranges: tuple[ir.IndexRange, ...],
                   rhs: ir.Expr) -> None:
        first = v.contributions == 0
        name = self.accumulator(v)
        init = False
        if first:  # start from zeros: `+=!` when this covers the tensor, else a zero fill
            init = _covers_ranges(lhs, {r.name: r for r in ranges}, v.tensor)
            if not init:
                self.adjoint.append(self.zeros(name, v.tensor))
        temp_first = first and v.tensor.role is not ir.Role.INPUT  # types the temporary:
        if temp_first or rhs.dtype is not v.tensor.dtype.compute:  # say it explicitly
            rhs = ir.Cast(rhs, v.tensor.dtype.compute)
        self.adjoint.append(ir.Statement(name, lhs, ir.Reduction.ADD, init, rhs, ranges))

    def zeros(self, name: str, t: ir.Tensor) -> ir.Statement:
        idx, ranges = self.box(t)
        zero = ir.Cast(ir.Const(0.0, t.dtype.compute), t.dtype.compute)
        return ir.Statement(name, idx, None, False, zero, ranges)

    def gradient_of(self, v: _Version) -> str | None:
        """The tensor holding ``v``'s complete gradient (adds the seed to the accumulator)."""
        if v.contributions == 0:
            return v.seed
        if v.seed is not None:
            idx, ranges = self.box(v.tensor)
            self.contribute(v, idx, ranges, ir.Read(v.seed, tuple(map(ir.Index, idx)),
                                                    v.tensor.dtype.compute))
        return v.grad

    def reverse(self) -> None:
        for step in reversed(self.steps):
            w = step.writes
            if not w.active:
                continue
            gname = self.gradient_of(w)
            if gname is None:
                continue
            st = step.stmt
            t = w.tensor.dtype.compute
            g: ir.Expr = ir.Read(gname, tuple(map(ir.Index, st.lhs)), t)
            if st.reduction in (ir.Reduction.MIN, ir.Reduction.MAX) and st.reduction_indices:
                g = ir.Select(self.arg_extremum(st), g, ir.Const(0.0, t), t)
            self.statement_adjoint(step, g)
            if step.prev is not None and step.prev.active:
                self.pass_through(step, gname)

    def arg_extremum(self, st: ir.Statement) -> ir.Expr:
        """The condition "this point is the first (lexicographic) arg-extremum of its row"."""
        t = self.fn.tensor(self.by_name[st.tensor].tensor.name).dtype.compute
        lhs = tuple(map(ir.Index, st.lhs))
        hit: ir.Expr = ir.Binary("==", st.rhs, ir.Read(st.tensor, lhs, t), _B)
        for r in st.reduction_indices:
            name = self.fresh(f"{st.tensor}_arg{r}")
            pick = ir.Select(hit, ir.Index(r), ir.Const(_BIG, _I), _I)
            self.adjoint.append(ir.Statement(name, st.lhs, ir.Reduction.MIN, True, pick, st.ranges))
            hit = ir.Binary("&&", hit, ir.Binary("==", ir.Index(r), ir.Read(name, lhs, _I), _B), _B)
        return hit

    def statement_adjoint(self, step: _Step, g: ir.Expr) -> None:
        st = step.stmt
        groups: dict[tuple[str, str], tuple[ir.Read, ir.Expr]] = {}
        try:
            pairs = backprop(st.rhs, g, self.active)
        except GradError as exc:
            raise self.error(step.origin, str(exc)) from None
        for read, adj in pairs:
            key = (read.tensor, format_expr(read))
            if key in groups:
                r0, a0 = groups[key]
                groups[key] = (r0, ir.Binary("+", a0, adj, a0.dtype))
            else:
                groups[key] = (read, adj)
        for read, adj in groups.values():
            v = self.by_name[read.tensor]
            try:
                inv = invert_read(read, st, self.fresh, self.bound,
                                  f"the read {format_expr(read)}{self.origin(v)}")
            except GradError as exc:
                raise self.error(step.origin, str(exc), fix=self.fix(v)) from None
            body = substitute(adj, inv.subst)
            if inv.guards:
                cond = inv.guards[0]
                for c in inv.guards[1:]:
                    cond = ir.Binary("&&", cond, c, _B)
                body = ir.Select(cond, body, ir.Const(0.0, body.dtype), body.dtype)
            ranges = []
            for d, n in enumerate(inv.lhs):
                ranges.append(ir.IndexRange(n, ir.SizeExpr.constant(0), v.tensor.shape[d])
                              if n in inv.new else st.range_of(n))
            ranges += [st.range_of(n) for n in inv.reduce]
            self.contribute(v, inv.lhs, tuple(ranges), body)

    def pass_through(self, step: _Step, gname: str) -> None:
        """The elements of ``prev`` that ``step`` keeps get the new version's gradient."""
        prev, t = step.prev, step.writes.tensor
        idx, ranges = self.box(t)
        ct = t.dtype.compute
        body: ir.Expr = ir.Read(gname, tuple(map(ir.Index, idx)), ct)
        if step.partial:  # only outside the rewritten box
            st = step.stmt
            inside: ir.Expr | None = None
            for n, name in zip(idx, st.lhs, strict=True):
                r = st.range_of(name)
                for c in (ir.Binary(">=", ir.Index(n), self.bound(r.lo, f"index {name}"), _B),
                          ir.Binary("<", ir.Index(n), self.bound(r.hi, f"index {name}"), _B)):
                    inside = c if inside is None else ir.Binary("&&", inside, c, _B)
            if inside is not None:
                body = ir.Select(inside, ir.Const(0.0, ct), body, ct)
        self.contribute(prev, idx, ranges, body)

    def origin(self, v: _Version) -> str:
        if v.tensor.role is ir.Role.INPUT:
            return f" of input {v.tensor.name}"
        inputs = [n for n in self.wrt if self.flows(n, v)]
        return f" of {v.tensor.name} (computed from input {', '.join(inputs)})" if inputs else ""

    def fix(self, v: _Version) -> str:
        blocked = [n for n in self.wrt if n == v.tensor.name or self.flows(n, v)]
        keep = [n for n in self.wrt if n not in blocked]
        return (f"input {', '.join(blocked)} is not differentiable here: leave it out of "
                f"wrt (e.g. wrt={tuple(keep)!r})")

    def flows(self, inp: str, v: _Version) -> bool:
        """Whether input ``inp`` reaches version ``v`` (through values)."""
        reach = {inp}
        for step in self.steps:
            names = {x.tensor for x in ir.walk(step.stmt.rhs) if isinstance(x, ir.Read)}
            if names & reach or (step.prev is not None and step.prev.name in reach):
                reach.add(step.writes.name)
        return v.name in reach


def _key(s: ir.SizeExpr) -> str:
    return str(s.pw_aff().coalesce())


def _covers_ranges(lhs: Sequence[str], ranges: dict[str, ir.IndexRange], t: ir.Tensor) -> bool:
    if len(lhs) != t.rank or len(set(lhs)) != t.rank:
        return False
    for name, extent in zip(lhs, t.shape, strict=True):
        r = ranges[name]
        if not (r.lo.pw_aff().is_equal(ir.SizeExpr.constant(0).pw_aff())
                and r.hi.pw_aff().is_equal(extent.pw_aff())):
            return False
    return True


def _covers(st: ir.Statement, t: ir.Tensor) -> bool:
    return _covers_ranges(st.lhs, {r.name: r for r in st.ranges}, t)


def _reads(stmts: Iterable[ir.Statement]) -> set[str]:
    return {x.tensor for s in stmts for x in ir.walk(s.rhs) if isinstance(x, ir.Read)}


def _decl(t: ir.Tensor, name: str, dims: Sequence[str] | None = None) -> str:
    dims = [format_size(d, f"dimension of {t.name}") for d in t.shape] if dims is None else dims
    return f"{t.dtype}({', '.join(dims)}) {name}" if t.rank else f"{t.dtype} {name}"


def derive(fn: Any, wrt: Sequence[str] | None = None) -> GradProgram:
    """The reverse-mode gradient program of ``fn`` (an `ir.Function` or a `TCFunction`) with
    respect to the inputs ``wrt`` (default: every float32/float64 input)."""
    fn = getattr(fn, "ir", fn)
    inputs = {t.name: t for t in fn.inputs}
    if wrt is None:
        wrt = tuple(t.name for t in fn.inputs if t.dtype in _DIFFERENTIABLE)
    else:
        wrt = tuple(wrt)
        for name in wrt:
            if name not in inputs:
                raise GradError(f"{fn.name}: wrt names {name!r}, which is not an input "
                                f"(inputs: {', '.join(inputs)})")
            if inputs[name].dtype not in _DIFFERENTIABLE:
                raise GradError(f"{fn.name}: input {name} is {inputs[name].dtype}: only float32 "
                                "and float64 inputs have gradients (half types compute in "
                                "float32 but store rounded, so no exact gradient exists)")
        wrt = tuple(t.name for t in fn.inputs if t.name in wrt)
    if not wrt:
        raise GradError(f"{fn.name}: nothing to differentiate (no float32/float64 input in wrt)")
    for t in fn.outputs + fn.temporaries:
        if t.dtype.is_float and t.dtype not in _DIFFERENTIABLE:
            raise GradError(f"{fn.name}: {t.name} is {t.dtype}: gradients need float32 or "
                            "float64 tensors throughout")
    b = _Builder(fn, wrt)
    b.used |= set(fn.sizes) | {t.name for t in fn.tensors} | set(BUILTINS) | {fn.name}
    b.used |= {n for st in fn.statements for n in st.index_names}
    b.forward()
    entry = b.fresh(f"{fn.name}_grad")
    seeds, seed_decls = [], []
    for t in fn.outputs:
        if t.dtype not in _DIFFERENTIABLE:  # integer and bool outputs carry no gradient
            continue
        seed = b.fresh(f"{t.name}_grad")
        seeds.append(seed)
        b.versions[t.name].seed = seed
        seed_decls.append(_decl(t, seed, _seed_dims(b, t)))
    outs = []
    for name in wrt:
        v = b.by_name[name]
        v.grad = b.fresh(f"{name}_grad")
        outs.append(v)
    b.reverse()
    for v in outs:
        if v.contributions == 0:  # no path from this input to an output
            b.adjoint.append(b.zeros(v.grad, v.tensor))
    kept = _live_forward(b)
    body = [format_statement(s) for s in kept + b.adjoint]
    params = [_decl(t, t.name) for t in fn.inputs] + seed_decls
    results = [_decl(v.tensor, v.grad) for v in outs]
    source = (f"# reverse-mode gradient of {fn.name} (derived by tcmlir.grad)\n"
              f"def {entry}({', '.join(params)})\n-> ({', '.join(results)})\n{{\n"
              + "\n".join(body) + "\n}\n")
    program = GradProgram(fn, entry, source, wrt, tuple(seeds),
                          tuple(t.name for t in fn.outputs if t.dtype in _DIFFERENTIABLE))
    return dataclasses.replace(program, checked=_check(program))


def _seed_dims(b: _Builder, t: ir.Tensor) -> list[str]:
    """Each output dimension as a TC input extent: a size name or constant as it is, any other
    extent (``H - KH + 1``) as a new size bound by the gradient's shape, which autograd makes
    equal to the output's; the bounds proofs then see it as a precondition (hence the
    filtered PreconditionWarning in `_check`)."""
    dims = []
    for d, extent in enumerate(t.shape):
        text = format_size(extent, f"dimension {d} of {t.name}")
        if text in b.fn.sizes or text.isdigit():
            dims.append(text)
            continue
        name = b.fresh(f"{t.name.upper()}_D{d}")
        b.aliases.setdefault(_key(extent), ir.Size(name))
        dims.append(name)
    return dims


def _live_forward(b: _Builder) -> list[ir.Statement]:
    needed = _reads(b.adjoint)
    kept: list[ir.Statement] = []
    for step in reversed(b.steps):
        if step.writes.name not in needed:
            continue
        group = [step.copy, step.stmt] if step.copy is not None else [step.stmt]
        needed |= _reads(group)
        kept[:0] = group
    return kept


def _check(program: GradProgram) -> tuple[Source, Any, ir.Function]:
    """Parse and check the derived text (as `tcmlir.define` does). The seeds' extra sizes
    make preconditions that hold by construction (`_seed_dims`): their warnings are dropped."""
    from ..lang import check, parse

    source = Source(program.source, f"<gradient of {program.forward.name}>")
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", PreconditionWarning)
            ast = parse(source.text, source.name)
            return source, ast, check(ast, program.entry, source=source)
    except TCError as exc:  # a derivation tcmlir cannot state in checked TC: say so, with the text
        raise GradError(f"{program.forward.name}: the derived gradient does not check:\n{exc}\n"
                        f"derived source:\n{program.source}") from None
