"""Which programs are tensor-core contractions, and how their operands lie in memory.

`contraction_plan(fn, sizes)` reads a checked function and returns a `ContractionPlan` or the
reason it is not one. A contraction here is

* one statement ``T(lhs) +=! X(...) * Y(...)`` with half-precision (float16 or bfloat16)
  operands of one type and a float32 ``T`` — optionally followed by the one rounding
  statement ``C(lhs) = T(lhs)`` that `lang/half_accumulate.py` adds for a half output (``T``
  then never leaves the chip);
* possibly after operand copies (`operand_copies`: ``X_pad(i, j) = X(i, j)``, the padded
  temporaries of `passes/pad_operands.py`, which a kernel of their own runs first; then
  ``ContractionPlan.statement`` is not 0);
* each operand read at affine index expressions (sums of the statement's indices times
  integers, plus a constant: ``h + kh``, ``2 * h + kh``, ``KH - 1 - kh``): its address is a
  constant (``Operand.base``) plus one stride per index, the sum over the dimensions whose
  expression has it of coefficient times dimension stride (``Operand.strides``);
* then any number of pointwise statements ``C(lhs) = f(C(lhs), B(...), ...)`` on the output
  (a bias, an activation, a scale: reads of other tensors at lhs indices only), applied to
  each element in registers before it is stored (the *epilogue*);
* every lhs index that only ``X`` reads is a row index, every one only ``Y`` reads a column
  index: all of each, in lhs order, are one dimension ``m`` (``n``; named by its innermost
  index); the other lhs indices (both operands read them, or neither) are *batch* indices
  walked outside the tile. The reduction indices are one dimension ``k``, in the order in
  which they are one flattened dimension of an operand (``A(m, k0, k1) * B(k0, k1, n)``),
  else in ``X``'s order of strides;
* a group (``m``, ``n`` or ``k``) need not be one flattened dimension of a tensor (each
  index's stride the next one's times its extent): it is then several runs there
  (`ContractionPlan.segments`), addressed run by run (``Operand.row_scattered``,
  ``k_scattered``, the output likewise). So a convolution is an implicit GEMM:
  ``O(n, m, h, w) +=! I(n, c, h + kh, w + kw) * Wt(m, c, kh, kw)`` has rows ``m`` (the
  filter), columns ``n, h, w`` (the input's im2col rows: runs of ``w`` there, and of ``h, w``
  in the output) and steps ``c, kh, kw``; ``XW(m, n0, n1, d) +=! X(m, n0, n1, r) * W(d, r)``
  has one row dimension ``m, n0, n1`` of one run;
* any sizes and strides: each operand is stored in shared memory contiguous along ``k`` or
  along its rows, whichever gives it wider copies from global memory (or longer contiguous
  runs; with neither contiguous, the smaller stride); the copies are 16, 8 or 4 bytes wide
  (``Operand.copy``: the widest that every stride outside the contiguous run keeps aligned
  and, where the dimension is several runs, that divides the run's extent, so no copy
  straddles two), or element loads (odd strides, or no contiguous dimension); copies that
  reach past the end of a dimension are zero-filled, and no row or step past the end (an
  im2col row past the last image) is read.

Any layout and batch form qualifies: ``A(m,k)·B(k,n)``, ``A(m,k)·B(n,k)``, ``A(k,m)·...``,
``Z(b,n,m) +=! X(b,n,k) * Y(b,m,k)``, NCHW and NHWC convolutions, strided and dilated.
Sizes must be fixed (the strides are constants). What does not qualify: gathers, products or
quotients of indices, an operand without an output index of its own (a matrix-vector product,
a depthwise convolution). The plan is pure data; `passes/map_mma.py` maps it and
`codegen/gpu_mma.py` emits it.
"""

from __future__ import annotations

import math
import re
from collections.abc import Mapping
from dataclasses import dataclass

from .. import ir
from ..dtypes import DType
from .host_contraction import address_strides

__all__ = ["ContractionPlan", "MmaMark", "Operand", "Segment", "contraction_plan", "mma_tile_choice",
           "operand_copies", "parse_mma_mark", "segments", "wgmma_problem"]

_HALF = (DType.FLOAT16, DType.BFLOAT16)
CHUNK = 8  # halves per 16-byte copy


@dataclass(frozen=True)
class Operand:
    tensor: str
    row: str                      # m for the A operand, n for the B operand
    k_major: bool                 # stored k-contiguous in shared memory (else ``row``-contiguous)
    strides: tuple[tuple[str, int], ...]  # (index, elements) for every index it reads: the sum
    #                               of coefficient x dimension stride over the dimensions whose
    #                               index expression has it (``I(n, c, h + kh, w + kw)``)
    copy: int = CHUNK             # elements per copy of a 16-byte aligned tensor: 16, 8 or 4
    #                               bytes (cp.async), else (2-byte halves: odd strides, or no
    #                               contiguous index) element loads
    k_scattered: bool = False     # the reduction indices are not one flattened dimension of
    #                               this operand: its address of step k goes run by run
    #                               (`ContractionPlan.segments`)
    row_scattered: bool = False   # its row indices neither (``n, h, w`` of ``I(n, c, h + kh,
    #                               w + kw)``: runs of ``w``)
    base: int = 0                 # elements from the tensor's start to the element at all
    #                               indices 0 (the constant terms of its index expressions)

    def stride(self, index: str) -> int:
        return dict(self.strides).get(index, 0)


@dataclass(frozen=True)
class ContractionPlan:
    statement: int                # the reduction statement
    cast: int | None              # the rounding statement C = T, if any
    acc: str                      # T: the f32 accumulator tensor
    out: str                      # the tensor the kernel stores (C, or T without a cast)
    dtype: DType                  # the operands' type
    a: Operand
    b: Operand
    m: str                        # the innermost index of each group (`members`)
    n: str
    k: str
    extents: tuple[tuple[str, int], ...]  # every index of the statement
    batch: tuple[str, ...]        # lhs indices walked outside the tile, outermost first
    out_strides: tuple[tuple[str, int], ...]
    lhs: tuple[str, ...]
    epilogue: tuple[int, ...] = ()  # pointwise statements on the output, fused into the store
    groups: tuple[tuple[str, tuple[str, ...]], ...] = ()  # m, n, k -> its indices, outermost
    #                               first, when several form one flattened dimension

    def members(self, index: str) -> tuple[str, ...]:
        """The indices that ``index`` (``m``, ``n``, ``k`` or a batch index) stands for."""
        return dict(self.groups).get(index, (index,))

    def index_extent(self, index: str) -> int:
        return dict(self.extents)[index]

    def extent(self, index: str) -> int:
        """The extent of ``index``'s dimension: the product of its group's."""
        return math.prod(self.index_extent(i) for i in self.members(index))

    @property
    def batch_count(self) -> int:
        return math.prod(self.extent(b) for b in self.batch)

    def out_stride(self, index: str) -> int:
        return dict(self.out_strides).get(index, 0)

    def segments(self, index: str, strides: Mapping[str, int] | tuple[tuple[str, int], ...]
                 ) -> tuple[Segment, ...]:
        """How flat positions of ``index``'s group lie in a tensor of ``strides``: its runs
        of members that flatten there (`segments`)."""
        return segments(self.members(index), dict(strides), dict(self.extents))


@dataclass(frozen=True)
class Segment:
    """A run of a group's indices that is one flattened dimension of a tensor: flat position
    ``p`` of the group is at ``(p // below) % extent * stride`` along it (plus the others)."""

    below: int   # the extent of the group's members inside this run
    extent: int
    stride: int


def segments(group: tuple[str, ...], strides: Mapping[str, int], extents: Mapping[str, int]
             ) -> tuple[Segment, ...]:
    """``group`` (outermost first) in a tensor of ``strides``, innermost run first: members
    of extent 1 (always 0) are left out unless all are; each run is a longest sequence of
    members that flatten (each one's stride the next one's times that one's extent)."""
    live = [i for i in group if extents[i] != 1] or [group[-1]]
    runs: list[list[str]] = []
    for i in live:
        if runs and strides.get(runs[-1][-1], 0) == strides.get(i, 0) * extents[i]:
            runs[-1].append(i)
        else:
            runs.append([i])
    out, below = [], 1
    for run in reversed(runs):
        ext = math.prod(extents[i] for i in run)
        out.append(Segment(below, ext, strides.get(run[-1], 0)))
        below *= ext
    return tuple(out)


def _operand_read(e: ir.Expr) -> ir.Read | None:
    while isinstance(e, ir.Cast):
        e = e.operand
    return e if isinstance(e, ir.Read) else None


def _flattens(group: list[str], strides: Mapping[str, int], extents: Mapping[str, int]) -> bool:
    """``group`` (outermost first) is one dimension of a tensor with ``strides``."""
    return len(segments(tuple(group), strides, extents)) == 1


def _copy_width(inner: Segment, scattered: bool, others: list[int], chunk: int) -> int:
    """Elements per copy along the contiguous run ``inner``: the widest of ``chunk`` (16
    bytes), its half, ... that divides every stride and offset outside it (so every copy is
    aligned as wide as itself) and, where the run is not the whole dimension (``scattered``:
    the next position is elsewhere in memory), its extent; 1 where it is not contiguous."""
    if inner.stride != 1:
        return 1
    widths = [chunk >> j for j in range(chunk.bit_length())]
    return next(w for w in widths
                if all(s % w == 0 for s in others) and not (scattered and inner.extent % w))


def contraction_plan(fn: ir.Function, sizes: Mapping[str, int] | None, tf32: bool = False
                     ) -> ContractionPlan | str:
    """The plan of ``fn`` at ``sizes``, or why tensor cores do not apply (a sentence).
    ``tf32``: float32 operands qualify too (their products in TF32: on request only)."""
    if sizes is None or any(s not in sizes for s in fn.sizes):
        return "tensor cores need fixed sizes (not a parametric kernel)"
    first = operand_copies(fn, sizes)
    sts = fn.statements
    if len(sts) <= first:
        return "not a single contraction statement"
    st = sts[first]
    if st.reduction is not ir.Reduction.ADD or not st.init or not st.reduction_indices:
        return f"statement {first} is not a `+=!` reduction"
    if fn.tensor(st.tensor).dtype is not DType.FLOAT32:
        return "the accumulator is not float32"
    rhs = st.rhs
    while isinstance(rhs, ir.Cast) and rhs.dtype is DType.FLOAT32:
        rhs = rhs.operand
    if not (isinstance(rhs, ir.Binary) and rhs.op == "*"):
        return "the right-hand side is not a product of two reads"
    x, y = _operand_read(rhs.lhs), _operand_read(rhs.rhs)
    if x is None or y is None:
        return "the right-hand side is not a product of two reads"
    dtypes = {fn.tensor(x.tensor).dtype, fn.tensor(y.tensor).dtype}
    allowed = (*_HALF, DType.FLOAT32) if tf32 else _HALF
    if len(dtypes) != 1 or next(iter(dtypes)) not in allowed:
        return ("operands are not both float16 or both bfloat16"
                + (" or both float32" if tf32 else " (float32: precision='tf32' on request)"))
    if first and not {x.tensor, y.tensor} >= {sts[j].tensor for j in range(first)}:
        return "a copy before the contraction is not one of its operands"
    cast = None
    out = st.tensor
    rest = list(range(first + 1, len(sts)))
    if rest and _is_rounding(fn, sts[first + 1], st):
        cast, out = first + 1, sts[first + 1].tensor
        rest = rest[1:]
    if fn.tensor(out).role is not ir.Role.OUTPUT:
        return "the contraction's result is not an output"
    for j in rest:
        why = _epilogue_problem(fn, sts[j], out, st.tensor if cast is not None else None, len(st.lhs))
        if why is not None:
            return f"statement {j} {why}"
    extents: dict[str, int] = {}
    for r in st.ranges:
        if r.lo.evaluate(sizes) != 0:
            return f"index {r.name} does not start at 0"
        extents[r.name] = r.hi.evaluate(sizes)
    reads = [address_strides(fn, rd, sizes) for rd in (x, y)]
    if reads[0] is None or reads[1] is None:
        return ("an operand is not read at affine indices (sums of the statement's indices "
                "times integers, plus a constant: no gathers, products or divisions of indices)")
    (xs, xbase), (ys, ybase) = reads
    xs = {i: s for i, s in xs.items() if s}
    ys = {i: s for i, s in ys.items() if s}
    outs = dict(enumerate_strides(fn, out, st.lhs, sizes))
    for r in st.reduction_indices:
        if r not in xs or r not in ys:
            return f"an operand does not read the reduction index {r}"
    # the reduction indices as one dimension, outermost first: in the order of an operand
    # they are one flattened dimension of (x's, else y's, else x's order)
    orders = [sorted(st.reduction_indices, key=lambda i, s=s: -s[i]) for s in (xs, ys)]
    ks = next((o for o, s in zip(orders, (xs, ys), strict=True) if _flattens(o, s, extents)),
              orders[0])
    k = ks[-1]
    ms = [i for i in st.lhs if i in xs and i not in ys]
    ns = [i for i in st.lhs if i in ys and i not in xs]
    if not ms or not ns:
        return "no row index of its own in each operand (a matrix-vector product)"
    if ns[-1] != st.lhs[-1] and ms[-1] == st.lhs[-1]:  # the output's contiguous index on n
        x, y, xs, ys, ms, ns, xbase, ybase = y, x, ys, xs, ns, ms, ybase, xbase
    # every row index of an operand's own is one row dimension, in the output's order: where
    # it is not one flattened dimension of the operand (``I(n, c, h + kh, w + kw)``) or of the
    # output, each is addressed index by index (`segments`)
    mg, ng = ms, ns
    batch = tuple(i for i in st.lhs if i not in mg and i not in ng)
    operands = []
    for read, strides, base, row in ((x, xs, xbase, mg), (y, ys, ybase, ng)):
        ksegs = segments(tuple(ks), strides, extents)
        rsegs = segments(tuple(row), strides, extents)
        chunk = 128 // fn.tensor(read.tensor).dtype.bits

        outside = [s for i, s in strides.items()  # batch indices, the constant terms
                   if i not in ks and i not in row and extents[i] != 1] + [base]

        def width(segs, other, outside=outside, chunk=chunk) -> int:
            rest = [s.stride for s in (*segs[1:], *other)] + outside
            return _copy_width(segs[0], len(segs) > 1, rest, chunk)

        by_k, by_row = width(ksegs, rsegs), width(rsegs, ksegs)
        if ksegs[0].stride == 1 or rsegs[0].stride == 1:  # the wider copies, else longer runs
            k_major = ((by_k, ksegs[0].stride == 1, ksegs[0].extent)
                       >= (by_row, rsegs[0].stride == 1, rsegs[0].extent))
        else:  # no contiguous dimension: element loads along the one of smaller stride
            k_major = abs(ksegs[0].stride) <= abs(rsegs[0].stride)
        operands.append(Operand(read.tensor, row[-1], k_major, tuple(strides.items()),
                                by_k if k_major else by_row, len(ksegs) > 1, len(rsegs) > 1,
                                base))
    groups = tuple((g[-1], tuple(g)) for g in (mg, ng, ks) if len(g) > 1)
    return ContractionPlan(first, cast, st.tensor, out, next(iter(dtypes)), operands[0],
                           operands[1], mg[-1], ng[-1], k, tuple(extents.items()), batch,
                           tuple(outs.items()), st.lhs, tuple(rest), groups)


def operand_copies(fn: ir.Function, sizes: Mapping[str, int]) -> int:
    """How many statements at the start of ``fn`` are operand copies (`passes/pad_operands.py`):
    ``T(i0, ..., ir) = X(i0, ..., ir)`` of a whole input ``X`` into a temporary ``T`` of its
    type and rank, at least as large along every dimension, that nothing else writes (a copy
    whose rows are further apart than the input's, aligned: the contraction reads ``T``)."""
    count = 0
    for st in fn.statements:
        rd = st.rhs
        if (st.reduction is not None or not isinstance(rd, ir.Read)
                or fn.tensor(st.tensor).role is not ir.Role.TEMP
                or fn.tensor(rd.tensor).role is not ir.Role.INPUT
                or tuple(getattr(i, "name", None) for i in rd.indices) != st.lhs
                or len(set(st.lhs)) != len(st.lhs) or set(st.index_names) != set(st.lhs)):
            break
        src, dst = fn.tensor(rd.tensor), fn.tensor(st.tensor)
        if src.dtype is not dst.dtype or src.rank != dst.rank:
            break
        box = [(st.range_of(i).lo.evaluate(sizes), st.range_of(i).hi.evaluate(sizes)) for i in st.lhs]
        dims = [(d.evaluate(sizes), e.evaluate(sizes)) for d, e in zip(src.shape, dst.shape, strict=True)]
        if any(b != (0, d) or e < d for b, (d, e) in zip(box, dims, strict=True)):
            break
        if any(o.tensor == st.tensor for o in fn.statements if o is not st):
            break
        count += 1
    return count


def enumerate_strides(fn: ir.Function, tensor: str, indices: tuple[str, ...],
                      sizes: Mapping[str, int]) -> list[tuple[str, int]]:
    """(index, elements) of ``tensor`` read at the plain ``indices`` (row-major)."""
    shape = [s.evaluate(sizes) for s in fn.tensor(tensor).shape]
    out, stride = [], 1
    for idx, ext in zip(reversed(indices), reversed(shape), strict=True):
        out.append((idx, stride))
        stride *= ext
    return out[::-1]


def _is_rounding(fn: ir.Function, c: ir.Statement, st: ir.Statement) -> bool:
    """``c`` is ``C(lhs) = T(lhs)`` for the float32 temporary ``T`` of ``st``."""
    rd = _operand_read(c.rhs)
    return (c.reduction is None and rd is not None and rd.tensor == st.tensor
            and fn.tensor(st.tensor).role is ir.Role.TEMP
            and tuple(getattr(i, "name", None) for i in rd.indices) == st.lhs
            and c.lhs == st.lhs and c.tensor != st.tensor
            and fn.tensor(c.tensor).dtype in (*_HALF, DType.FLOAT32))


def _epilogue_problem(fn: ir.Function, c: ir.Statement, out: str, acc: str | None,
                      rank: int) -> str | None:
    """Why ``c`` is not a pointwise statement on ``out`` (None: it is)."""
    if c.reduction is not None or c.tensor != out or len(c.lhs) != rank:
        return "is not a pointwise statement on the output"
    if set(c.index_names) != set(c.lhs):
        return "has indices beyond its left-hand side"
    for rd in (x for x in ir.walk(c.rhs) if isinstance(x, ir.Read)):
        names = [getattr(i, "name", None) for i in rd.indices]
        if rd.tensor == acc or None in names or not set(names) <= set(c.lhs):
            return f"reads {rd.tensor} elsewhere than at its own indices"
        if rd.tensor == out and tuple(names) != c.lhs:
            return f"reads {out} at other elements"
        if rd.tensor != out and fn.tensor(rd.tensor).role is not ir.Role.INPUT:
            return f"reads {rd.tensor}, which the program writes"
    return None


# ---------------------------------------------------------------- the mark

_MARK = re.compile(r"^mma S(\d+) tile=(\d+),(\d+),(\d+) warps=(\d+),(\d+) stages=(\d+) "
                   r"grid=(\d+),(\d+),(\d+)( wgmma)?( tf32)?$")


@dataclass(frozen=True)
class MmaMark:
    statement: int
    tile: tuple[int, int, int]
    warps: tuple[int, int]
    stages: int
    grid: tuple[int, int, int]
    wgmma: bool = False  # warpgroup instructions (sm_90a), else mma.sync
    tf32: bool = False   # float32 operands allowed (their products in TF32)

    @property
    def name(self) -> str:
        t, w, g = self.tile, self.warps, self.grid
        return (f"mma S{self.statement} tile={t[0]},{t[1]},{t[2]} warps={w[0]},{w[1]} "
                f"stages={self.stages} grid={g[0]},{g[1]},{g[2]}" + (" wgmma" if self.wgmma else "")
                + (" tf32" if self.tf32 else ""))

    @property
    def threads(self) -> int:
        return 32 * self.warps[0] * self.warps[1]


def parse_mma_mark(name: str) -> MmaMark | None:
    m = _MARK.match(name.strip())
    if m is None:
        return None
    v = [int(x) for x in m.groups()[:10]]
    return MmaMark(v[0], (v[1], v[2], v[3]), (v[4], v[5]), v[6], (v[7], v[8], v[9]),
                   m.group(11) is not None, m.group(12) is not None)



WGMMA_ROW_HALVES = 64  # BK of wgmma: one 128-byte swizzled row per operand row


def wgmma_problem(plan: ContractionPlan | None, tile: tuple[int, int, int], warps: tuple[int, int]) -> str | None:
    """Why this plan and tile cannot use wgmma (None: they can)."""
    bm, bn, bk = tile
    if plan is not None and plan.dtype is DType.FLOAT32:
        return "TF32 runs on mma.sync here (wgmma: half precision only)"
    if bk != WGMMA_ROW_HALVES:
        return f"wgmma needs BK = {WGMMA_ROW_HALVES}"
    if bm % 64 or warps != (bm // 16, 1):
        return f"wgmma needs BM a multiple of 64 and warps = (BM/16, 1), got {tile}, {warps}"
    if bn not in (64, 128, 256):
        return f"wgmma needs BN of 64, 128 or 256, got {bn}"
    return None


# ---------------------------------------------------------------- tile choice

SM_COUNT = 132            # H200 (the defaults are chosen without a device; see gpu_defaults)
# (tile BM x BN x BK, warps, stages, wgmma, relative throughput of one SM running such blocks)
# measured on an H100 (fp16 4096^3, tools/bench_mma.py --variants, one run): wgmma 128x256
# (4 stages) 669 TFLOP/s, 128x128 (5 stages) 518, 64x256 431, 128x64 (6 stages) 403, 64x128
# 388; mma.sync 128x128x32 (4 stages) 380, 64x128x32 307 (64x64: not measured, below those)
_TILES = (((128, 256, 64), (8, 1), 4, True, 1.0), ((128, 128, 64), (8, 1), 5, True, 0.77),
          ((64, 256, 64), (4, 1), 4, True, 0.64), ((128, 64, 64), (8, 1), 6, True, 0.60),
          ((64, 128, 64), (4, 1), 4, True, 0.58), ((128, 128, 32), (2, 2), 4, False, 0.57),
          ((64, 128, 32), (2, 2), 4, False, 0.46), ((64, 64, 32), (2, 2), 4, False, 0.35))


def mma_tile_choice(plan: ContractionPlan
                    ) -> tuple[tuple[int, int, int], tuple[int, int], int, bool]:
    """(tile, warps, stages, wgmma) minimising a small model of the kernel's time: the
    busiest SM runs ``ceil(blocks / SMs)`` blocks, each the whole tile's work (tiles the sizes
    do not fill are charged for their area) at the tile shape's measured throughput (which
    includes how many of its blocks share an SM)."""
    mm, nn, kk = plan.extent(plan.m), plan.extent(plan.n), plan.extent(plan.k)
    best = None
    for (bm, bn, bk), warps, stages, wgmma, eff in _TILES:
        blocks = math.ceil(mm / bm) * math.ceil(nn / bn) * plan.batch_count
        cost = math.ceil(blocks / SM_COUNT) * bm * bn * math.ceil(kk / bk) * bk / eff
        if best is None or cost < best[0]:
            best = (cost, ((bm, bn, bk), warps, stages, wgmma))
    assert best is not None
    return best[1]
