"""LLVM IR helpers of the tensor-core generators (`codegen/gpu_mma.py`, `gpu_wgmma.py`,
`mma_epilogue.py`): integer values with Python arithmetic (so the lane layouts of
`codegen/mma_layout.py` build IR), counted loops, guarded blocks, special registers, and the
conversions of an accumulator to the output's memory type."""

from __future__ import annotations

from collections.abc import Callable

from llvmlite import ir

from ..dtypes import DType
from .target import declare

__all__ = ["F32", "I16", "I32", "I64", "IntV", "counted_loop", "half_type", "if_then", "round_to",
           "sreg", "store_type"]

I16, I32, I64 = ir.IntType(16), ir.IntType(32), ir.IntType(64)
F32 = ir.FloatType()


class IntV:
    """An unsigned integer LLVM value with Python arithmetic (so the layout functions of
    `mma_layout` build IR): ``//`` and ``%`` by powers of two become shifts and masks."""

    def __init__(self, b: ir.IRBuilder, value: ir.Value):
        self.b, self.v = b, value

    def _c(self, other: int | IntV) -> ir.Value:
        return other.v if isinstance(other, IntV) else ir.Constant(self.v.type, other)

    def __add__(self, o: int | IntV) -> IntV:
        return self if isinstance(o, int) and o == 0 else IntV(self.b, self.b.add(self.v, self._c(o)))

    __radd__ = __add__

    def __mul__(self, o: int | IntV) -> IntV:
        if isinstance(o, int) and o == 1:
            return self
        if isinstance(o, int) and o > 0 and o & (o - 1) == 0:
            return IntV(self.b, self.b.shl(self.v, ir.Constant(self.v.type, o.bit_length() - 1)))
        return IntV(self.b, self.b.mul(self.v, self._c(o)))

    __rmul__ = __mul__

    def __floordiv__(self, o: int) -> IntV:
        assert o > 0 and o & (o - 1) == 0, o
        return self if o == 1 else IntV(self.b, self.b.lshr(self.v, ir.Constant(self.v.type, o.bit_length() - 1)))

    def __mod__(self, o: int) -> IntV:
        assert o > 0 and o & (o - 1) == 0, o
        return IntV(self.b, self.b.and_(self.v, ir.Constant(self.v.type, o - 1)))

    def __xor__(self, o: int | IntV) -> IntV:
        return IntV(self.b, self.b.xor(self.v, self._c(o)))

    __rxor__ = __xor__

    def wide(self) -> IntV:
        return IntV(self.b, self.b.zext(self.v, I64)) if self.v.type != I64 else self


def sreg(b: ir.IRBuilder, name: str) -> ir.Value:
    return b.call(declare(b.module, f"llvm.nvvm.read.ptx.sreg.{name}", ir.FunctionType(I32, [])), [])


def counted_loop(b: ir.IRBuilder, start: ir.Value, stop: int, step: ir.Value | int,
          body: Callable[[ir.Value], None], name: str) -> None:
    """``for (v = start; v < stop; v += step) body(v)`` on i64 values (``start`` >= 0)."""
    head = b.append_basic_block(f"{name}.head")
    inside = b.append_basic_block(f"{name}.body")
    done = b.append_basic_block(f"{name}.done")
    before = b.block
    b.branch(head)
    b.position_at_end(head)
    v = b.phi(I64, name=name)
    v.add_incoming(start, before)
    b.cbranch(b.icmp_unsigned("<", v, ir.Constant(I64, stop)), inside, done)
    b.position_at_end(inside)
    body(v)
    nxt = b.add(v, step if isinstance(step, ir.Value) else ir.Constant(I64, step))
    v.add_incoming(nxt, b.block)
    b.branch(head)
    b.position_at_end(done)


def if_then(b: ir.IRBuilder, cond: ir.Value, then: Callable[[], None], name: str) -> None:
    inside = b.append_basic_block(f"{name}.then")
    after = b.append_basic_block(f"{name}.end")
    b.cbranch(cond, inside, after)
    b.position_at_end(inside)
    then()
    b.branch(after)
    b.position_at_end(after)


def half_type(dt: DType) -> ir.Type:
    return ir.HalfType() if dt is DType.FLOAT16 else I16


def store_type(dt: DType) -> ir.Type:
    if dt is DType.FLOAT32:
        return F32
    return ir.HalfType() if dt is DType.FLOAT16 else I16


def round_to(b: ir.IRBuilder, v: ir.Value, dt: DType) -> ir.Value:
    """float32 ``v`` in the output's memory type (bfloat16: round to nearest even)."""
    if dt is DType.FLOAT32:
        return v
    if dt is DType.FLOAT16:
        return b.fptrunc(v, ir.HalfType())
    bits = b.bitcast(v, I32)
    lsb = b.and_(b.lshr(bits, ir.Constant(I32, 16)), ir.Constant(I32, 1))
    rounded = b.add(bits, b.add(ir.Constant(I32, 0x7FFF), lsb))
    return b.trunc(b.lshr(rounded, ir.Constant(I32, 16)), I16)
