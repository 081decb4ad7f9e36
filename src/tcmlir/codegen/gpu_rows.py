"""Row kernels on NVPTX: what a ``rows threads=B local=...`` mark (`passes/map_rows.py`) becomes.

Below the mark lies the grid-strided row loop (or, with one row per block, its body alone);
the body is a sequence of phases, one per statement. Lowering:

* each ``local`` tensor (a temporary of which a row touches only its own element, e.g.
  softmax's ``mx(n)``) lives in a one-element static shared array (address space 3): its
  statements' loads and stores go there (`exprs.ExprEmitter.address` asks `local_slot`), so
  it never exists in global memory;
* after the barrier that ends a phase writing a local tensor, every thread loads its element
  once, where the load dominates the rest of the row, and later phases read that register
  (`local_value`) until a phase writes the tensor again;
* after each phase of the body a block barrier (``llvm.nvvm.barrier0``), except after a
  ``reduction`` mark, whose combine already ends with one (and between the pieces isl makes of
  one phase, e.g. a statement's initialisation and its combine): the phase's writes (global and
  shared) are then visible to every thread of the block, and the barrier at the end of the
  body keeps the next row's writes of the shared slots after this row's reads.

Barriers must be reached by every thread of the block: `map-rows` proves with isl that every
``_tx`` has instances below the mark and below each reduction mark at every row; here each
barrier additionally checks that no enclosing ``if`` or loop reads a thread index, and each
phase that it runs only one statement, or statements that touch nothing another one writes, or
statements that thread 0 alone runs (``if (_tx == 0) { S2; S3; }``: program order suffices) (a
`CodegenError` otherwise, never a kernel that hangs or races). `on_chip_tensors` names the temporaries
that need no global buffer (local ones, and those no statement touches any more, after
`inline-temporaries`).

An ``accumulate S<k> atomic`` mark (`passes/map_columns.py`) keeps one accumulator per thread
and folds it into its lhs element atomically, without barriers; ``accumulate S<k>,S<j> atomic``
(`passes/map_mixed.py`: column reductions over the same rows) one per listed statement;
``accumulate S<k> over-rows atomic``, a column phase inside the row loop, one per call site
across the rows, folded after the row loop (`codegen.gpu_partials`).
"""

from __future__ import annotations

import re

import islpy as isl
from llvmlite import ir

from .. import ir as tc
from ..errors import CodegenError
from .ast_groups import STATEMENT_NAME
from .exprs import ExprEmitter, memory_type
from .gpu_partials import RowPartials
from .gpu_reduce import (
    ReducingWalker,
    ReductionScope,
    _barrier,
    _if,
    _shared,
    enter,
    fold_atomically,
)
from .isl_exprs import id_names

__all__ = ["RowWalker", "barrier_after", "flat_phases", "is_reduction_mark", "on_chip_tensors",
           "one_thread", "parse_rows_mark", "phase_statements"]

_THREADS = {"_tx", "_ty", "_tz"}


def parse_rows_mark(name: str) -> tuple[int, tuple[str, ...]] | None:
    """(threads, local tensors) of a ``rows threads=B local=a,b`` mark name, else None."""
    text = name.strip()
    if not text.startswith("rows threads="):
        return None
    head, _, local = text.partition(" local=")
    try:
        threads = int(head.removeprefix("rows threads="))
    except ValueError:
        raise CodegenError(f"bad rows mark {name!r}") from None
    return threads, tuple(t for t in local.split(",") if t)


def _reads(e: tc.Expr) -> set[str]:
    return {x.tensor for x in tc.walk(e) if isinstance(x, tc.Read)}


def on_chip_tensors(fn: tc.Function, local: set[str]) -> tuple[str, ...]:
    """Temporaries of ``fn`` that need no global buffer: ``local`` ones and untouched ones."""
    touched = {st.tensor for st in fn.statements}
    for st in fn.statements:
        touched |= _reads(st.rhs)
    return tuple(t.name for t in fn.temporaries if t.name in local or t.name not in touched)


def flat_phases(node: isl.AstNode) -> list[isl.AstNode]:
    """The nodes of ``node`` with nested blocks expanded (isl groups a sequence's children
    into blocks of blocks as it likes; the phases are the leaves of that nesting)."""
    if node.get_type() != isl.ast_node_type.block:
        return [node]
    kids = node.block_get_children()
    return [x for i in range(kids.n_ast_node()) for x in flat_phases(kids.get_at(i))]


def phase_statements(node: isl.AstNode) -> set[int]:
    """The statement numbers (``S<k>`` and ``S<k>_init``) called in ``node``'s subtree."""
    return {k for k, _ in _calls(node)}


def _calls(node: isl.AstNode) -> set[tuple[int, bool]]:
    """The statements called in ``node``'s subtree: (number, whether it is the ``_init``)."""
    found: set[tuple[int, bool]] = set()

    def visit(n: isl.AstNode) -> bool:
        if n.get_type() == isl.ast_node_type.user:
            m = STATEMENT_NAME.match(n.user_get_expr().get_op_arg(0).get_id().get_name())
            if m:
                found.add((int(m.group(1)), m.group(2) is not None))
        return True

    node.foreach_descendant_top_down(visit)
    return found


def independent_calls(fn: tc.Function, calls: set[tuple[int, bool]]) -> bool:
    """Whether no statement of ``calls`` (number, is it the ``_init``) touches what another
    one writes, so that they need no barrier between them whichever threads run them. isl
    fuses the phases of statements under the same guard into one ``if`` (``if (_tx == 0) {
    S0(..); S1_init(..); }`` when both run on thread 0). An ``_init`` reads nothing."""
    writes = {k: fn.statements[k].tensor for k, _ in calls}
    for k, init in calls:
        st = fn.statements[k]
        touched = {st.tensor} | (set() if init else _reads(st.rhs))
        if touched & {t for j, t in writes.items() if j != k}:
            return False
    return True


def barrier_after(phases: list[isl.AstNode], touched: list[set[int]], i: int) -> bool:
    """Whether the row body puts a block barrier after ``phases[i]`` (``touched``: the
    statements of each phase): not after a reduction mark, whose combine ends with one, nor
    between the pieces of one statement's phase (its init, then its combine; or unrolled
    copies): map-rows proved its instances in a row independent (other than through its
    reduction, whose fold thread 0 does after its own init). The simulator follows it."""
    same_next = i + 1 < len(phases) and touched[i + 1] == touched[i]
    return not is_reduction_mark(phases[i]) and not same_next


def one_thread(node: isl.AstNode) -> bool:
    """Whether ``node`` is ``if (_tx == 0) ...`` without an else: one thread runs its
    statements, in program order, so they need no barrier between them (isl fuses the phases
    of statements pinned to thread 0 into one such ``if``: moments' ``mean(n) = mean(n) / K``
    and ``var(n) = var(n) / K - mean(n) * mean(n)``). ``_ty`` and ``_tz`` are pinned to 0 by
    the kernel's filter."""
    if node.get_type() != isl.ast_node_type.if_ or node.if_has_else_node():
        return False
    cond = node.if_get_cond()
    if cond.get_type() != isl.ast_expr_type.op or cond.get_op_type() != isl.ast_expr_op_type.eq:
        return False
    args = [cond.get_op_arg(i) for i in range(cond.get_op_n_arg())]
    ids = [a.get_id().get_name() for a in args if a.get_type() == isl.ast_expr_type.id]
    zeros = [a for a in args if a.get_type() == isl.ast_expr_type.int and a.get_val().to_python() == 0]
    return ids == ["_tx"] and len(zeros) == 1


def is_reduction_mark(node: isl.AstNode) -> bool:
    return (node.get_type() == isl.ast_node_type.mark
            and node.mark_get_id().get_name().startswith("reduction "))


class RowWalker(ReducingWalker):
    """The kernel walk with ``rows`` marks (and reduction marks, inherited)."""

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.local: dict[str, ir.Value] = {}
        self.local_values: dict[str, ir.Value] = {}  # a local element read once after its phase
        self.local_seen: set[str] = set()
        self.thread_guards = 0      # enclosing ifs/loops that read a thread index
        self._row_body_next = False
        self._in_rows = False
        self.partials = RowPartials(self)  # `accumulate S<k> over-rows atomic` (gpu_partials)

    # ---- what ExprEmitter asks

    def local_slot(self, tensor: str) -> ir.Value | None:
        return self.local.get(tensor)

    def local_value(self, tensor: str) -> ir.Value | None:
        """The row's element of local ``tensor`` as loaded once after the barrier that ended
        the phase writing it, while no later phase has written it again (None otherwise)."""
        return self.local_values.get(tensor)

    # ---- the marks

    def row_mark(self, name: str, child: isl.AstNode) -> None:
        over = re.match(r"^accumulate (S\d+(?:,S\d+)*) over-rows atomic$", name.strip())
        if over is not None:
            if not self._in_rows:
                raise CodegenError(f"mark {name!r} outside a rows mark")
            ks = {int(x[1:]) for x in over.group(1).split(",")}
            self.partials.active |= ks
            self.node(child)
            self.partials.active -= ks
            return
        m = re.match(r"^accumulate (S\d+(?:,S\d+)*) atomic$", name.strip())
        if m is not None:
            statements = [int(x[1:]) for x in m.group(1).split(",")]
            if self.scopes:
                raise CodegenError(f"accumulate mark of {m.group(1)} inside a reduction mark")
            scopes = [enter(self, k, 1) for k in statements]
            self.scopes.extend(scopes)
            self.node(child)
            del self.scopes[-len(scopes):]
            for scope in scopes:
                self.fold_private(scope)
        else:
            self.rows(name, child)

    def fold_private(self, scope: ReductionScope) -> None:
        """``accumulate S<k>[,S<j>...] atomic``: every thread sums its instances of each
        ``S<k>`` below the mark (one lhs element per thread and statement) in a register, then
        folds it into the element atomically (other blocks fold into it too). No barrier:
        threads do not combine."""
        statement = scope.statement
        b = self.builder
        st = self.fn.statements[statement]
        dt = self.fn.tensor(st.tensor).dtype.compute
        acc, off = b.load(scope.acc), b.load(scope.offset)
        done = _if(b, b.icmp_signed(">=", off, ir.Constant(ir.IntType(64), 0)), "acc.fold")
        em = ExprEmitter(self, {}, statement)
        fold_atomically(em, st, off, acc, dt)  # red.global.add for sums
        b.branch(done)
        b.position_at_end(done)

    def rows(self, name: str, child: isl.AstNode) -> None:
        parsed = parse_rows_mark(name)
        assert parsed is not None
        if self._in_rows:
            raise CodegenError(f"rows mark {name!r} inside another rows mark")
        _, local = parsed
        self.local_seen |= set(local)
        zero = ir.Constant(ir.IntType(64), 0)
        for t in local:
            ty = memory_type(self.fn.tensor(t).dtype)
            slot = _shared(self.builder.module, ty, 1, f"rows.{t}")
            self.local[t] = slot.gep([zero, zero])
        self._in_rows = True
        self._row_body_next = True
        self.node(child)
        self.partials.fold()  # after the row loop: the column partials, one atomic each
        self._in_rows = False
        self.local = {}

    def node(self, node: isl.AstNode) -> None:
        if not self._row_body_next:
            super().node(node)
            return
        kind = node.get_type()
        if kind in (isl.ast_node_type.for_, isl.ast_node_type.if_):
            if kind == isl.ast_node_type.if_ and node.if_has_else_node():
                raise CodegenError("rows mark: an if with an else around the row loop")
            super().node(node)  # the loop (or uniform guard) around the row body
            return
        self._row_body_next = False
        self.row_body(node)

    def row_body(self, node: isl.AstNode) -> None:
        phases = flat_phases(node)
        touched = [phase_statements(p) for p in phases]
        writes = [{self.fn.statements[k].tensor for k in t} & set(self.local) for t in touched]
        self.local_values = {}
        for i, phase in enumerate(phases):
            if len(touched[i]) > 1 and not self._independent(phase) and not one_thread(phase):
                # isl split the row loop: dependent statements would share a barrier interval
                raise CodegenError(f"internal: one phase of a row body runs statements "
                                   f"{sorted(touched[i])}; map-rows gives each its own phase")
            for t in writes[i]:
                self.local_values.pop(t, None)
            self.node(phase)
            same_next = i + 1 < len(phases) and touched[i + 1] == touched[i]
            if barrier_after(phases, touched, i):
                self.barrier()
            if not same_next and any(self._reads_any(touched[j], writes[i])
                                     for j in range(i + 1, len(phases))):
                # after the phase's barrier (a reduction's combine ends with one) every thread
                # reads the new values once, here, where the load dominates the rest of the
                # row: later phases use the register (softmax's two exp(X - mx) then are one
                # value to LLVM, where a load after each barrier was a different one)
                for t in sorted(writes[i]):
                    ty = memory_type(self.fn.tensor(t).dtype)
                    self.local_values[t] = self.builder.load(self.local[t], typ=ty)
        self.local_values = {}

    def _independent(self, phase: isl.AstNode) -> bool:
        return independent_calls(self.fn, _calls(phase))

    def _reads_any(self, statements: set[int], tensors: set[str]) -> bool:
        return any(_reads(self.fn.statements[k].rhs) & tensors for k in statements)

    def barrier(self) -> None:
        if self.thread_guards:
            raise CodegenError("internal: a block barrier under a condition that reads the thread "
                               "index (not every thread would reach it)")
        _barrier(self.builder)

    def user(self, node: isl.AstNode) -> None:
        if not (self.partials.active and self.partials.user(node)):
            super().user(node)

    # ---- guards

    def _guarded(self, names: set[str], lower, node: isl.AstNode) -> None:
        inc = 1 if names & _THREADS else 0
        self.thread_guards += inc
        try:
            lower(node)
        finally:
            self.thread_guards -= inc

    def loop(self, node: isl.AstNode) -> None:
        names = (id_names(node.for_get_init()) | id_names(node.for_get_cond())
                 | id_names(node.for_get_inc()))
        self._guarded(names, super().loop, node)

    def branch(self, node: isl.AstNode) -> None:
        self._guarded(id_names(node.if_get_cond()), super().branch, node)

    def reduce(self, statement: int, threads: int, child: isl.AstNode, atomic: bool = False) -> None:
        if self._in_rows and self.thread_guards:  # (map-reduction's trees may have benign ones)
            raise CodegenError(f"internal: the combine of S{statement} lies under a condition "
                               "that reads the thread index (not every thread would reach it)")
        super().reduce(statement, threads, child, atomic)
