"""Block-wide reductions on NVPTX: what a ``reduction S<k> threads=B`` mark becomes.

The `map-reduction` pass puts the mark above a band whose member is split over ``threadIdx.x``
(``v mod B = _tx``); every thread of the block reaches the mark (no ``_tx`` guard lies above it)
and, at the mark, all instances of ``S<k>`` below it write one lhs element. Lowering:

1. on entry, a private accumulator (an alloca, promoted to a register) is set to the
   reduction's identity, and a private i64 ``offset`` of the lhs element to -1;
2. in the subtree, ``S<k>`` folds its right-hand side into the accumulator and records the lhs
   offset (it never touches the lhs in memory); ``S<k>_init`` and other statements are as usual;
3. the combine: butterfly warp shuffles (``llvm.nvvm.shfl.sync.bfly.{f32,i32}``; 64-bit values
   as two 32-bit halves) fold the accumulators; lane 0 of each warp writes its value to a
   static shared array (address space 3, one slot per warp); ``llvm.nvvm.barrier0``; thread 0
   folds the warps' values and, when it ran an instance (its offset is not -1), does ``lhs =
   op(lhs, total)`` at its own offset. The passes that make the mark prove that every thread
   runs instances below it whenever one does (`map_reductions._full_participation`), so thread
   0 ran one exactly when some thread did, and they all write the same element; a second
   barrier so that the shared slots may be reused and later statements see the lhs.

With ``atomic`` (``reduction S<k> threads=B atomic``, `passes/map_full_reduction.py`: blocks
share the lhs element) thread 0 folds a sum by ``atomicrmw`` (``red.global.add``: the L2 adds,
so blocks finishing at once do not wait for each other; a compare-and-swap loop serialises
them, a round trip to L2 and back per block and more for each one that loses a race)
and any other operator by a compare-and-swap loop on the element's bits, skipped for a
``min``/``max`` that would not change the value seen (32/64-bit types only): the order of the
blocks' folds, and so a float sum's rounding, varies from run to run.

Blocks of fewer than 32 threads (B a power of two) shuffle within the partial warp, with the
member mask ``(1 << B) - 1``. Operators and NaN rules are those of `exprs.ExprEmitter.arith`.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import islpy as isl
from llvmlite import ir

from .. import ir as tc
from ..affine import statement_rhs
from ..errors import CodegenError
from .ast_groups import STATEMENT_NAME
from .exprs import _COMBINE, I32, I64, ExprEmitter, const, value_type
from .lower import GroupWalker
from .target import declare

if TYPE_CHECKING:  # pragma: no cover
    from collections.abc import Mapping

__all__ = ["ReducingWalker", "ReductionScope", "accumulate", "combine", "enter", "fold_atomically"]

_NEG1 = ir.Constant(I64, -1)


@dataclass
class ReductionScope:
    statement: int
    threads: int
    acc: ir.Value      # alloca of the value type
    offset: ir.Value   # alloca i64


def enter(walker: GroupWalker, statement: int, threads: int) -> ReductionScope:
    """Allocate and initialise the private accumulator of ``S<statement>``."""
    fn = walker.fn
    st = fn.statements[statement]
    if st.reduction is None:
        raise CodegenError(f"reduction mark on statement S{statement}, which is not a reduction")
    if threads < 1 or threads > 1024 or threads & (threads - 1):
        raise CodegenError(f"reduction mark: threads={threads} is not a power of two <= 1024")
    dt = fn.tensor(st.tensor).dtype.compute
    ty = value_type(dt)
    if not isinstance(ty, (ir.FloatType, ir.DoubleType)) and ty not in (I32, I64):
        raise CodegenError(f"reduction mark on S{statement}: {dt} values cannot be shuffled")
    acc = walker.entry.alloca(ty, name=f"red.acc.{statement}")
    off = walker.entry.alloca(I64, name=f"red.off.{statement}")
    b = walker.builder
    b.store(const(dt, st.reduction.identity(dt)), acc)
    b.store(_NEG1, off)
    return ReductionScope(statement, threads, acc, off)


def accumulate(walker: GroupWalker, scope: ReductionScope, env: Mapping[str, ir.Value]) -> None:
    """One instance of ``S<k>`` into the private accumulator."""
    st = walker.fn.statements[scope.statement]
    em = ExprEmitter(walker, env, scope.statement)
    missing = [n for n in st.index_names if n not in env]
    if missing:
        raise em.error(st, f"statement without values for indices {missing}")
    off = em.offset(st.tensor, [env[n] for n in st.lhs])
    fold_rhs(walker, em, st, scope.acc)
    walker.builder.store(off, scope.offset)


def fold_rhs(walker: GroupWalker, em: ExprEmitter, st: Any, acc: ir.Value) -> None:
    """``*acc = op(*acc, rhs)`` for reduction statement ``st`` (a private accumulator)."""
    dt = walker.fn.tensor(st.tensor).dtype.compute
    val = em.value(statement_rhs(st))
    if val.type != value_type(dt):
        raise em.error(st.rhs, f"a {st.rhs.dtype} value reduced into {dt} tensor {st.tensor}")
    b = walker.builder
    b.store(em.arith(_COMBINE[st.reduction], b.load(acc), val, dt, st), acc)


# ---------------------------------------------------------------- the combine


def _shfl(b: ir.IRBuilder, value: ir.Value, lane: int, mask: int) -> ir.Value:
    """``shfl.sync.bfly`` of a 32- or 64-bit value (64-bit: two 32-bit halves)."""
    ty = value.type
    args = [ir.Constant(I32, mask), None, ir.Constant(I32, lane), ir.Constant(I32, 31)]
    if isinstance(ty, ir.FloatType) or ty == I32:
        suffix = "f32" if isinstance(ty, ir.FloatType) else "i32"
        fn = declare(b.module, f"llvm.nvvm.shfl.sync.bfly.{suffix}",
                     ir.FunctionType(ty, [I32, ty, I32, I32]))
        args[1] = value
        return b.call(fn, args)
    bits = b.bitcast(value, I64) if isinstance(ty, ir.DoubleType) else value
    fn = declare(b.module, "llvm.nvvm.shfl.sync.bfly.i32", ir.FunctionType(I32, [I32, I32, I32, I32]))
    lo = b.call(fn, [args[0], b.trunc(bits, I32), args[2], args[3]])
    hi = b.call(fn, [args[0], b.trunc(b.lshr(bits, ir.Constant(I64, 32)), I32), args[2], args[3]])
    out = b.or_(b.zext(lo, I64), b.shl(b.zext(hi, I64), ir.Constant(I64, 32)))
    return b.bitcast(out, ty) if isinstance(ty, ir.DoubleType) else out


def _barrier(b: ir.IRBuilder) -> None:
    b.call(declare(b.module, "llvm.nvvm.barrier0", ir.FunctionType(ir.VoidType(), [])), [])


def _shared(module: ir.Module, ty: ir.Type, count: int, stem: str) -> ir.GlobalVariable:
    n = 0
    while f"{stem}.{n}" in module.globals:
        n += 1
    g = ir.GlobalVariable(module, ir.ArrayType(ty, count), f"{stem}.{n}", addrspace=3)
    g.linkage = "internal"
    g.initializer = ir.Constant(ir.ArrayType(ty, count), ir.Undefined)
    g.align = 8
    return g


def _smax(b: ir.IRBuilder, x: ir.Value, y: ir.Value) -> ir.Value:
    return b.select(b.icmp_signed(">", x, y), x, y)


def _if(b: ir.IRBuilder, cond: ir.Value, name: str):
    then = b.append_basic_block(f"{name}.then")
    done = b.append_basic_block(f"{name}.end")
    b.cbranch(cond, then, done)
    b.position_at_end(then)
    return done


def fold_atomically(em: ExprEmitter, st: Any, off: ir.Value, total: ir.Value, dt) -> None:
    """``lhs = op(lhs, total)`` at offset ``off`` of ``st``'s lhs, atomically (other threads or
    blocks fold into the same element): a sum by ``atomicrmw`` (``red.global.add``, f32/f64/
    i32/i64: the L2 adds, no round trip per fold), any other operator by `_atomic_fold`."""
    if st.reduction is tc.Reduction.ADD:
        op = "fadd" if dt.is_float else "add"
        em.b.atomic_rmw(op, em.address(st.tensor, off), total, "monotonic")
    else:
        _atomic_fold(em, st.tensor, off, total, _COMBINE[st.reduction], dt, st)


def _atomic_fold(em: ExprEmitter, tensor: str, off: ir.Value, total: ir.Value, op: str, dt,
                 st) -> None:
    """``lhs = op(lhs, total)`` as a compare-and-swap loop: blocks fold into one element. A
    ``min``/``max`` whose total does not change the value seen skips the compare-and-swap
    (the element only moves away from ``total``: once seen unchanged, it stays so), so most
    blocks of a full maximum do one load and no atomic."""
    b = em.b
    ptr = em.address(tensor, off)
    ty = total.type
    bits = ir.IntType(64 if ty in (I64,) or isinstance(ty, ir.DoubleType) else 32)
    as_bits = (lambda v: v) if isinstance(ty, ir.IntType) else (lambda v: b.bitcast(v, bits))
    from_bits = (lambda v: v) if isinstance(ty, ir.IntType) else (lambda v: b.bitcast(v, ty))
    first = as_bits(b.load(ptr, typ=ty))
    head = b.block
    loop = b.append_basic_block("red.cas")
    done = b.append_basic_block("red.cas.end")
    b.branch(loop)
    b.position_at_end(loop)
    seen = b.phi(bits)
    seen.add_incoming(first, head)
    new = as_bits(em.arith(op, from_bits(seen), total, dt, st))
    if op in ("min", "max"):
        swap = b.append_basic_block("red.cas.swap")
        b.cbranch(b.icmp_unsigned("==", new, seen), done, swap)
        b.position_at_end(swap)
    res = b.cmpxchg(ptr, seen, new, "monotonic", "monotonic")
    now, ok = b.extract_value(res, 0), b.extract_value(res, 1)
    seen.add_incoming(now, b.block)
    b.cbranch(ok, done, loop)
    b.position_at_end(done)


def combine(walker: GroupWalker, scope: ReductionScope, atomic: bool = False) -> None:
    """Combine the block's accumulators and fold the total into the lhs (thread 0; with
    ``atomic``, by compare-and-swap, since other blocks fold into the same element)."""
    b = walker.builder
    st = walker.fn.statements[scope.statement]
    dt = walker.fn.tensor(st.tensor).dtype.compute
    em = ExprEmitter(walker, {}, scope.statement)
    op = _COMBINE[st.reduction]
    threads = scope.threads
    acc, off = b.load(scope.acc), b.load(scope.offset)
    width = min(threads, 32)
    mask = -1 if width == 32 else (1 << width) - 1
    step = width // 2
    # only the accumulators are combined: the mark's pass proved that every thread of the
    # block runs instances below it whenever one does (`map_reductions._full_participation`),
    # and all of them write one lhs element, so thread 0's own offset names it (-1 exactly
    # when no thread ran one: a block past the extents)
    while step >= 1:
        acc = em.arith(op, acc, _shfl(b, acc, step, mask), dt, st)
        step //= 2
    tid = b.trunc(walker.param("_tx"), I32)
    is0 = b.icmp_unsigned("==", tid, ir.Constant(I32, 0))
    warps = (threads + 31) // 32
    if warps > 1:
        vals = _shared(b.module, acc.type, warps, "red.vals")
        lane0 = b.icmp_unsigned("==", b.and_(tid, ir.Constant(I32, 31)), ir.Constant(I32, 0))
        done = _if(b, lane0, "red.warp")
        warp = b.zext(b.lshr(tid, ir.Constant(I32, 5)), I64)
        zero = ir.Constant(I64, 0)
        b.store(acc, b.gep(vals, [zero, warp], inbounds=True))
        b.branch(done)
        b.position_at_end(done)
    _barrier(b)
    done = _if(b, is0, "red.fold")
    if warps > 1:
        zero = ir.Constant(I64, 0)
        acc = b.load(b.gep(vals, [zero, zero], inbounds=True))
        for w in range(1, warps):
            slot = ir.Constant(I64, w)
            acc = em.arith(op, acc, b.load(b.gep(vals, [zero, slot], inbounds=True)), dt, st)
    ran = b.icmp_signed(">=", off, ir.Constant(I64, 0))
    inner = _if(b, ran, "red.store")
    if atomic:
        fold_atomically(em, st, off, acc, dt)
    else:
        em.store(st.tensor, off, em.arith(op, em.load(st.tensor, off), acc, dt, st))
    b.branch(inner)
    b.position_at_end(inner)
    b.branch(done)
    b.position_at_end(done)
    _barrier(b)


# ---------------------------------------------------------------- the walk


class ReducingWalker(GroupWalker):
    """The kernel walk with reduction marks: `reduce` lowers the subtree under a mark;
    ``S<k>`` below it goes to the private accumulator. Every thread of the block reaches the
    mark: `map-reduction` proved that each ``_tx`` in [0, B) has instances below it at every
    outer iteration, so a condition isl puts above it holds for all of them (it may still read
    ``_tx`` when another kernel of the tree has a wider block, e.g. ``if (_tx <= 1)`` for B=2)."""

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.scopes: list[ReductionScope] = []

    def reduce(self, statement: int, threads: int, child: isl.AstNode, atomic: bool = False) -> None:
        if self.scopes:
            raise CodegenError(f"reduction mark of S{statement} inside another reduction mark")
        scope = enter(self, statement, threads)
        self.scopes.append(scope)
        self.node(child)
        self.scopes.pop()
        combine(self, scope, atomic)

    def user(self, node: isl.AstNode) -> None:
        call = node.user_get_expr()
        m = STATEMENT_NAME.match(call.get_op_arg(0).get_id().get_name()) if call.get_op_n_arg() else None
        # (several scopes only under an accumulate mark of several statements, codegen.gpu_rows)
        scope = next((s for s in self.scopes if m is not None and not m.group(2)
                      and s.statement == int(m.group(1))), None)
        if scope is None:
            super().user(node)
            return
        st = self.fn.statements[scope.statement]
        args = [self.expr(call.get_op_arg(i + 1)) for i in range(call.get_op_n_arg() - 1)]
        if len(args) != len(st.index_names):
            raise CodegenError(f"isl AST call {call.to_C_str()} has {len(args)} arguments")
        accumulate(self, scope, dict(zip(st.index_names, args, strict=True)))
