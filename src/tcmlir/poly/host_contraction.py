"""Which statements the host's packed contraction kernel computes, and how their data lies.

`host_contraction(fn, k, sizes)` reads statement ``k`` of a checked function and returns a
`HostContraction` or the reason it is not one (a sentence). A host contraction is

* ``T(lhs) +=! X(...) * Y(...)`` or ``T(lhs) += X(...) * Y(...)``, ``T``, ``X`` and ``Y``
  all float32 or all float64, ``T`` read by neither operand, the sizes fixed;
* each operand read at affine index expressions of the statement's indices (``h + kh``,
  ``2 * i + 1``; no gathers), so that its element address is a constant plus one stride per
  index, every index of the statement starting at 0;
* ``n``: the longest suffix of the lhs indices that one operand reads and the other does not
  (then called ``b``: its panels are vectors along ``n``, flattened); ``m``: another lhs index
  only the other operand (``a``, broadcast one element at a time) reads; ``k``: every reduction
  index (flattened, in the statement's order); every other lhs index is a *batch* index,
  walked outside the kernel (an operand that does not read it is shared by the batch).

Layouts are free: operands are packed (`codegen/host_gemm.py`), so ``A(m,k)·B(k,n)``,
``A(k,m)·B(n,k)``, ``Z(b,n,m) +=! X(b,n,k) * Y(b,m,k)`` and a convolution
``O(n,f,h,w) +=! I(n,c,h+kh,w+kw) * W(f,c,kh,kw)`` (``m = f``, ``n = (h, w)``,
``k = (c, kh, kw)``: an implicit GEMM) all qualify. Where ``n`` or ``k`` flattens several
indices, the offsets of its flat positions come from a table (`offsets`, at most
`MAX_TABLE` entries). The output is stored along flat ``n``, contiguous (a suffix of the lhs).
The mark `passes/host_contraction.py` puts in the schedule tree names the statement and the
blocking (`HostGemmMark`); the plan is recomputed from the function where it is lowered.
"""

from __future__ import annotations

import math
import re
from collections.abc import Mapping
from dataclasses import dataclass

from .. import ir
from ..dtypes import DType

__all__ = ["MAX_TABLE", "HostContraction", "HostGemmMark", "address_strides", "host_contraction",
           "linear_form", "parse_host_gemm_mark"]

_FLOATS = (DType.FLOAT32, DType.FLOAT64)
MAX_TABLE = 1 << 16  # entries of an offset table of a flattened group of indices


@dataclass(frozen=True)
class HostContraction:
    statement: int
    out: str
    a: str                        # the operand broadcast along m
    b: str                        # the operand loaded as vectors along n
    dtype: DType
    m: str
    n: tuple[str, ...]            # a suffix of the lhs indices, flattened
    k: tuple[str, ...]            # the reduction indices, flattened
    batch: tuple[str, ...]        # lhs indices other than m and n, outermost first
    init: bool                    # ``+=!``: the output starts at 0 (else it is added to)
    extents: tuple[tuple[str, int], ...]
    a_strides: tuple[tuple[str, int], ...]   # (index, elements); 0 for indices it does not read
    b_strides: tuple[tuple[str, int], ...]
    out_strides: tuple[tuple[str, int], ...]
    a_offset: int = 0             # elements added to every address (constant index terms)
    b_offset: int = 0

    def extent(self, index: str) -> int:
        return dict(self.extents)[index]

    def size(self, group: tuple[str, ...]) -> int:
        return math.prod(self.extent(i) for i in group)

    def stride(self, tensor: str, index: str) -> int:
        table = {"a": self.a_strides, "b": self.b_strides, "out": self.out_strides}[tensor]
        return dict(table).get(index, 0)

    def offsets(self, tensor: str, group: tuple[str, ...]) -> list[int]:
        """The offset of each flat position of ``group`` in ``tensor`` (row-major over it)."""
        out = [0]
        for i in group:
            s = self.stride(tensor, i)
            out = [o + s * v for o in out for v in range(self.extent(i))]
        return out


@dataclass(frozen=True)
class HostGemmMark:
    """``host-gemm S<k> tile=MC,NC,KC register=MR,NR vector=VW [init]``: the contraction of
    statement ``k`` under this mark, blocked ``MC x NC x KC`` for the caches, ``MR x NR``
    outputs in registers, ``VW`` elements per vector (``NR`` a multiple of it); ``init``: its
    ``S<k>_init`` is under the mark too (the first slice stores, else every slice adds)."""

    statement: int
    tile: tuple[int, int, int]
    register: tuple[int, int]
    vector: int
    init: bool = False

    def __str__(self) -> str:
        mc, nc, kc = self.tile
        mr, nr = self.register
        return (f"host-gemm S{self.statement} tile={mc},{nc},{kc} register={mr},{nr} "
                f"vector={self.vector}" + (" init" if self.init else ""))


_MARK = re.compile(r"host-gemm S(\d+) tile=(\d+),(\d+),(\d+) register=(\d+),(\d+) vector=(\d+)"
                   r"( init)?$")


def parse_host_gemm_mark(name: str) -> HostGemmMark | None:
    m = _MARK.match(name)
    if m is None:
        return None
    v = [int(g) for g in m.groups()[:7]]
    return HostGemmMark(v[0], (v[1], v[2], v[3]), (v[4], v[5]), v[6], m.group(8) is not None)


def linear_form(e: ir.Expr, sizes: Mapping[str, int]) -> tuple[dict[str, int], int] | None:
    """``e`` as (coefficient per index, constant), or None when it is not affine."""
    if isinstance(e, ir.Index):
        return {e.name: 1}, 0
    if isinstance(e, ir.Size):
        return ({}, sizes[e.name]) if e.name in sizes else None
    if isinstance(e, ir.Const):
        v = e.value
        return ({}, v) if isinstance(v, int) and not isinstance(v, bool) else None
    if isinstance(e, ir.Cast) and e.dtype.is_int:
        return linear_form(e.operand, sizes)
    if isinstance(e, ir.Unary) and e.op == "-":
        x = linear_form(e.operand, sizes)
        return None if x is None else ({i: -c for i, c in x[0].items()}, -x[1])
    if isinstance(e, ir.Binary) and e.op in ("+", "-", "*"):
        x, y = linear_form(e.lhs, sizes), linear_form(e.rhs, sizes)
        if x is None or y is None:
            return None
        if e.op == "*":
            if x[0] and y[0]:
                return None
            scale, (coefs, base) = (x[1], y) if not x[0] else (y[1], x)
            return {i: scale * w for i, w in coefs.items()}, scale * base
        sign = 1 if e.op == "+" else -1
        out = dict(x[0])
        for i, w in y[0].items():
            out[i] = out.get(i, 0) + sign * w
        return out, x[1] + sign * y[1]
    return None


def address_strides(fn: ir.Function, read: ir.Read, sizes: Mapping[str, int]
             ) -> tuple[dict[str, int], int] | None:
    """(elements per step of each statement index, constant offset) of ``read``'s address."""
    shape = [s.evaluate(sizes) for s in fn.tensor(read.tensor).shape]
    out: dict[str, int] = {}
    offset = 0
    stride = 1
    for idx, ext in zip(reversed(read.indices), reversed(shape), strict=True):
        lin = linear_form(idx, sizes)
        if lin is None:
            return None
        for i, c in lin[0].items():
            if c:
                out[i] = out.get(i, 0) + c * stride
        offset += lin[1] * stride
        stride *= ext
    return out, offset


def host_contraction(fn: ir.Function, k: int, sizes: Mapping[str, int] | None
                     ) -> HostContraction | str:
    """The plan of statement ``k`` of ``fn`` at ``sizes``, or why it is not a host contraction."""
    if sizes is None or any(s not in sizes for s in fn.sizes):
        return "the packed kernel needs fixed sizes (not a parametric kernel)"
    st = fn.statements[k]
    if st.reduction is not ir.Reduction.ADD or not st.reduction_indices:
        return "not a `+=` reduction"
    rhs = st.rhs
    if not (isinstance(rhs, ir.Binary) and rhs.op == "*"):
        return "the right-hand side is not a product of two reads"
    x, y = rhs.lhs, rhs.rhs
    if not (isinstance(x, ir.Read) and isinstance(y, ir.Read)):
        return "the right-hand side is not a product of two reads"
    dtypes = {fn.tensor(t).dtype for t in (st.tensor, x.tensor, y.tensor)}
    if len(dtypes) != 1 or next(iter(dtypes)) not in _FLOATS:
        return "output and operands are not all float32 or all float64"
    if st.tensor in (x.tensor, y.tensor):
        return "the output is also an operand"
    if not st.lhs:
        return "a 0-d output (a dot product)"
    extents: dict[str, int] = {}
    for r in st.ranges:
        if r.lo.evaluate(sizes) != 0:
            return f"index {r.name} does not start at 0"
        extents[r.name] = r.hi.evaluate(sizes)
    ks = tuple(st.reduction_indices)
    if any(extents[i] == 0 for i in ks):
        return "an empty reduction"
    xs, ys = address_strides(fn, x, sizes), address_strides(fn, y, sizes)
    outs = address_strides(fn, ir.Read(st.tensor, tuple(ir.Index(i) for i in st.lhs),
                                next(iter(dtypes))), sizes)
    if xs is None or ys is None or outs is None:
        return "an operand is not read at affine indices"
    if not all(i in xs[0] or i in ys[0] for i in ks):
        return "a reduction index no operand reads"
    if (st.lhs[-1] in xs[0]) == (st.lhs[-1] in ys[0]):
        return f"the output's last index {st.lhs[-1]} is read by both operands or neither"
    if st.lhs[-1] in xs[0]:
        x, y, xs, ys = y, x, ys, xs
    ns: list[str] = []
    for i in reversed(st.lhs):
        if i in ys[0] and i not in xs[0]:
            ns.insert(0, i)
        else:
            break
    ms = [i for i in st.lhs if i not in ns and i in xs[0] and i not in ys[0]]
    if not ms:
        return "no lhs index of its own in the other operand (a matrix-vector product)"
    plan = HostContraction(k, st.tensor, x.tensor, y.tensor, next(iter(dtypes)), ms[-1],
                           tuple(ns), ks, tuple(i for i in st.lhs if i != ms[-1] and i not in ns),
                           st.init, tuple(extents.items()), tuple(xs[0].items()),
                           tuple(ys[0].items()), tuple(outs[0].items()), xs[1], ys[1])
    if plan.offsets("out", plan.n) != list(range(plan.size(plan.n))):
        return f"the output is not contiguous along {', '.join(plan.n)}"
    for group in (plan.n, plan.k):
        if len(group) > 1 and plan.size(group) > MAX_TABLE:
            return (f"{plan.size(group)} positions of {', '.join(group)} are more than an "
                    f"offset table holds ({MAX_TABLE})")
    return plan
