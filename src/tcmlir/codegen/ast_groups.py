"""What an isl AST to lower holds, read without building LLVM: its groups and their tensors.

`top_level_groups`: the groups of the host ABI (the top-level children of the root block, or
the whole AST); `find_parallel_loop`: a group's chunkable loop and `upper_bound` its
condition's bound; `group_tensors`: the tensors a group's (or a kernel's) statements and
promoted copies touch, `statement_tensors` one statement's, `communicated_tensors` those a
kernel's statements hand each other through memory. `STATEMENT_NAME` matches the isl names of
the statements (``S<k>``, ``S<k>_init``). Used by `lower` (the walk, the module) and by the
row, reduction and kernel code of the NVPTX target.
"""

from __future__ import annotations

import re
from typing import Any

import islpy as isl

from .. import ir as tc
from ..errors import CodegenError
from ..poly.promotion import COPY_STMT
from .isl_exprs import id_names

__all__ = ["STATEMENT_NAME", "communicated_tensors", "find_parallel_loop", "group_tensors",
           "statement_tensors", "top_level_groups", "upper_bound"]

_T = isl.ast_expr_op_type
STATEMENT_NAME = re.compile(r"S(\d+)(_init)?$")


def top_level_groups(root: isl.AstNode) -> list[isl.AstNode]:
    """The groups of ``root``: the children of a root block, else the root itself."""
    if root.get_type() == isl.ast_node_type.block:
        kids = root.block_get_children()
        return [kids.get_at(i) for i in range(kids.n_ast_node())]
    return [root]


def find_parallel_loop(node: isl.AstNode) -> isl.AstNode | None:
    """The group's chunkable loop: the first loop under a ``parallel`` mark reached from the
    root through marks and else-less ``if``s only, with a condition ``c <= e`` or ``c < e``."""
    marked = False
    while True:
        kind = node.get_type()
        if kind == isl.ast_node_type.mark:
            if marked:  # another mark (`parallel-end`) before any loop: the loop was degenerate
                return None
            marked = node.mark_get_id().get_name() == "parallel"
            node = node.mark_get_node()
        elif kind == isl.ast_node_type.if_ and not node.if_has_else_node():
            node = node.if_get_then_node()
        elif kind == isl.ast_node_type.for_ and marked:
            return node if upper_bound(node) is not None else None
        else:
            return None


def upper_bound(loop: isl.AstNode) -> tuple[isl.AstExpr, bool] | None:
    """(e, inclusive) for a loop condition ``it <= e`` / ``it < e`` with e free of ``it``."""
    it = loop.for_get_iterator().get_id().get_name()
    cond = loop.for_get_cond()
    if cond.get_type() != isl.ast_expr_type.op or cond.get_op_type() not in (_T.le, _T.lt):
        return None
    lhs, rhs = cond.get_op_arg(0), cond.get_op_arg(1)
    if lhs.get_type() != isl.ast_expr_type.id or lhs.get_id().get_name() != it or it in id_names(rhs):
        return None
    if it in id_names(loop.for_get_init()) | id_names(loop.for_get_inc()):
        return None
    return rhs, cond.get_op_type() == _T.le


def group_tensors(fn: tc.Function, node: isl.AstNode, promotion: Any = None) -> tuple[str, ...]:
    """The tensors the statements called in ``node`` write or read (gather indices included),
    and those whose promoted buffers (``promotion``'s) its copy statements fill or drain, in
    ``fn.tensors`` order: a host group's body and a CUDA kernel take only these, so a
    definition with many groups (kernels) and many tensors lowers in time linear in its size,
    not in groups x tensors."""
    used: set[str] = set()
    seen: set[int] = set()
    buffers: set[str] = set()

    def visit(n: isl.AstNode) -> bool:
        if n.get_type() == isl.ast_node_type.user:
            call = n.user_get_expr()
            if call.get_type() == isl.ast_expr_type.op and call.get_op_type() == _T.call:
                name = call.get_op_arg(0).get_id().get_name()
                m = STATEMENT_NAME.match(name)
                if m is not None and int(m.group(1)) < len(fn.statements):
                    seen.add(int(m.group(1)))
                copy = COPY_STMT.match(name)
                if copy is not None:
                    buffers.add(copy.group(2))
        return True

    node.foreach_descendant_top_down(visit)
    for k in seen:
        used.update(statement_tensors(fn.statements[k]))
    if buffers:
        if promotion is None:
            raise CodegenError(f"copy statements of buffers {sorted(buffers)} without a promotion")
        used.update(promotion.buffer(b).tensor for b in buffers)
    return tuple(sorted(used, key=fn.tensor_position))


def statement_tensors(st: tc.Statement) -> set[str]:
    """The tensors statement ``st`` writes or reads (gather indices included)."""
    return {st.tensor, *(e.tensor for e in tc.walk(st.rhs) if isinstance(e, tc.Read))}


def communicated_tensors(fn: tc.Function, statements: set[int]) -> frozenset[str]:
    """Tensors that ``statements`` (one kernel's) write and then read elsewhere than at the
    written element by the same statement: another statement reads them (softmax's ``tmp(n)``
    summed by thread 0's combine, then read by every thread after a barrier), or the writer reads
    other elements. Their pointers get no ``noalias``: it tells LLVM that nothing else touches
    the memory during the call, so it kept a value loaded before a barrier in a register across
    the barrier and another thread's store (other threads are invisible to that attribute)."""
    out: set[str] = set()
    for k in statements:
        st = fn.statements[k]
        for j in statements:
            for rd in (x for x in tc.walk(fn.statements[j].rhs) if isinstance(x, tc.Read)):
                if rd.tensor != st.tensor:
                    continue
                own = tuple(getattr(i, "name", None) for i in rd.indices) == st.lhs
                if j != k or not own:
                    out.add(st.tensor)
    return frozenset(out)
