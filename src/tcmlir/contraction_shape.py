"""Contractions with leading indices: which fp32 programs get the register-tiled matmul mapping
with their leading output indices untiled (one block per value), at which tiles.

A *leading-index contraction* is one ``+=`` statement with one reduction index ``k`` whose
right-hand side is a product of two reads (constant factors and per-output scales — reads
of output indices only, multiplied or divided: attention's ``e(b, i, j) * V(b, j, d) / s(b, i)``
— allowed), an output of rank >= 3
whose last two indices are one read by only one operand (``m``) and one read by only the
other (``n``), and any number of leading output indices before them: a batch read by both
operands (``P(b, i, j) +=! Q(b, i, d) * K(b, d, j)``), or more rows or columns of one operand
(``XW(m, n0, n1, d) +=! X(m, n0, n1, r) * W(d, r)``, TC's Kronecker family), plus elementwise
statements of no higher rank (a bias, an activation). The matmul mapping (shared-memory operand
tiles, a register tile per thread) then applies to ``(m, n, k)`` and each leading index takes a
grid dimension; before, such programs got a 32 x 32 tile with one output per thread (batched
matmuls: 0.25x cuBLAS) or the generic mapping (Kronecker: every thread read its weights with
a stride).
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass

from . import ir as tc

__all__ = ["LeadContraction", "lead_contraction"]

MIN_EXTENT = 32  # a register tile of 32 x 32 at least; smaller outputs keep their mapping


@dataclass(frozen=True)
class LeadContraction:
    lead: int                      # leading output indices (untiled, on blocks)
    extents: tuple[int, int]       # of the last two output indices
    lead_extents: tuple[int, ...]  # of the leading ones
    reduction: int                 # the reduction's extent

    @property
    def batch(self) -> int:
        return math.prod(self.lead_extents)


def _reads(e: tc.Expr) -> list[tc.Read]:
    return [x for x in tc.walk(e) if isinstance(x, tc.Read)]


def _product_reads(e: tc.Expr, k: str) -> list[tc.Read] | None:
    """The reads of a product of reads and constants, divisors of no ``k`` included
    (``a * b / c``)."""
    if isinstance(e, tc.Read):
        return [e]
    if isinstance(e, tc.Const):
        return []
    if isinstance(e, tc.Binary) and e.op in ("*", "/"):
        left, right = _product_reads(e.lhs, k), _product_reads(e.rhs, k)
        if left is None or right is None or (e.op == "/" and any(k in _used(r) for r in right)):
            return None
        return left + right
    return None


def _used(rd: tc.Read) -> set[str]:
    return {x.name for i in rd.indices for x in tc.walk(i) if isinstance(x, tc.Index)}


def lead_contraction(fn: tc.Function, sizes: Mapping[str, int] | None) -> LeadContraction | None:
    """The leading-index contraction ``fn`` is at ``sizes`` (see the module docstring), else
    None (also when the sizes are unknown, a grid dimension would be missing — more than
    three leading or tiled dimensions with more than one value — or the last two extents are
    below `MIN_EXTENT`)."""
    if sizes is None:
        return None
    reductions = [s for s in fn.statements if s.reduction is not None]
    if len(reductions) != 1:
        return None
    st = reductions[0]
    if st.reduction is not tc.Reduction.ADD or len(st.reduction_indices) != 1 or len(st.lhs) < 3:
        return None
    if any(len(s.index_names) > len(st.lhs) for s in fn.statements if s is not st):
        return None
    (k,) = st.reduction_indices
    reads = _product_reads(st.rhs, k)
    if reads is None or any(_reads(i) for r in reads for i in r.indices):
        return None  # not a product of reads, or a gather
    # per-output scales (attention's ``/ s(b, i)``) ride along; two reads carry k
    scales = [r for r in reads if k not in _used(r)]
    if any(not _used(r) <= set(st.lhs) or r.tensor == st.tensor for r in scales):
        return None
    reads = [r for r in reads if k in _used(r)]
    if len(reads) != 2:
        return None
    a, b = (_used(r) for r in reads)
    if k not in a or k not in b or any(r.tensor == st.tensor for r in reads):
        return None
    last = st.lhs[-2:]
    sides = [(x in a, x in b) for x in last]
    if sorted(sides) != [(False, True), (True, False)]:
        return None
    try:
        box = {r.name: r.hi.evaluate(sizes) - r.lo.evaluate(sizes) for r in st.ranges}
    except (KeyError, TypeError, ValueError):
        return None
    extents = (box[last[0]], box[last[1]])
    lead_extents = tuple(box[x] for x in st.lhs[:-2])
    if min(extents) < MIN_EXTENT:
        return None
    return LeadContraction(len(st.lhs) - 2, extents, lead_extents, box[k])
