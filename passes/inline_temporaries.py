"""The `inline-temporaries` pass: pointwise temporaries recomputed where they are read.

A temporary ``T`` written by exactly one statement ``D: T(i, j) = f(...)`` (plain ``=``, no
reduction index) is *inlined*: every read ``T(a, b)`` in the statements after ``D`` becomes
``f`` with ``i := a, j := b``, and ``D`` is dropped (nothing reads ``T`` any more). Softmax::

    mx(n) max=! X(n, d)                      mx(n) max=! X(n, d)
    e(n, d) = exp(X(n, d) - mx(n))     ->    s(n) +=! exp(X(n, d) - mx(n))
    s(n) +=! e(n, d)                         O(n, d) = exp(X(n, d) - mx(n)) / s(n)
    O(n, d) = e(n, d) / s(n)

This trades a recomputation of ``f`` per read for a tensor that never exists: on the GPU a
row program then keeps no full-size intermediate in global memory (`map-rows`). ``T`` stays
in `ir.Function.temporaries` (so the kernel ABI does not change) but no statement touches it;
the NVPTX image lists it in ``on_chip`` and the runtime allocates nothing for it.

``D`` is inlined only when that is exactly the original semantics: ``D`` writes the whole of
``T`` (each lhs range is ``[0, extent)`` of ``T``'s shape), no statement reads ``T`` before
``D`` or inside an index expression (a gather), and no statement from ``D`` on writes a tensor
``f`` reads (so ``f`` sees the same values at every read). The scop and dependences are rebuilt
from the new function. Must run before `schedule`; leaves other temporaries alone.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

from .. import ir as tc
from ..poly.state import CompileState
from .base import Pass, register

__all__ = ["InlineTemporaries", "inline_temporaries"]


@register
@dataclass(frozen=True)
class InlineTemporaries(Pass):
    """Recompute pointwise temporaries at their reads and drop their statements (see the
    module docstring). Requires no schedule; any schedule is discarded (run it before
    `schedule`)."""

    name = "inline-temporaries"

    def run(self, state: CompileState) -> CompileState:
        fn = inline_temporaries(state.fn)
        if fn is state.fn:
            return state
        return CompileState.initial(fn, state.sizes, state.ctx)


def inline_temporaries(fn: tc.Function) -> tc.Function:
    """``fn`` with every inlinable temporary inlined (the same object when there is none)."""
    statements = list(fn.statements)
    changed = False
    while True:
        k = next((k for k in range(len(statements)) if _inlinable(fn, statements, k)), None)
        if k is None:
            break
        d = statements.pop(k)
        for j in range(k, len(statements)):
            st = statements[j]
            statements[j] = dataclasses.replace(st, rhs=_substitute(st.rhs, d))
        changed = True
    return dataclasses.replace(fn, statements=tuple(statements)) if changed else fn


def _reads(e: tc.Expr) -> list[tc.Read]:
    return [x for x in tc.walk(e) if isinstance(x, tc.Read)]


def _inlinable(fn: tc.Function, statements: list[tc.Statement], k: int) -> bool:
    d = statements[k]
    temps = {t.name for t in fn.temporaries}
    if d.tensor not in temps or d.reduction is not None or d.init or d.reduction_indices:
        return False
    if [s for s in statements if s.tensor == d.tensor] != [d]:
        return False
    tensor = fn.tensor(d.tensor)
    if len(d.lhs) != tensor.rank or len(set(d.lhs)) != len(d.lhs):
        return False
    for name, extent in zip(d.lhs, tensor.shape, strict=True):
        r = d.range_of(name)
        if r.lo != tc.SizeExpr.constant(0) or r.hi != extent:
            return False
    read_by_d = {r.tensor for r in _reads(d.rhs)}
    if d.tensor in read_by_d:
        return False
    for j, st in enumerate(statements):
        reads = _reads(st.rhs)
        if j < k and any(r.tensor == d.tensor for r in reads):
            return False  # read before it is written: the zeros of a fresh temporary
        for r in reads:  # a gather through the temporary
            if any(x.tensor == d.tensor for i in r.indices for x in _reads(i)):
                return False
        if j >= k and st.tensor in read_by_d:
            return False
    return any(r.tensor == d.tensor for st in statements[k + 1:] for r in _reads(st.rhs))


def _substitute(e: tc.Expr, d: tc.Statement) -> tc.Expr:
    """``e`` with every read of ``d.tensor`` replaced by ``d.rhs`` at the read's indices."""
    if isinstance(e, tc.Read) and e.tensor == d.tensor:
        binding = dict(zip(d.lhs, e.indices, strict=True))
        return _rename(d.rhs, binding)
    return _map_children(e, lambda c: _substitute(c, d))


def _rename(e: tc.Expr, binding: dict[str, tc.Expr]) -> tc.Expr:
    if isinstance(e, tc.Index) and e.name in binding:
        new = binding[e.name]
        return new if new.dtype == e.dtype else tc.Cast(new, e.dtype, e.span)
    return _map_children(e, lambda c: _rename(c, binding))


def _map_children(e: tc.Expr, f) -> tc.Expr:
    match e:
        case tc.Read(indices=idx):
            return dataclasses.replace(e, indices=tuple(f(i) for i in idx))
        case tc.Unary(operand=x):
            return dataclasses.replace(e, operand=f(x))
        case tc.Cast(operand=x):
            return dataclasses.replace(e, operand=f(x))
        case tc.Binary(lhs=a, rhs=b):
            return dataclasses.replace(e, lhs=f(a), rhs=f(b))
        case tc.Select(cond=c, then=t, orelse=o):
            return dataclasses.replace(e, cond=f(c), then=f(t), orelse=f(o))
        case tc.Call(args=args):
            return dataclasses.replace(e, args=tuple(f(a) for a in args))
    return e
