"""Column partials inside a row kernel on NVPTX: what ``accumulate S<k> over-rows atomic`` becomes.

`passes/map_mixed.py` can run a column reduction (``G_grad(d) +=! O_grad(n, d) * ...``) as a
phase of the row kernel: every block walks its rows, and in each row every thread meets its
columns ``d = _tx + B j`` (the stride loop unrolled by isl: one call of ``S<k>`` per ``j`` in
the loop AST). Under the mark (below the ``rows`` mark, `codegen.gpu_rows`), each such *call
site* gets its own private accumulator — an alloca set to the reduction's identity in the
kernel's entry block, so it lives across the row loop and LLVM keeps it in a register — and
the instance folds its right-hand side into it instead of the lhs in memory. After the row
loop (the end of the ``rows`` mark) every thread folds each of its accumulators into its lhs
element atomically (``red.global.add`` for sums, compare-and-swap otherwise), one atomic per
thread and column per block instead of one per row.

A call site stands for one lhs element in every row only when its lhs arguments name no loop
iterator (only block/thread indices and sizes): that is checked here, a `CodegenError`
otherwise (map-mixed fuses only when the stride loop is unrolled).
"""

from __future__ import annotations

from dataclasses import dataclass

import islpy as isl
from llvmlite import ir

from ..errors import CodegenError
from .ast_groups import STATEMENT_NAME
from .exprs import ExprEmitter, const, value_type
from .gpu_reduce import fold_atomically, fold_rhs
from .isl_exprs import id_names
from .lower import GroupWalker

__all__ = ["RowPartials"]

_MAPPING = {"_bx", "_by", "_bz", "_tx", "_ty", "_tz"}


class RowPartials:
    """The accumulators of ``over-rows`` column phases of one row kernel, by call site."""

    def __init__(self, walker: GroupWalker):  # a `gpu_rows.RowWalker`, which makes it
        self.walker = walker
        self.active: set[int] = set()
        self.slots: dict[tuple[int, tuple[str, ...]], _Slot] = {}

    def user(self, node: isl.AstNode) -> bool:
        """Lower ``node`` into its call site's accumulator when it is an instance of an active
        column phase (True), else leave it to the caller (False)."""
        call = node.user_get_expr()
        m = STATEMENT_NAME.match(call.get_op_arg(0).get_id().get_name())
        if m is None or m.group(2) or int(m.group(1)) not in self.active:
            return False
        w = self.walker
        k = int(m.group(1))
        st = w.fn.statements[k]
        exprs = [call.get_op_arg(i + 1) for i in range(call.get_op_n_arg() - 1)]
        if len(exprs) != len(st.index_names):
            raise CodegenError(f"isl AST call {call.to_C_str()} has {len(exprs)} arguments")
        lhs = [exprs[st.index_names.index(n)] for n in st.lhs]
        free = set().union(*(id_names(e) for e in lhs)) - _MAPPING - set(w.fn.sizes)
        if free:
            raise CodegenError(f"accumulate S{k} over-rows: the lhs of {call.to_C_str()} depends "
                               f"on the loop iterator(s) {sorted(free)}: a register per call site "
                               "would hold several elements (the stride loop must be unrolled)")
        key = (k, tuple(e.to_C_str() for e in lhs))
        slot = self.slots.get(key)
        if slot is None:
            slot = self._slot(k, lhs)
            self.slots[key] = slot
        args = [w.expr(e) for e in exprs]
        em = ExprEmitter(w, dict(zip(st.index_names, args, strict=True)), k)
        fold_rhs(w, em, st, slot.acc)
        return True

    def _slot(self, k: int, lhs: list[isl.AstExpr]) -> _Slot:
        """An accumulator initialised once, in the entry block, to the identity."""
        w = self.walker
        st = w.fn.statements[k]
        dt = w.fn.tensor(st.tensor).dtype.compute
        acc = w.entry.alloca(value_type(dt), name=f"part.acc.{k}")
        w.entry.store(const(dt, st.reduction.identity(dt)), acc)  # type: ignore[union-attr]
        return _Slot(k, acc, lhs)

    def fold(self) -> None:
        """After the row loop: every accumulator into its lhs element, atomically. The lhs
        is evaluated again from the call site's arguments (block/thread indices and sizes
        only), so no offset is kept in a register across the loop; a thread that ran no row
        folds the identity, which changes nothing."""
        w = self.walker
        b = w.builder
        for slot in self.slots.values():
            st = w.fn.statements[slot.statement]
            dt = w.fn.tensor(st.tensor).dtype.compute
            em = ExprEmitter(w, {}, slot.statement)
            off = em.offset(st.tensor, [w.expr(e) for e in slot.lhs])
            acc = b.load(slot.acc)
            fold_atomically(em, st, off, acc, dt)  # red.global.add for sums
        self.slots = {}


@dataclass
class _Slot:
    statement: int
    acc: ir.Value                # alloca of the value type
    lhs: list[isl.AstExpr]       # the call site's lhs arguments
