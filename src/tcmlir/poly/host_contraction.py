"""Which statements the host's packed contraction kernel computes, and how their data lies.

`host_contraction(fn, k, sizes)` reads statement ``k`` of a checked function and returns a
`HostContraction` or the reason it is not one (a sentence). A host contraction is

* ``T(lhs) +=! X(...) * Y(...)`` or ``T(lhs) += X(...) * Y(...)`` with one reduction index
  ``k``, ``T``, ``X`` and ``Y`` all float32 or all float64, ``T`` read by neither operand;
* each operand read at distinct plain indices (no offsets, no gathers), every index of the
  statement starting at 0, the sizes fixed (strides and extents are constants);
* the output's last lhs index ``n`` read by exactly one operand (then called ``b``, its
  micro-panels are vectors along ``n``) and some other lhs index ``m`` read by the other
  operand only (``a``, broadcast one element at a time); every other lhs index is a *batch*
  index, walked outside the kernel (an operand that does not read it is shared by the batch).

Layouts are free: operands are packed (`codegen/host_gemm.py`), so ``A(m,k)·B(k,n)``,
``A(k,m)·B(n,k)`` and ``Z(b,n,m) +=! X(b,n,k) * Y(b,m,k)`` all qualify. The output is stored
along ``n``, its contiguous index.
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

__all__ = ["HostContraction", "HostGemmMark", "host_contraction", "parse_host_gemm_mark"]

_FLOATS = (DType.FLOAT32, DType.FLOAT64)


@dataclass(frozen=True)
class HostContraction:
    statement: int
    out: str
    a: str                        # the operand broadcast along m
    b: str                        # the operand loaded as vectors along n
    dtype: DType
    m: str
    n: str
    k: str
    batch: tuple[str, ...]        # lhs indices other than m and n, outermost first
    init: bool                    # ``+=!``: the output starts at 0 (else it is added to)
    extents: tuple[tuple[str, int], ...]
    a_strides: tuple[tuple[str, int], ...]   # (index, elements); 0 for indices it does not read
    b_strides: tuple[tuple[str, int], ...]
    out_strides: tuple[tuple[str, int], ...]

    def extent(self, index: str) -> int:
        return dict(self.extents)[index]

    def stride(self, tensor: str, index: str) -> int:
        table = {"a": self.a_strides, "b": self.b_strides, "out": self.out_strides}[tensor]
        return dict(table).get(index, 0)

    @property
    def flops(self) -> int:
        return 2 * math.prod(e for _, e in self.extents)


@dataclass(frozen=True)
class HostGemmMark:
    """``host-gemm S<k> tile=MC,NC,KC register=MR,NR vector=VW``: the contraction of statement
    ``k`` under this mark, blocked ``MC x NC x KC`` for the caches, ``MR x NR`` outputs in
    registers, ``VW`` elements per vector (``NR`` a multiple of it)."""

    statement: int
    tile: tuple[int, int, int]
    register: tuple[int, int]
    vector: int

    def __str__(self) -> str:
        mc, nc, kc = self.tile
        mr, nr = self.register
        return (f"host-gemm S{self.statement} tile={mc},{nc},{kc} register={mr},{nr} "
                f"vector={self.vector}")


_MARK = re.compile(r"host-gemm S(\d+) tile=(\d+),(\d+),(\d+) register=(\d+),(\d+) vector=(\d+)$")


def parse_host_gemm_mark(name: str) -> HostGemmMark | None:
    m = _MARK.match(name)
    if m is None:
        return None
    v = [int(g) for g in m.groups()]
    return HostGemmMark(v[0], (v[1], v[2], v[3]), (v[4], v[5]), v[6])


def _plain_strides(fn: ir.Function, read: ir.Read, sizes: Mapping[str, int]) -> dict[str, int] | None:
    shape = [s.evaluate(sizes) for s in fn.tensor(read.tensor).shape]
    out: dict[str, int] = {}
    stride = 1
    for idx, ext in zip(reversed(read.indices), reversed(shape), strict=True):
        if not isinstance(idx, ir.Index) or idx.name in out:
            return None
        out[idx.name] = stride
        stride *= ext
    return out


def host_contraction(fn: ir.Function, k: int, sizes: Mapping[str, int] | None
                     ) -> HostContraction | str:
    """The plan of statement ``k`` of ``fn`` at ``sizes``, or why it is not a host contraction."""
    if sizes is None or any(s not in sizes for s in fn.sizes):
        return "the packed kernel needs fixed sizes (not a parametric kernel)"
    st = fn.statements[k]
    if st.reduction is not ir.Reduction.ADD or len(st.reduction_indices) != 1:
        return "not a `+=` reduction over one index"
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
    kx = st.reduction_indices[0]
    if extents[kx] == 0:
        return "an empty reduction"
    xs, ys = _plain_strides(fn, x, sizes), _plain_strides(fn, y, sizes)
    outs = _plain_strides(fn, ir.Read(st.tensor, tuple(ir.Index(i) for i in st.lhs),
                                      next(iter(dtypes))), sizes)
    if xs is None or ys is None or outs is None:
        return "an operand is not read at distinct plain indices"
    if kx not in xs or kx not in ys:
        return "an operand does not read the reduction index"
    n = st.lhs[-1]
    if (n in xs) == (n in ys):
        return f"the output's last index {n} is read by both operands or neither"
    if n in xs:
        x, y, xs, ys = y, x, ys, xs
    ms = [i for i in st.lhs if i in xs and i not in ys]
    if not ms:
        return "no lhs index of its own in the other operand (a matrix-vector product)"
    m = ms[-1]
    batch = tuple(i for i in st.lhs if i not in (m, n))
    return HostContraction(k, st.tensor, x.tensor, y.tensor, next(iter(dtypes)), m, n, kx,
                           batch, st.init, tuple(extents.items()), tuple(xs.items()),
                           tuple(ys.items()), tuple(outs.items()))
