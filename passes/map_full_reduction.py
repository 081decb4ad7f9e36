"""A full reduction (``s +=! A(i)``, a scalar lhs) across every block of the grid, for `map-rows`.

`map-rows` calls `build_full_reduction` for a function whose only statement reduces into a
scalar. The tree::

    sequence
      filter { S0_init }                       (the ``!`` form only)
        kernel grid=1,1,1 block=1,1,1          the identity, before any block folds
          filter (every index pinned to 0)
      filter { S0 }
        kernel grid=G,1,1 block=B,1,1
          filter (pins _by, _bz, _ty, _tz)
            mark "reduction S0 threads=B atomic"
              filter i mod B = _tx and floor(i / B) mod G = _bx
                band [outer dims..., floor(i / (B G))]   i: the innermost reduction dim

Each thread accumulates a grid-strided share privately, each block combines its threads
(warp shuffles, shared memory) and thread 0 folds the block's total into ``s`` with a
compare-and-swap loop (`codegen.gpu_reduce`): one pass over the data, G atomic operations.
The blocks fold in no fixed order, so a float sum is not bitwise deterministic from run to run
(the error stays that of a tree of partial sums); integer results are exact. Only for 32- and
64-bit types (the compare-and-swap width) with fixed sizes: ``B`` is the largest power of two
<= ``threads`` and <= the extent, ``G`` <= extent / B (so isl proves that every thread of every
block has work and reaches the combine), the grid cap, and the blocks the SMs hold.
"""

from __future__ import annotations

import islpy as isl

from ..dtypes import DType
from ..gpu_device import SM_COUNT
from ..poly.gpu_mapping import (
    BLOCK_PARAMS,
    THREAD_PARAMS,
    KernelMark,
    member_filter,
    pin_unused,
    split_lanes,
    vector_lanes,
)
from ..poly.scop import sets_of
from ..poly.state import CompileState
from .map_reductions import _full_participation

__all__ = ["build_full_reduction", "full_reduction_problem", "single_point", "single_thread"]

_CAS = (DType.FLOAT32, DType.FLOAT64, DType.INT32, DType.INT64, DType.UINT32, DType.UINT64)


def single_point(rng) -> bool:
    """True when the index range ``rng`` (an `ir.IndexRange`) holds one value at every size
    (``z in 0:1``, ``i in N:N+1``)."""
    try:
        width = rng.hi.pw_aff().sub(rng.lo.pw_aff())
    except isl.Error:  # pragma: no cover - isl could not align the expressions
        return False
    if not width.is_cst() or width.n_piece() != 1:
        return False
    values: list[int] = []
    width.foreach_piece(lambda _dom, aff: values.append(int(aff.get_constant_val().to_python())))
    return values == [1]


def full_reduction_problem(fn) -> str | None:
    """Why ``fn`` is not a full reduction `build_full_reduction` maps, or None. A reduction
    into one element written with indices of one value each (``S(z) +=! X(i) where z in
    0:1``) is one, as ``s +=! X(i)`` is."""
    if len(fn.statements) != 1:
        return "a full reduction must be the only statement"
    st = fn.statements[0]
    if st.reduction is None or not st.reduction_indices \
            or not all(single_point(st.range_of(i)) for i in st.lhs):
        return "the statement is not a reduction into a scalar"
    if fn.tensor(st.tensor).dtype not in _CAS:
        return f"{fn.tensor(st.tensor).dtype} values cannot be folded by compare-and-swap"
    return None


def _named(domain: isl.UnionSet, name: str) -> isl.UnionSet:
    out = isl.UnionSet.empty(domain.get_space())
    for s in sets_of(domain):
        if s.get_tuple_name() == name:
            out = out.union(isl.UnionSet.from_set(s))
    return out


def build_full_reduction(state: CompileState, domain: isl.UnionSet, threads: int,
                         grid: int, vector_bytes: int = 0) -> isl.Schedule | None:
    """The tree of the module docstring, or None when the sizes are not fixed or too small."""
    fn = state.fn
    st = fn.statements[0]
    inner = st.ranges[-1]
    if state.sizes is None or not all(p in state.sizes for p in inner.hi.params + inner.lo.params):
        return None
    extent = inner.hi.evaluate(state.sizes) - inner.lo.evaluate(state.sizes)
    b = 1
    while b * 2 <= min(threads, 1024, max(extent, 1)):
        b *= 2
    g = max(1, min(grid, extent // b, SM_COUNT * min(32, 2048 // b)))
    if b < 2 or extent < b * g:
        return None
    lanes = vector_lanes(fn, ("S0",), vector_bytes)
    if lanes > 1 and (extent % lanes or extent < lanes * b):
        lanes = 1
    g = max(1, min(g, extent // (lanes * b)))
    ctx = domain.get_ctx()
    update = _named(domain, "S0")
    init = _named(domain, "S0_init")
    filters = isl.UnionSetList.alloc(ctx, 2)
    if not init.is_empty():
        filters = filters.add(init)
    filters = filters.add(update)
    root = isl.Schedule.from_domain(domain).get_root().child(0)
    seq = root.insert_sequence(filters) if filters.n_union_set() > 1 else None
    if seq is not None:
        node = seq.child(0).child(0)
        node = pin_unused(node, BLOCK_PARAMS + THREAD_PARAMS, [1] * 6)
        node = node.insert_mark(isl.Id(KernelMark((1, 1, 1), (1, 1, 1)).name, context=ctx))
        node = node.parent().parent().child(1).child(0)
    else:
        node = root
    space = update.get_space()
    params = [space.get_dim_name(isl.dim_type.param, i) for i in range(space.dim(isl.dim_type.param))]
    (s0,) = sets_of(update)
    dims = [s0.get_dim_name(isl.dim_type.set, i) for i in range(s0.dim(isl.dim_type.set))]
    members = ", ".join(f"{{ S0[{', '.join(dims)}] -> [({d})] }}" for d in dims)
    mupa = isl.MultiUnionPwAff.read_from_str(ctx, f"[{', '.join(params)}] -> [{members}]")
    band = node.insert_partial_schedule(mupa)
    m = len(dims) - 1
    outer = _outer_split(state, st, b, lanes, g, grid)
    if outer is not None:  # blocks along the next reduction dimension, threads along the last
        g = outer
        tfilt = member_filter(band, m, lanes, b, "_tx")
        bfilt = member_filter(band, m - 1, 1, g, "_bx")
        node = split_lanes(band, lanes, b)
        node = node.insert_filter(bfilt.intersect(tfilt))
        if not _full_participation(node.child(0), b):
            outer = None
            node = band
    if outer is None:
        tfilt = member_filter(band, m, lanes, b, "_tx")
        bfilt = member_filter(band, m, lanes * b, g, "_bx")
        node = split_lanes(band, lanes, b * g)
        node = node.insert_filter(bfilt.intersect(tfilt))
        if not _full_participation(node.child(0), b):
            return None
    node = node.insert_mark(isl.Id(f"reduction S0 threads={b} atomic", context=ctx))
    node = pin_unused(node, BLOCK_PARAMS, [g, 1, 1])
    node = pin_unused(node, THREAD_PARAMS, [b, 1, 1])
    node = node.insert_mark(isl.Id(KernelMark((g, 1, 1), (b, 1, 1)).name, context=ctx))
    return node.get_schedule()


def _outer_split(state: CompileState, st, b: int, lanes: int, g: int, grid: int) -> int | None:
    """Blocks for the reduction dimension before the last when the last alone gives fewer
    blocks than SMs (``s +=! X(n, d)`` with d = 3000 split 2 ways while n = 8192 walked in
    every thread), else None."""
    if g >= SM_COUNT or len(st.reduction_indices) < 2:
        return None
    rng = st.ranges[-2]
    if rng.name not in st.reduction_indices:
        return None
    try:
        extent = rng.hi.evaluate(state.sizes) - rng.lo.evaluate(state.sizes)
    except (KeyError, ValueError):
        return None
    blocks = min(grid, extent, SM_COUNT * min(32, 2048 // b))
    return blocks if blocks > g else None


def single_thread(schedule: isl.Schedule) -> isl.Schedule:
    """``schedule`` as one kernel of one thread (for extents too small to split, or sizes
    not fixed): correct, sequential."""
    node = schedule.get_root().child(0)
    node = pin_unused(node, BLOCK_PARAMS + THREAD_PARAMS, [1] * 6)
    return node.insert_mark(isl.Id(KernelMark((1, 1, 1), (1, 1, 1)).name,
                                   context=node.get_ctx())).get_schedule()
