"""TC IR expressions and statement bodies to LLVM IR (target-neutral).

`emit_statement` is what the AST walk calls for a user node ``S{k}(...)`` / ``S{k}_init(...)``
once it has the statement's index values (i64). Values live in registers in their compute type
(bool as ``i1``, float16/bfloat16 as ``float``); memory holds the storage type (bool as ``i8``,
``half``, bfloat16 as ``i16`` bits, rounded to nearest even on store).

Semantics follow `tcmlir.reference`: integers wrap, integer ``/`` and ``%`` truncate (C) and give
0 for a zero divisor (and never trap on ``MIN / -1``), float ``%`` is ``frem`` (fmod),
``floordiv``/``floormod`` floor, ``min``/``max`` on floats propagate NaN, ``!=`` on floats is
true for NaN. Index expressions (inside `Read.indices`) are computed in i64; an index that
contains a read (a gather) or is not quasi-affine (``kc % c``) is bounds-checked at run time:
on failure the kernel stores the access's error code in ``*err`` and returns (see
`KernelContext.fail`).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Protocol

from llvmlite import ir

from .. import ir as tc
from ..affine import statement_rhs, to_isl
from ..dtypes import DType
from ..errors import CodegenError, Span
from .mathlib import DERIVED, PRIMITIVES, emit_builtin
from .target import Target, declare, type_suffix

__all__ = ["KernelContext", "emit_statement", "memory_type", "value_type"]

I1, I8, I16, I32, I64 = (ir.IntType(n) for n in (1, 8, 16, 32, 64))
F32, F64 = ir.FloatType(), ir.DoubleType()


def value_type(dt: DType) -> ir.Type:
    """The register type of values of ``dt`` (its compute type)."""
    if dt is DType.BOOL:
        return I1
    if dt.is_int:
        return ir.IntType(dt.bits)
    return F64 if dt is DType.FLOAT64 else F32


def memory_type(dt: DType) -> ir.Type:
    """The type elements of a ``dt`` tensor have in memory."""
    if dt is DType.BOOL:
        return I8
    if dt is DType.FLOAT16:
        return ir.HalfType()
    if dt is DType.BFLOAT16:
        return I16
    return value_type(dt)


def const(dt: DType, value: int | float | bool) -> ir.Constant:
    ty = value_type(dt)
    if isinstance(ty, ir.IntType):
        v = int(value) & ((1 << ty.width) - 1)
        if ty.width > 1 and v >= 1 << (ty.width - 1):
            v -= 1 << ty.width
        return ir.Constant(ty, v)
    return ir.Constant(ty, float(value))


class KernelContext(Protocol):
    """What the expression lowering needs from the function being built (see `lower.py`)."""

    builder: ir.IRBuilder
    target: Target
    fn: tc.Function

    def pointer(self, tensor: str) -> ir.Value: ...
    def extent(self, tensor: str, dim: int) -> ir.Value: ...
    def param(self, name: str) -> ir.Value: ...
    def gather_code(self, tensor: str, statement: int, span: Span | None, dim: int = -1) -> int: ...
    def fail(self, code: int, index: ir.Value | None = None,
             extent: ir.Value | None = None) -> None: ...


def _has_gather(e: tc.Expr) -> bool:
    return any(isinstance(x, tc.Read) for x in tc.walk(e))


class ExprEmitter:
    """Lowers the expressions of one statement instance (index names bound to i64 values)."""

    def __init__(self, ctx: KernelContext, env: Mapping[str, ir.Value], statement: int):
        self.ctx = ctx
        self.b = ctx.builder
        self.env = env
        self.statement = statement

    # ------------------------------------------------------------ errors

    def error(self, node: object, what: str) -> CodegenError:
        span = getattr(node, "span", None)
        src = self.ctx.fn.source
        msg = f"cannot lower {what} (statement {self.statement} of {self.ctx.fn.name})"
        if src is not None:
            return CodegenError.at(src, span, msg)  # type: ignore[return-value]
        return CodegenError(msg, span=span)

    # ------------------------------------------------------------ memory

    def offset(self, tensor: str, indices: list[ir.Value]) -> ir.Value:
        """Row-major linear element offset (i64) of ``indices`` in ``tensor``."""
        first = 1 if tensor in getattr(self.ctx, "row_local", ()) else 0  # a stack row (host_rows)
        if len(indices) <= first:
            return ir.Constant(I64, 0)
        off = indices[first]
        for d in range(first + 1, len(indices)):
            off = self.b.add(self.b.mul(off, self.ctx.extent(tensor, d)), indices[d])
        return off

    def address(self, tensor: str, offset: ir.Value) -> ir.Value:
        t = self.ctx.fn.tensor(tensor)
        local = getattr(self.ctx, "local_slot", None)  # a row's element kept on chip (gpu_rows)
        slot = local(tensor) if local is not None else None
        if slot is not None:
            return slot
        return self.b.gep(self.ctx.pointer(tensor), [offset], inbounds=True,
                          source_etype=memory_type(t.dtype))

    def redirect(self, key: object) -> ir.Value | None:
        """The promoted buffer element of access ``key`` (a `Read`, or ``"lhs"``), if any."""
        redirect = getattr(self.ctx, "redirect", None)
        return redirect(key) if redirect is not None else None

    def load(self, tensor: str, offset: ir.Value) -> ir.Value:
        t = self.ctx.fn.tensor(tensor)
        cached = getattr(self.ctx, "local_value", None)  # a row's element in a register (gpu_rows)
        raw = cached(tensor) if cached is not None else None
        if raw is not None:
            return self.from_memory(raw, t.dtype)
        raw = self.b.load(self.address(tensor, offset), typ=memory_type(t.dtype))
        if t.role is tc.Role.INPUT and self.ctx.target.invariant_inputs:
            raw.set_metadata("invariant.load", self.b.module.add_metadata([]))
        return self.from_memory(raw, t.dtype)

    def store(self, tensor: str, offset: ir.Value, value: ir.Value) -> None:
        dt = self.ctx.fn.tensor(tensor).dtype
        self.b.store(self.to_memory(value, dt), self.address(tensor, offset))

    def from_memory(self, raw: ir.Value, dt: DType) -> ir.Value:
        b = self.b
        if dt is DType.BOOL:
            return b.icmp_unsigned("!=", raw, ir.Constant(I8, 0))
        if dt is DType.FLOAT16:
            return b.fpext(raw, F32)
        if dt is DType.BFLOAT16:
            return b.bitcast(b.shl(b.zext(raw, I32), ir.Constant(I32, 16)), F32)
        return raw

    def to_memory(self, value: ir.Value, dt: DType) -> ir.Value:
        b = self.b
        if dt is DType.BOOL:
            return b.zext(value, I8)
        if dt is DType.FLOAT16:
            return b.fptrunc(value, ir.HalfType())
        if dt is DType.BFLOAT16:
            bits = b.bitcast(value, I32)
            lsb = b.and_(b.lshr(bits, ir.Constant(I32, 16)), ir.Constant(I32, 1))
            rounded = b.lshr(b.add(bits, b.add(lsb, ir.Constant(I32, 0x7FFF))), ir.Constant(I32, 16))
            nan = b.fcmp_unordered("uno", value, value)
            quiet = b.or_(b.lshr(bits, ir.Constant(I32, 16)), ir.Constant(I32, 0x40))
            return b.trunc(b.select(nan, quiet, rounded), I16)
        return value

    # ------------------------------------------------------------ index expressions (i64)

    def read_offset(self, e: tc.Read) -> ir.Value:
        t = self.ctx.fn.tensor(e.tensor)
        if len(e.indices) != t.rank:
            raise self.error(e, f"read of {e.tensor} with {len(e.indices)} indices (rank {t.rank})")
        idx = []
        for d, ie in enumerate(e.indices):
            v = self.index(ie)
            if _has_gather(ie) or to_isl(ie) is None:  # not proved in bounds at define
                self.check_bounds(e, v, self.ctx.extent(e.tensor, d), d)
            idx.append(v)
        return self.offset(e.tensor, idx)

    def check_bounds(self, e: tc.Read, v: ir.Value, extent: ir.Value, dim: int) -> None:
        b = self.b
        ok = b.icmp_unsigned("<", v, extent)  # also rejects negatives
        code = self.ctx.gather_code(e.tensor, self.statement, e.span, dim)
        bad = b.append_basic_block(f"oob.{e.tensor}")
        cont = b.append_basic_block("inbounds")
        b.cbranch(ok, cont, bad)
        b.position_at_end(bad)
        self.ctx.fail(code, v, extent)
        b.position_at_end(cont)

    def index(self, e: tc.Expr) -> ir.Value:
        """``e`` as an i64 (index arithmetic is 64-bit whatever the declared types)."""
        b = self.b
        match e:
            case tc.Const(value=v):
                return ir.Constant(I64, int(v))
            case tc.Index(name=n):
                return self.env[n]
            case tc.Size(name=n):
                return self.ctx.param(n)
            case tc.Unary(op="-", operand=x):
                return b.neg(self.index(x))
            case tc.Binary(op=op, lhs=x, rhs=y) if op in _INT_ARITH or op in _DIVISIONS or op in ("min", "max"):
                return self.int_binary(op, self.index(x), self.index(y), signed=True)
            case tc.Select(cond=c, then=x, orelse=y):
                return b.select(self.value(c), self.index(x), self.index(y))
            case tc.Cast(operand=x, dtype=dt) if dt.is_int and (x.dtype.is_int or x.dtype is DType.BOOL):
                return self.index(x)
        v = self.value(e)
        if isinstance(v.type, ir.IntType):
            return self.extend(v, e.dtype)
        raise self.error(e, f"a {e.dtype} value as a tensor index")

    def extend(self, v: ir.Value, dt: DType) -> ir.Value:
        if v.type.width == 64:
            return v
        return self.b.sext(v, I64) if dt.is_signed and dt is not DType.BOOL else self.b.zext(v, I64)

    # ------------------------------------------------------------ values

    def value(self, e: tc.Expr) -> ir.Value:
        b = self.b
        match e:
            case tc.Const(value=v, dtype=dt):
                return const(dt, v)
            case tc.Index(name=n, dtype=dt) | tc.Size(name=n, dtype=dt):
                v = self.env[n] if isinstance(e, tc.Index) else self.ctx.param(n)
                return self.convert(v, DType.INT64, dt)
            case tc.Read(tensor=t):
                ptr = self.redirect(e)
                if ptr is not None:
                    dt = self.ctx.fn.tensor(t).dtype
                    return self.from_memory(self.b.load(ptr, typ=memory_type(dt)), dt)
                return self.load(t, self.read_offset(e))
            case tc.Unary(op="-", operand=x):
                v = self.value(x)
                return b.fneg(v) if x.dtype.is_float else b.neg(v)
            case tc.Unary(op="!", operand=x):
                return b.not_(self.truth(x))
            case tc.Binary(op=op, lhs=x, rhs=y):
                return self.binary(e, op, x, y)
            case tc.Select(cond=c, then=x, orelse=y):
                if _has_gather(x) or _has_gather(y):
                    return self.branchy_select(c, x, y)
                return b.select(self.truth(c), self.value(x), self.value(y))
            case tc.Call(func=f, args=args):
                if f not in PRIMITIVES and f not in DERIVED:
                    raise self.error(e, f"built-in {f}")
                vals = [self.value(a) for a in args]
                if not all(v.type == vals[0].type and isinstance(v.type, (ir.FloatType, ir.DoubleType))
                           for v in vals):
                    raise self.error(e, f"built-in {f} on non-float operands")
                return emit_builtin(b, self.ctx.target, f, vals)
            case tc.Cast(operand=x, dtype=dt):
                return self.convert(self.value(x), x.dtype.compute, dt)
        raise self.error(e, f"expression {type(e).__name__}")

    def truth(self, e: tc.Expr) -> ir.Value:
        v = self.value(e)
        return v if v.type == I1 else self.convert(v, e.dtype, DType.BOOL)

    def branchy_select(self, c: tc.Expr, x: tc.Expr, y: tc.Expr) -> ir.Value:
        """``c ? x : y`` evaluating only the taken side (a guarded gather must not be checked)."""
        b = self.b
        cond = self.truth(c)
        then_bb, else_bb = b.append_basic_block("sel.then"), b.append_basic_block("sel.else")
        join = b.append_basic_block("sel.join")
        b.cbranch(cond, then_bb, else_bb)
        b.position_at_end(then_bb)
        tv = self.value(x)
        then_end = b.block
        b.branch(join)
        b.position_at_end(else_bb)
        ev = self.value(y)
        else_end = b.block
        b.branch(join)
        b.position_at_end(join)
        phi = b.phi(tv.type)
        phi.add_incoming(tv, then_end)
        phi.add_incoming(ev, else_end)
        return phi

    def binary(self, e: tc.Binary, op: str, x: tc.Expr, y: tc.Expr) -> ir.Value:
        b = self.b
        if op in ("&&", "||"):
            lhs, rhs = self.truth(x), self.truth(y)
            return b.and_(lhs, rhs) if op == "&&" else b.or_(lhs, rhs)
        lhs, rhs = self.value(x), self.value(y)
        dt = x.dtype.compute
        if lhs.type != rhs.type:
            raise self.error(e, f"'{op}' on {x.dtype} and {y.dtype} operands")
        if op in tc.COMPARISONS:
            if dt.is_float:
                return (b.fcmp_unordered if op == "!=" else b.fcmp_ordered)(op, lhs, rhs)
            signed = dt.is_signed and dt is not DType.BOOL
            return (b.icmp_signed if signed else b.icmp_unsigned)(op, lhs, rhs)
        return self.arith(op, lhs, rhs, dt, e)

    def arith(self, op: str, lhs: ir.Value, rhs: ir.Value, dt: DType, node: object = None) -> ir.Value:
        b = self.b
        if dt.is_float:
            if op in _FLOAT_ARITH:
                out = getattr(b, _FLOAT_ARITH[op])(lhs, rhs)
                if self.ctx.target.contract_floats and op in ("+", "-", "*"):
                    out.flags.append("contract")  # a*b+c may become one fma (as nvcc does)
                if op == "/" and self.ctx.target.reciprocal_divisions:
                    out.flags.append("arcp")
                return out
            if op in ("min", "max"):
                return self.ctx.target.math(b, b.module, "f" + op + "imum", [lhs, rhs])
            if op == "floordiv":
                return self.ctx.target.math(b, b.module, "floor", [b.fdiv(lhs, rhs)])
            if op == "floormod":
                r = b.frem(lhs, rhs)
                zero = ir.Constant(lhs.type, 0.0)
                fix = b.and_(b.fcmp_ordered("!=", r, zero),
                             b.xor(b.fcmp_ordered("<", r, zero), b.fcmp_ordered("<", rhs, zero)))
                return b.select(fix, b.fadd(r, rhs), r)
        elif dt is DType.BOOL:
            if op in ("+", "max", "||"):
                return b.or_(lhs, rhs)
            if op in ("*", "min", "&&"):
                return b.and_(lhs, rhs)
        elif op in _INT_ARITH or op in _DIVISIONS or op in ("min", "max"):
            return self.int_binary(op, lhs, rhs, signed=dt.is_signed)
        raise self.error(node, f"operator '{op}' on {dt}")

    def int_binary(self, op: str, a: ir.Value, c: ir.Value, *, signed: bool) -> ir.Value:
        b = self.b
        if op in _INT_ARITH:
            return getattr(b, _INT_ARITH[op])(a, c)
        if op in ("min", "max"):
            cmp = (b.icmp_signed if signed else b.icmp_unsigned)("<" if op == "min" else ">", a, c)
            return b.select(cmp, a, c)
        zero, one = ir.Constant(a.type, 0), ir.Constant(a.type, 1)
        is_zero = b.icmp_unsigned("==", c, zero)
        if not signed:
            d = b.select(is_zero, one, c)
            q = b.udiv(a, d) if op in ("/", "floordiv") else b.urem(a, d)
            return b.select(is_zero, zero, q)
        is_m1 = b.icmp_signed("==", c, ir.Constant(a.type, -1))
        d = b.select(b.or_(is_zero, is_m1), one, c)  # x / -1 is computed as -x: no trap on MIN/-1
        q, r = b.sdiv(a, d), b.srem(a, d)
        if op in ("floordiv", "floormod"):
            fix = b.and_(b.icmp_signed("!=", r, zero),
                         b.xor(b.icmp_signed("<", r, zero), b.icmp_signed("<", d, zero)))
            q = b.sub(q, b.zext(fix, a.type))
            r = b.select(fix, b.add(r, d), r)
        if op in ("/", "floordiv"):
            return b.select(is_zero, zero, b.select(is_m1, b.neg(a), q))
        return b.select(b.or_(is_zero, is_m1), zero, r)

    # ------------------------------------------------------------ conversions

    def convert(self, v: ir.Value, src: DType, dst: DType) -> ir.Value:
        """Cast a register value of compute type ``src`` to ``dst`` (C conversion rules)."""
        b = self.b
        if dst in (DType.FLOAT16, DType.BFLOAT16):  # round through the storage type
            return self.from_memory(self.to_memory(self.convert(v, src, DType.FLOAT32), dst), dst)
        src = src.compute
        sty, dty = value_type(src), value_type(dst)
        if dst is DType.BOOL:
            if src is DType.BOOL:
                return v
            if src.is_float:
                return b.fcmp_unordered("!=", v, ir.Constant(sty, 0.0))
            return b.icmp_unsigned("!=", v, ir.Constant(sty, 0))
        if src is DType.BOOL:
            return b.uitofp(v, dty) if dst.is_float else b.zext(v, dty)
        if src.is_float and dst.is_float:
            if sty == dty:
                return v
            return b.fpext(v, dty) if dst.bits > src.bits else b.fptrunc(v, dty)
        if src.is_float:  # saturating, NaN -> 0 (as PTX's cvt.rzi and the reference)
            name = f"llvm.fpto{'s' if dst.is_signed else 'u'}i.sat.i{dty.width}.{type_suffix(sty)}"
            return b.call(declare(b.module, name, ir.FunctionType(dty, [sty])), [v])
        if dst.is_float:
            return b.sitofp(v, dty) if src.is_signed else b.uitofp(v, dty)
        if sty.width == dty.width:
            return v
        if dty.width < sty.width:
            return b.trunc(v, dty)
        return b.sext(v, dty) if src.is_signed else b.zext(v, dty)


_INT_ARITH = {"+": "add", "-": "sub", "*": "mul"}
_FLOAT_ARITH = {"+": "fadd", "-": "fsub", "*": "fmul", "/": "fdiv", "%": "frem"}
_DIVISIONS = ("/", "%", "floordiv", "floormod")
_COMBINE = {tc.Reduction.ADD: "+", tc.Reduction.MUL: "*", tc.Reduction.MIN: "min", tc.Reduction.MAX: "max"}


def emit_statement(ctx: KernelContext, k: int, init: bool, env: Mapping[str, ir.Value]) -> None:
    """Emit one instance of statement ``k`` (or of its ``!`` initialisation when ``init``)."""
    st = ctx.fn.statements[k]
    em = ExprEmitter(ctx, env, k)
    t = ctx.fn.tensor(st.tensor)
    missing = [n for n in st.lhs if n not in env]
    if missing:
        raise em.error(st, f"statement without values for indices {missing}")
    dt = t.dtype.compute
    reg = em.redirect("lhs")
    if reg is not None:  # the element lives in a promoted buffer
        _emit_on(em, st, k, init, reg, t.dtype)
        return
    off = em.offset(st.tensor, [env[n] for n in st.lhs])
    if init:
        if st.reduction is None:
            raise em.error(st, f"S{k}_init for a statement without a reduction")
        em.store(st.tensor, off, const(dt, st.reduction.identity(dt)))
        return
    val = em.value(statement_rhs(st))
    if val.type != value_type(dt):
        raise em.error(st.rhs, f"a {st.rhs.dtype} value stored to {t.dtype} tensor {t.name}")
    if st.reduction is not None:
        old = em.load(st.tensor, off)
        val = em.arith(_COMBINE[st.reduction], old, val, dt, st)
        if (dt.is_float and st.reduction in (tc.Reduction.ADD, tc.Reduction.MUL)
                and ctx.target.reassociate_reductions):
            val.flags.append("reassoc")
    em.store(st.tensor, off, val)


def _emit_on(em: ExprEmitter, st: tc.Statement, k: int, init: bool, ptr: ir.Value, mdt: DType) -> None:
    """`emit_statement` for an lhs element at ``ptr`` (a shared or register buffer)."""
    dt = mdt.compute
    mty = memory_type(mdt)
    if init:
        if st.reduction is None:
            raise em.error(st, f"S{k}_init for a statement without a reduction")
        em.b.store(em.to_memory(const(dt, st.reduction.identity(dt)), mdt), ptr)
        return
    val = em.value(statement_rhs(st))
    if st.reduction is not None:
        old = em.from_memory(em.b.load(ptr, typ=mty), mdt)
        val = em.arith(_COMBINE[st.reduction], old, val, dt, st)
    em.b.store(em.to_memory(val, mdt), ptr)
