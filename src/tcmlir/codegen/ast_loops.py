"""Loops and branches of an isl AST -> LLVM control flow: the `LoopLowering` mixin of
`lower.GroupWalker`.

* `loop`: an LLVM loop (its iterator in an alloca; the first loop under a group's
  ``parallel`` mark is clipped to the call's chunk ``[lo, hi)``), fully unrolled by LLVM under
  an ``unroll`` mark (`poly.llvm_unroll`: constant trip counts only); under an
  ``unroll-partial`` mark (`poly.partial_tiles`) only the loops that index registers are
  unrolled, those without a constant trip count as `guarded_loop`s;
* `guarded_loop`: a loop of a partial tile over its largest trip count, each iteration guarded
  by the loop's own condition;
* `walk_iterations`: a loop under an ``unroll-walk`` mark, its body emitted once per iteration;
* `branch`: an ``if`` (with its ``else``).

The mixin reads what `GroupWalker` holds: ``builder``, ``entry`` (allocas), ``env`` (iterator
values), ``expr``, ``node``, the mark depths ``unrolled``/``partial``/``walked``, the chunk
state (``chunk_next_for``, ``chunkable``, ``lo``, ``hi``), ``loop_depth`` and ``owner`` (its
promotion: which buffers are registers).
"""

from __future__ import annotations

import islpy as isl
from llvmlite import ir

from ..errors import CodegenError
from ..poly.llvm_unroll import indexes_registers, trip_bound, trip_count
from .exprs import I64
from .isl_exprs import truth
from .target import unroll_full

__all__ = ["LoopLowering"]


class LoopLowering:
    """Loops and branches of the AST (see the module docstring); mixed into `GroupWalker`."""

    def loop(self, node: isl.AstNode) -> None:
        if self.walked:
            self.walk_iterations(node)
            return
        unroll = self.unrolled > 0
        if self.partial:  # a partial tile: only the loops that index registers are unrolled
            promotion = self.owner.promotion
            unroll = indexes_registers(node, () if promotion is None else
                                       {buf.name for buf in promotion.buffers
                                        if buf.space == "private"})
            if unroll and trip_count(node) is None:
                self.guarded_loop(node)
                return
        b = self.builder
        name = node.for_get_iterator().get_id().get_name()
        init, inc = self.expr(node.for_get_init()), self.expr(node.for_get_inc())
        chunk = self.chunk_next_for and self.chunkable
        self.chunk_next_for = False
        if chunk:
            self._chunked = True
            # first iteration value >= lo on the loop's lattice: init + ceil((lo - init)/inc)*inc
            ahead = b.sub(self.lo, init)
            steps = b.sdiv(b.add(ahead, b.sub(inc, ir.Constant(I64, 1))), inc)
            init = b.select(b.icmp_signed(">", ahead, ir.Constant(I64, 0)), b.add(init, b.mul(steps, inc)), init)
        slot = self.entry.alloca(I64, name=name)
        b.store(init, slot)
        header = b.append_basic_block(f"for.{name}")
        body = b.append_basic_block(f"for.{name}.body")
        done = b.append_basic_block(f"for.{name}.end")
        b.branch(header)
        b.position_at_end(header)
        iv = b.load(slot, name=name, typ=I64)
        saved = self.env.get(name)
        self.env[name] = iv
        cond = self.expr(node.for_get_cond())
        if chunk:
            cond = b.and_(cond, b.icmp_signed("<", iv, self.hi))
        b.cbranch(cond, body, done)
        b.position_at_end(body)
        self.loop_depth += 1
        self.node(node.for_get_body())
        self.loop_depth -= 1
        b.store(b.add(iv, inc), slot)
        latch = b.branch(header)
        if unroll:
            if trip_count(node) is None:  # `poly.loops.build_ast` kept only constant ones
                raise CodegenError(f"internal: loop {name} under an unroll mark has no constant "
                                   "trip count")
            latch.set_metadata("llvm.loop", unroll_full(b.module))
        b.position_at_end(done)
        if saved is None:
            del self.env[name]
        else:
            self.env[name] = saved

    def guarded_loop(self, node: isl.AstNode) -> None:
        """A loop of a partial tile (under an ``unroll-partial`` mark) with a ``min`` bound: an
        LLVM loop over its largest trip count (`trip_bound`) whose body runs where the loop's
        own condition holds, unrolled fully (each copy guarded, the registers indexed by
        constants as in the full tiles)."""
        trips = trip_bound(node)
        if trips is None:  # `poly.loops.build_ast` kept only bounded ones
            raise CodegenError("internal: a loop under an unroll-partial mark has no constant "
                               "largest trip count")
        b = self.builder
        name = node.for_get_iterator().get_id().get_name()
        init, inc = self.expr(node.for_get_init()), self.expr(node.for_get_inc())
        slot = self.entry.alloca(I64, name=f"{name}.trip")
        b.store(ir.Constant(I64, 0), slot)
        header = b.append_basic_block(f"for.{name}")
        test = b.append_basic_block(f"for.{name}.guard")
        body = b.append_basic_block(f"for.{name}.body")
        latch = b.append_basic_block(f"for.{name}.next")
        done = b.append_basic_block(f"for.{name}.end")
        b.branch(header)
        b.position_at_end(header)
        trip = b.load(slot, name=f"{name}.trip", typ=I64)
        b.cbranch(b.icmp_signed("<", trip, ir.Constant(I64, trips)), test, done)
        b.position_at_end(test)
        saved = self.env.get(name)
        self.env[name] = b.add(init, b.mul(trip, inc), name=name)
        b.cbranch(truth(b, self.expr(node.for_get_cond())), body, latch)
        b.position_at_end(body)
        self.loop_depth += 1
        self.node(node.for_get_body())
        self.loop_depth -= 1
        b.branch(latch)
        b.position_at_end(latch)
        b.store(b.add(trip, ir.Constant(I64, 1)), slot)
        b.branch(header).set_metadata("llvm.loop", unroll_full(b.module))
        b.position_at_end(done)
        if saved is None:
            del self.env[name]
        else:
            self.env[name] = saved

    def walk_iterations(self, node: isl.AstNode) -> None:
        """A loop under an ``unroll-walk`` mark: its body once per iteration, the iterator a
        constant where the start is one (as isl's unrolled copies were), else start + offset."""
        trips = trip_count(node)
        if trips is None:  # `poly.loops.build_ast` kept only constant ones
            raise CodegenError("internal: a loop under an unroll-walk mark has no constant "
                               "trip count")
        name = node.for_get_iterator().get_id().get_name()
        step = int(node.for_get_inc().get_val().to_python())
        first = node.for_get_init()
        saved = self.env.get(name)
        start = (int(first.get_val().to_python()) if first.get_type() == isl.ast_expr_type.int
                 else None)
        base = self.expr(first) if start is None else None
        for i in range(trips):
            self.env[name] = (ir.Constant(I64, start + i * step) if base is None
                              else self.builder.add(base, ir.Constant(I64, i * step)))
            self.node(node.for_get_body())
        if saved is None:
            del self.env[name]
        else:
            self.env[name] = saved

    def branch(self, node: isl.AstNode) -> None:
        b = self.builder
        cond = truth(b, self.expr(node.if_get_cond()))
        then_bb = b.append_basic_block("if.then")
        else_bb = b.append_basic_block("if.else") if node.if_has_else_node() else None
        join = b.append_basic_block("if.end")
        b.cbranch(cond, then_bb, else_bb or join)
        b.position_at_end(then_bb)
        self.node(node.if_get_then_node())
        b.branch(join)
        if else_bb is not None:
            b.position_at_end(else_bb)
            self.node(node.if_get_else_node())
            b.branch(join)
        b.position_at_end(join)
