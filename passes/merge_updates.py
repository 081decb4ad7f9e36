"""The `merge-updates` pass: an assignment and a later pointwise update of it as one statement.

Derived gradients write an adjoint in pieces: ``c_grad(n, d) = f`` and, a few statements later,
``c_grad(n, d) += g``. On the GPU each piece is a phase that stores the tensor and the next
reads it again, and a temporary written twice is not a candidate for `inline-temporaries`, so
it lives in global memory (a layernorm's gradient wrote and re-read the N × D ``c_grad``).
This pass rewrites, at the position of the update::

    c_grad(n, d) = f                      (dropped)
    var_grad(n) +=! ...                   var_grad(n) +=! ...
    c_grad(n, d) += g               ->    c_grad(n, d) = f + g

after which ``c_grad`` has one writer, and `inline-temporaries` (run after this pass)
recomputes it at its reads.

A pair ``D: T(i) = f`` / ``U: T(j) op= g`` (``op`` ``+`` or ``*``) is merged only when that is
exactly the original semantics: neither has a reduction index, nor ``!``; both cover the same
box (each index over the same range, in the same order); no statement between them reads or
writes ``T``; none from ``D`` to before ``U`` writes a tensor ``f`` reads (``f`` sees the same
values later); neither ``f`` nor ``g`` reads ``T``; ``T``'s type is its compute type and that
of ``f`` and ``g`` (a half-precision ``T`` would round ``f`` before the update). The scop
and dependences are rebuilt from the new function. Must run before `schedule`.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

from .. import ir as tc
from ..poly.state import CompileState
from .base import Pass, register

__all__ = ["MergeUpdates", "merge_updates"]

_OPS = {tc.Reduction.ADD: "+", tc.Reduction.MUL: "*"}


@register
@dataclass(frozen=True)
class MergeUpdates(Pass):
    """Fold an assignment into a later pointwise ``+=``/``*=`` of the same box (see the module
    docstring). Requires no schedule; any schedule is discarded (run it before `schedule`)."""

    name = "merge-updates"

    def run(self, state: CompileState) -> CompileState:
        fn = merge_updates(state.fn)
        if fn is state.fn:
            return state
        return CompileState.initial(fn, state.sizes, state.ctx)


def merge_updates(fn: tc.Function) -> tc.Function:
    """``fn`` with every mergeable pair merged (the same object when there is none)."""
    statements = list(fn.statements)
    changed = False
    while True:
        pair = next(((k, j) for k in range(len(statements))
                     for j in range(k + 1, len(statements)) if _mergeable(fn, statements, k, j)),
                    None)
        if pair is None:
            break
        k, j = pair
        d, u = statements[k], statements[j]
        names = dict(zip(d.lhs, u.lhs, strict=True))
        f = tc.replace_indices(d.rhs, lambda i, names=names: dataclasses.replace(i, name=names[i.name]))
        dtype = fn.tensor(u.tensor).dtype
        rhs = tc.Binary(_OPS[u.reduction], f, u.rhs, dtype)  # type: ignore[index]
        statements[j] = dataclasses.replace(u, reduction=None, rhs=rhs)
        del statements[k]
        changed = True
    return dataclasses.replace(fn, statements=tuple(statements)) if changed else fn


def _reads(e: tc.Expr) -> set[str]:
    return {x.tensor for x in tc.walk(e) if isinstance(x, tc.Read)}


def _pointwise(st: tc.Statement) -> bool:
    return not st.init and not st.reduction_indices and st.index_names == st.lhs


def _mergeable(fn: tc.Function, statements: list[tc.Statement], k: int, j: int) -> bool:
    d, u = statements[k], statements[j]
    if d.tensor != u.tensor or d.reduction is not None or u.reduction not in _OPS:
        return False
    if not (_pointwise(d) and _pointwise(u)) or len(set(d.lhs)) != len(d.lhs):
        return False
    if [(r.lo, r.hi) for r in d.ranges] != [(r.lo, r.hi) for r in u.ranges]:
        return False
    dtype = fn.tensor(d.tensor).dtype
    if dtype.compute != dtype or d.rhs.dtype != dtype or u.rhs.dtype != dtype:
        return False
    f_reads = _reads(d.rhs)
    if d.tensor in f_reads or d.tensor in _reads(u.rhs):
        return False
    for st in statements[k + 1:j]:
        if st.tensor == d.tensor or d.tensor in _reads(st.rhs) or st.tensor in f_reads:
            return False
        # an index expression that reads the tensor (a gather) is a read too
        if any(d.tensor in _reads(i) for x in tc.walk(st.rhs) if isinstance(x, tc.Read)
               for i in x.indices):
            return False
    return True
