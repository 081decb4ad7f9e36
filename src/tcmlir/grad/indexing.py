"""Inverting a read's index map: where the adjoint of ``X(e_0, ..., e_k)`` accumulates.

The adjoint of a read is a write into the gradient of ``X``, but TC's left-hand sides are plain
index names. `invert_read` rewrites the statement's iteration space so that the read's
indices become the left-hand side: a dimension indexed by a plain index keeps it; any other
affine dimension ``e_d`` gets a new index ``y_d`` and one index ``v`` of ``e_d`` is
eliminated, ``v = (y_d - rest) / c`` (an index of the forward left-hand side preferred, so that
a convolution's input gradient loops over the kernel window, not the whole image), guarded
by ``v``'s old range (and divisibility when ``|c| > 1``). A dimension with no index left to
eliminate becomes an equality guard. What is left of the forward indices is reduced over.
Gathers and non-affine indices are refused (their adjoint is a scatter-add).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass

from .. import ir
from ..dtypes import DType
from .emit import GradError

__all__ = ["Inverted", "invert_read", "substitute"]

_I = DType.INT32
_B = DType.BOOL


@dataclass(frozen=True)
class Inverted:
    lhs: tuple[str, ...]                 # the gradient's indices, one per dimension of X
    new: dict[str, int]                  # new index -> the dimension of X it ranges over
    subst: dict[str, ir.Expr]            # eliminated forward index -> its expression
    guards: tuple[ir.Expr, ...]          # BOOL conditions under which the point contributes
    reduce: tuple[str, ...]              # forward indices left: reduced over


def substitute(e: ir.Expr, mapping: Mapping[str, ir.Expr]) -> ir.Expr:
    """``e`` with every `ir.Index` named in ``mapping`` replaced."""
    if not mapping:
        return e
    return ir.replace_indices(e, lambda i: mapping.get(i.name, i))

def _uses_index(e: ir.Expr, names: frozenset[str]) -> bool:
    return any(isinstance(x, ir.Index) and x.name in names for x in ir.walk(e))


def _linear(e: ir.Expr, names: frozenset[str]) -> tuple[dict[str, int], list[tuple[int, ir.Expr]]] | None:
    """``e`` as ``sum c_v * v + sum s * rest`` over the indices ``names``, or None."""
    if not _uses_index(e, names):
        return {}, [(1, e)]
    match e:
        case ir.Index(name=n):
            return {n: 1}, []
        case ir.Cast(operand=x) if x.dtype.is_int:
            return _linear(x, names)
        case ir.Unary(op="-", operand=x):
            part = _linear(x, names)
            return None if part is None else _scale(part, -1)
        case ir.Binary(op=("+" | "-") as op, lhs=a, rhs=b):
            pa, pb = _linear(a, names), _linear(b, names)
            if pa is None or pb is None:
                return None
            if op == "-":
                pb = _scale(pb, -1)
            coef = dict(pa[0])
            for k, v in pb[0].items():
                coef[k] = coef.get(k, 0) + v
            return {k: v for k, v in coef.items() if v}, pa[1] + pb[1]
        case ir.Binary(op="*", lhs=a, rhs=b):
            for c, x in ((a, b), (b, a)):
                if isinstance(c, ir.Const) and not _uses_index(c, names):
                    part = _linear(x, names)
                    return None if part is None else _scale(part, int(c.value))
    return None


def _scale(part, k: int):
    coef, rest = part
    return {n: v * k for n, v in coef.items()}, [(s * k, x) for s, x in rest]


def _affine(terms: list[tuple[int, ir.Expr]]) -> ir.Expr:
    """``sum k * x`` as an INT32 IR expression."""
    out: ir.Expr | None = None
    for k, x in terms:
        if k == 0:
            continue
        x = x if x.dtype is _I else ir.Cast(x, _I)
        mag = x if abs(k) == 1 else ir.Binary("*", ir.Const(abs(k), _I), x, _I)
        if out is None:
            out = mag if k > 0 else ir.Unary("-", mag, _I)
        else:
            out = ir.Binary("+" if k > 0 else "-", out, mag, _I)
    return out if out is not None else ir.Const(0, _I)


def invert_read(read: ir.Read, stmt: ir.Statement, fresh: Callable[[str], str],
                bound: Callable[[ir.SizeExpr, str], ir.Expr], describe: str) -> Inverted:
    """How the adjoint of ``read`` (in ``stmt``) maps onto the read tensor's elements.

    ``fresh(base)`` gives an unused index name, ``bound(size, what)`` a value-position INT32
    expression for a range bound; ``describe`` names the read in errors.
    """
    indices = frozenset(stmt.index_names)
    lhs_set = frozenset(stmt.lhs)
    taken: set[str] = set()           # forward indices that became gradient indices
    subst: dict[str, ir.Expr] = {}
    guards: list[ir.Expr] = []
    lhs: list[str] = []
    new: dict[str, int] = {}
    for d, e in enumerate(read.indices):
        if any(isinstance(x, ir.Read) for x in ir.walk(e)):
            raise GradError(f"{describe} is a gather (an index reads a tensor): its gradient "
                            "is a scatter-add, which TC cannot express")
        e = substitute(e, subst)
        if isinstance(e, ir.Index) and e.name in indices and e.name not in taken:
            taken.add(e.name)
            lhs.append(e.name)
            continue
        y = fresh(f"{read.tensor.lower()}{d}")
        new[y] = d
        lhs.append(y)
        free = indices - taken - set(subst)
        form = _linear(e, indices)
        if form is None:
            raise GradError(f"{describe}: index {d} is not affine in the statement's indices; "
                            "its gradient would be a scatter-add, which TC cannot express")
        coef, rest = form
        choices = [v for v in coef if v in free]
        if not choices:
            guards.append(ir.Binary("==", ir.Index(y), e, _B))
            continue
        v = min(choices, key=lambda n: (n not in lhs_set, abs(coef[n]) != 1, stmt.index_names.index(n)))
        c = coef[v]
        others = [(k, ir.Index(n)) for n, k in coef.items() if n != v] + rest
        # c * v = y - others  ->  u = sign(c) * (y - others), v = u / |c|
        sign = 1 if c > 0 else -1
        u = _affine([(sign, ir.Index(y))] + [(-sign * k, x) for k, x in others])
        rng = stmt.range_of(v)
        lo, hi = bound(rng.lo, f"index {v}"), bound(rng.hi, f"index {v}")
        m = abs(c)
        if m == 1:
            value = u
            guards += [ir.Binary(">=", u, lo, _B), ir.Binary("<", u, hi, _B)]
        else:
            value = ir.Binary("floordiv", u, ir.Const(m, _I), _I)
            mlo = ir.Binary("*", ir.Const(m, _I), lo, _I)
            mhi = ir.Binary("-", ir.Binary("*", ir.Const(m, _I), hi, _I), ir.Const(m - 1, _I), _I)
            guards += [ir.Binary("==", ir.Binary("%", u, ir.Const(m, _I), _I), ir.Const(0, _I), _B),
                       ir.Binary(">=", u, mlo, _B), ir.Binary("<", u, mhi, _B)]
        subst = {k: substitute(x, {v: value}) for k, x in subst.items()}
        subst[v] = value
    reduce = tuple(n for n in stmt.index_names if n not in taken and n not in subst)
    # guards name indices eliminated after them: substitute (subst's values are final)
    guards = [substitute(g, subst) for g in guards]
    return Inverted(tuple(lhs), new, subst, tuple(guards), reduce)
