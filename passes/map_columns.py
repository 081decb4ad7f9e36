"""A column reduction (``S(d) +=! X(n, d)``: reduced over an outer dimension), for `map-rows`.

`map-rows` calls `build_columns` for a function whose only statement reduces over indices
that are not the innermost index of its reads (`column_problem` is None; a read of only
reduced indices, a per-row operand such as ``w(n)``, is a broadcast to the warp and allowed);
`map-mixed` calls it for each column reduction of a program that also has row statements. Threads take
consecutive columns, so every warp reads consecutive addresses; the reduced dimension is split
over ``blockIdx.y`` so that enough blocks run; each thread sums its share of one column in a
register and folds it into ``S(d)`` atomically (``red.global.add`` for sums, compare-and-swap
otherwise)::

    sequence
      filter { S0_init }                       (the ``!`` form only)
        kernel grid=GI,1,1 block=B,1,1         the identity, before any block folds
          filter d mod B = _tx and floor(d / B) mod GI = _bx
            band [outer lhs dims..., floor(d / (B GI))]
      filter { S0 }
        kernel grid=GX,GY,1 block=B,1,1
          filter d mod B = _tx and floor(d / B) mod GX = _bx and n mod GY = _by
            band [outer lhs dims..., floor(d / (B GX))]
              mark "accumulate S0 atomic"      one accumulator per thread, no barrier
                band [floor(n / GY), other reduction dims...]

The blocks fold in no fixed order: a float sum is not bitwise deterministic run to run; integer
results are exact. 32- and 64-bit types only. ``B`` is the largest power of two <= ``threads``
that the columns need, ``GX`` covers the columns (at most ``grid``), ``GY`` fills the SMs
(`gpu_defaults.SM_COUNT` × 2048 / B blocks in all) without exceeding the reduced extent.
"""

from __future__ import annotations

import islpy as isl

from .. import ir as tc
from ..dtypes import DType
from ..gpu_defaults import SM_COUNT
from ..poly.gpu_mapping import BLOCK_PARAMS, THREAD_PARAMS, KernelMark, pin_unused
from ..poly.scop import sets_of
from ..poly.state import CompileState

__all__ = ["build_columns", "column_problem"]

_ATOMIC = (DType.FLOAT32, DType.FLOAT64, DType.INT32, DType.INT64, DType.UINT32, DType.UINT64)


def column_problem(fn: tc.Function) -> str | None:
    """Why ``fn`` is not a column reduction `build_columns` maps, or None."""
    if len(fn.statements) != 1:
        return "a column reduction must be the only statement"
    st = fn.statements[0]
    if not st.lhs or st.reduction is None or not st.reduction_indices:
        return "the statement is not a reduction into a tensor"
    if fn.tensor(st.tensor).dtype not in _ATOMIC:
        return f"{fn.tensor(st.tensor).dtype} values cannot be folded atomically"
    reduced, col = set(st.reduction_indices), st.lhs[-1]
    seen = False
    for rd in (x for x in tc.walk(st.rhs) if isinstance(x, tc.Read)):
        used = {x.name for i in rd.indices for x in tc.walk(i) if isinstance(x, tc.Index)}
        if used & reduced:
            if not used & set(st.lhs):  # a per-row operand (``w(n)``): one address per warp
                continue
            last = rd.indices[-1] if rd.indices else None
            if not isinstance(last, tc.Index) or last.name != col:
                return "a read is not contiguous along the lhs's innermost index"
            seen = True
    return None if seen else "no read runs along the reduced dimension"


def _params(domain: isl.UnionSet) -> str:
    space = domain.get_space()
    return ", ".join(space.get_dim_name(isl.dim_type.param, i)
                     for i in range(space.dim(isl.dim_type.param)))


def _dims(s: isl.Set) -> list[str]:
    return [s.get_dim_name(isl.dim_type.set, i) for i in range(s.dim(isl.dim_type.set))]


def _extent(r: tc.IndexRange, sizes) -> int | None:
    if sizes is None or not all(p in sizes for p in r.lo.params + r.hi.params):
        return None
    return r.hi.evaluate(sizes) - r.lo.evaluate(sizes)


def _kernel(node: isl.ScheduleNode, s: isl.Set, col: int, outer: list[int], inner: list[str],
            b: int, gx: int, split: tuple[int, int] | None, mark: str | None) -> isl.ScheduleNode:
    """Fill the leaf ``node`` (whose domain is the set ``s``) with one kernel's subtree."""
    ctx = node.get_ctx()
    name, dims, params = s.get_tuple_name(), _dims(s), _params(node.get_domain())
    c = dims[col]
    cond = f"{c} mod {b} = _tx and floor({c}/{b}) mod {gx} = _bx"
    gy = 1
    if split is not None:
        pos, gy = split
        cond += f" and {dims[pos]} mod {gy} = _by"
    filt = isl.UnionSet.read_from_str(ctx, f"[{params}] -> {{ {name}[{', '.join(dims)}] : {cond} }}")
    filt = filt.intersect(node.get_domain())

    def band(at: isl.ScheduleNode, exprs: list[str]) -> isl.ScheduleNode:
        members = ", ".join(f"{{ {name}[{', '.join(dims)}] -> [({e})] }}" for e in exprs)
        mupa = isl.MultiUnionPwAff.read_from_str(ctx, f"[{params}] -> [{members}]")
        return at.insert_partial_schedule(mupa)

    outer_exprs = [dims[i] for i in outer] + [f"floor({c}/{b * gx})"]
    top = band(node, outer_exprs)
    for m in range(len(outer_exprs)):
        top = top.band_member_set_coincident(m, 1)
    if mark is not None and inner:
        leaf = top.child(0)
        leaf = band(leaf, inner)
        leaf = leaf.insert_mark(isl.Id(mark, context=ctx))
        top = leaf.parent()
    node = top.insert_filter(filt)
    node = pin_unused(node, BLOCK_PARAMS, [gx, gy, 1])
    node = pin_unused(node, THREAD_PARAMS, [b, 1, 1])
    return node.insert_mark(isl.Id(KernelMark((gx, gy, 1), (b, 1, 1)).name, context=ctx))


def build_columns(state: CompileState, domain: isl.UnionSet, threads: int,
                  grid: int, statement: int = 0) -> isl.Schedule | None:
    """The tree of the module docstring for ``S<statement>`` (``domain``: its instances; None
    when the reduction runs no instance)."""
    fn = state.fn
    st = fn.statements[statement]
    n_lhs = len(st.lhs)
    cols = _extent(st.ranges[n_lhs - 1], state.sizes)
    b = 1
    while b * 2 <= min(threads, 1024):
        b *= 2
    while cols is not None and b > 32 and b // 2 >= cols:
        b //= 2
    gx = max(1, min(grid, -(-cols // b) if cols else grid))
    red0 = _extent(st.ranges[n_lhs], state.sizes)
    gy = max(1, min(65535, red0 or 1, (SM_COUNT * (2048 // b)) // gx))
    ctx = domain.get_ctx()
    sets = {s.get_tuple_name(): s for s in sets_of(domain) if not s.is_empty()}
    name = f"S{statement}"
    update, init = sets.get(name), sets.get(f"{name}_init")
    if update is None:
        return None
    root = isl.Schedule.from_domain(domain).get_root().child(0)
    names = [n for n in (f"{name}_init", name) if n in sets]
    if len(names) == 2:
        filters = isl.UnionSetList.alloc(ctx, 2)
        for n in names:
            filters = filters.add(isl.UnionSet.from_set(sets[n]))
        seq = root.insert_sequence(filters)
        gi = max(1, min(grid, -(-cols // b) if cols else grid))
        node = _kernel(seq.child(0).child(0), init, n_lhs - 1, list(range(n_lhs - 1)), [], b, gi,
                       None, None)
        node = node.parent().parent().child(1).child(0)
    else:
        node = root
    dims = _dims(update)
    inner = [f"floor({dims[n_lhs]}/{gy})", *dims[n_lhs + 1:]]
    node = _kernel(node, update, n_lhs - 1, list(range(n_lhs - 1)), inner, b, gx, (n_lhs, gy),
                   f"accumulate {name} atomic")
    return node.get_schedule()
