"""Row-local temporaries on the host: a temporary kept one row at a time on the calling thread's
stack instead of in a full-size buffer.

A group's parallel loop ``for (c0 ...)`` (`lower.find_parallel_loop`) runs its iterations in
chunks, one chunk per thread, each chunk's iterations in order. When every access to a
temporary ``T`` in the group is to row ``T(c0, ...)`` of the iteration making it, no value of
``T`` crosses iterations, so one buffer of a row serves them all: the body function gets a stack
row (``alloca``, per call, hence per thread) and addresses ``T(c0, i1, ...)`` as row element
``(i1, ...)``. Softmax, as the default cpu options schedule it::

    for (c0 = 0; c0 < N; c0++) {          e(n, m) = exp(X(n, m) - mx(n)): each c0 writes row
      S0_init(c0); for (c1) S0(c0, c1);   e(c0, *) and reads it back (S2, S3); e lives in
      for (c1) S1(c0, c1);                one M-element row in L1 instead of N x M floats
      S2_init(c0); for (c1) S2(c0, c1);   written to memory and read back (and the fresh
      for (c1) S3(c0, c1);                16 MiB of a 4096x1024 call faulted in each call)
    }

``T`` qualifies (`row_local_temporaries`) when all the sizes are fixed at compile time, no
other group touches ``T``, its row fits in what is left of `ROW_BYTES` (the group's rows
together, in the order of the temporaries), the first statement writing
``T`` sets every element before anything reads it (`binding.needs_zero_fill` is false: a row
is then fully written in its iteration before it is read, so an element never shows a value
of an earlier row), and every access of ``T`` by a statement called in the group, the left-hand
side and every read, has a plain index as its first index whose value in the loop AST's call is
the loop's iterator itself, and affine, gather-free other indices. Anything else keeps the
full-size buffer. The runtime allocates nothing for row-local temporaries
(`HostKernel.on_chip`).
"""

from __future__ import annotations

import math
from collections.abc import Mapping

import islpy as isl

from .. import ir as tc
from ..affine import to_isl
from ..binding import needs_zero_fill
from .ast_groups import STATEMENT_NAME

__all__ = ["ROW_BYTES", "row_local_temporaries"]

#: The most bytes of stack rows one group keeps (the pool's threads have the platform's
#: default stack, 8 MiB on Linux; rows this size stay in L2 between their phases).
ROW_BYTES = 128 << 10

_T = isl.ast_expr_op_type


def row_local_temporaries(fn: tc.Function, node: isl.AstNode, loop: isl.AstNode | None,
                          elsewhere: set[str], sizes: Mapping[str, int]) -> dict[str, int]:
    """The temporaries of group ``node`` (whose parallel loop is ``loop``) that can live in a
    row buffer, with the elements of a row (see the module docstring); ``elsewhere``: the
    tensors other groups touch, ``sizes``: the sizes fixed at compile time."""
    if loop is None or not fn.temporaries or any(s not in sizes for s in fn.sizes):
        return {}
    candidates: dict[str, int] = {}
    for t in fn.temporaries:
        if t.rank == 0 or t.name in elsewhere or needs_zero_fill(fn, t, sizes):
            continue
        candidates[t.name] = math.prod(e.evaluate(sizes) for e in t.shape[1:])
    if not candidates:
        return {}
    it = loop.for_get_iterator().get_id().get_name()
    calls = _calls(node)
    if calls is None:
        return {}
    for k, init, args in calls:
        st = fn.statements[k]
        dims = st.lhs if init else st.index_names
        on_iterator = {d for d, a in zip(dims, args, strict=False)
                       if a.get_type() == isl.ast_expr_type.id and a.get_id().get_name() == it}
        accesses = [(st.tensor, tuple(tc.Index(n) for n in st.lhs))]
        if not init:
            accesses += [(x.tensor, x.indices) for x in tc.walk(st.rhs) if isinstance(x, tc.Read)]
        for tensor, indices in accesses:
            if tensor in candidates and not _row_access(indices, on_iterator):
                del candidates[tensor]
    out, total = {}, 0
    for name, row in candidates.items():  # in the order of `fn.temporaries`, up to ROW_BYTES
        size = row * fn.tensor(name).dtype.itemsize
        if total + size <= ROW_BYTES:
            out[name] = row
            total += size
    return out


def _row_access(indices: tuple[tc.Expr, ...], on_iterator: set[str]) -> bool:
    first = indices[0]
    if not isinstance(first, tc.Index) or first.name not in on_iterator:
        return False
    return all(to_isl(ie) is not None and not any(isinstance(x, tc.Read) for x in tc.walk(ie))
               for ie in indices[1:])


def _calls(node: isl.AstNode) -> list[tuple[int, bool, list[isl.AstExpr]]] | None:
    """``(statement, init, arguments)`` of every statement call under ``node``; None when the
    group holds anything else that reads or writes tensors (copy statements, a packed
    contraction's mark, whose code addresses tensors itself)."""
    out: list[tuple[int, bool, list[isl.AstExpr]]] = []
    ok = True

    def visit(n: isl.AstNode) -> bool:
        nonlocal ok
        kind = n.get_type()
        if kind == isl.ast_node_type.mark and n.mark_get_id().get_name().startswith("host-gemm"):
            ok = False
        elif kind == isl.ast_node_type.user:
            call = n.user_get_expr()
            m = None
            if call.get_type() == isl.ast_expr_type.op and call.get_op_type() == _T.call:
                m = STATEMENT_NAME.match(call.get_op_arg(0).get_id().get_name())
            if m is None:
                ok = False
            else:
                out.append((int(m.group(1)), m.group(2) is not None,
                            [call.get_op_arg(i) for i in range(1, call.get_op_n_arg())]))
        return ok

    node.foreach_descendant_top_down(visit)
    return out if ok else None
