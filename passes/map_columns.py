"""A column reduction (``S(d) +=! X(n, d)``: reduced over an outer dimension), for `map-rows`.

`map-rows` calls `build_columns` for a function whose only statement reduces over indices
that are not the innermost index of its reads (`column_problem` is None; a read of only
reduced indices, a per-row operand such as ``w(n)``, is a broadcast to the warp and allowed);
`map-mixed` calls it for each column reduction of a program that also has row statements. Threads take
consecutive columns, so every warp reads consecutive addresses; the widest lhs index before
the column (``a`` in ``S(a, d) +=! X(a, n, d)``; "outer" below) is strided over ``blockIdx.z``,
and the reduced dimension over ``blockIdx.y`` as far as the SMs still need blocks; each thread
sums its share of one column in a register and folds it into ``S(a, d)`` atomically
(``red.global.add`` for sums, compare-and-swap otherwise)::

    sequence
      filter { S0_init }                       (the ``!`` form only)
        kernel grid=GI,1,GZ block=B,1,1        the identity, before any block folds
          filter d mod B = _tx and floor(d / B) mod GI = _bx and a mod GZ = _bz
            band [outer lhs dims, a as floor(a / GZ)..., floor(d / (B GI))]
      filter { S0 }
        kernel grid=GX,GY,GZ block=B,1,1
          filter d mod B = _tx and floor(d / B) mod GX = _bx and n mod GY = _by and a mod GZ = _bz
            band [outer lhs dims, a as floor(a / GZ)..., floor(d / (B GX))]
              mark "accumulate S0 atomic"      one accumulator per thread, no barrier
                band [floor(n / GY), other reduction dims...]

The blocks fold in no fixed order: a float sum is not bitwise deterministic run to run; integer
results are exact. 32- and 64-bit types only. ``B`` is the largest power of two <= ``threads``
that the columns need, ``GX`` covers the columns (at most ``grid``). Of the blocks the SMs
hold at once (`gpu_defaults.SM_COUNT` × 2048 / B; H), ``GZ`` takes what the outer index can
use, ``GX`` × ``GZ`` <= min(H, ``grid``) (at most 65535; 1 without an outer index, the ``a
mod`` part then absent), and ``GY`` the rest, ``GX`` × ``GY`` × ``GZ`` <= H, at most the
reduced extent: a reduction is split (one atomic per chunk) only as far as the outputs alone
leave SMs idle. (Before ``GZ``, a mid-axis sum
256×512×256 ran grid (1, 512): every thread walked all 256 values of ``a`` with one atomic per
element read.)
"""

from __future__ import annotations

from collections.abc import Callable

import islpy as isl

from .. import ir as tc
from ..dtypes import DType
from ..gpu_device import SM_COUNT
from ..poly.gpu_mapping import BLOCK_PARAMS, THREAD_PARAMS, KernelMark, pin_unused
from ..poly.scop import sets_of
from ..poly.state import CompileState

__all__ = ["accumulate_mark_name", "build_columns", "column_problem"]

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
            if not set(st.lhs) <= used:
                # ``A(m, k, b)`` in ``C(m, n, b) +=! A(m, k, b) * B(k, n, b)``: reused across
                # outputs, a contraction (a thread per column walked every other output)
                return "a read is reused across outputs (a contraction, not a column reduction)"
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


def _kernel(node: isl.ScheduleNode, sets: list[isl.Set], col: int, outer: list[int],
            inner: Callable[[list[str]], list[str]] | None, b: int, gx: int,
            split: tuple[int, int] | None, mark: str | None,
            zsplit: tuple[int, int] | None = None) -> isl.ScheduleNode:
    """Fill the leaf ``node`` (whose domain is the union of ``sets``, statements of the same
    lhs rank) with one kernel's subtree; ``inner(dims)`` are the accumulated band's members;
    ``split``/``zsplit``: (dimension, blocks) strided over ``blockIdx.y``/``.z``."""
    ctx = node.get_ctx()
    params = _params(node.get_domain())
    gy = 1 if split is None else split[1]
    gz = 1 if zsplit is None else zsplit[1]

    def union(text_of: Callable[[str, list[str]], str]) -> str:
        return "; ".join(text_of(x.get_tuple_name(), _dims(x)) for x in sets)

    def cond(name: str, dims: list[str]) -> str:
        c = dims[col]
        text = f"{c} mod {b} = _tx and floor({c}/{b}) mod {gx} = _bx"
        if split is not None:
            text += f" and {dims[split[0]]} mod {gy} = _by"
        if zsplit is not None:
            text += f" and {dims[zsplit[0]]} mod {gz} = _bz"
        return f"{name}[{', '.join(dims)}] : {text}"

    filt = isl.UnionSet.read_from_str(ctx, f"[{params}] -> {{ {union(cond)} }}")
    filt = filt.intersect(node.get_domain())

    def band(at: isl.ScheduleNode, exprs: Callable[[list[str]], list[str]]) -> isl.ScheduleNode:
        count = len(exprs(_dims(sets[0])))
        members = ", ".join(
            "{ " + union(lambda name, dims, m=m: f"{name}[{', '.join(dims)}] -> [({exprs(dims)[m]})]")
            + " }" for m in range(count))
        mupa = isl.MultiUnionPwAff.read_from_str(ctx, f"[{params}] -> [{members}]")
        return at.insert_partial_schedule(mupa)

    def outer_exprs(dims: list[str]) -> list[str]:
        walked = [f"floor({dims[i]}/{gz})" if zsplit is not None and i == zsplit[0] else dims[i]
                  for i in outer]
        return [*walked, f"floor({dims[col]}/{b * gx})"]

    top = band(node, outer_exprs)
    for m in range(len(outer) + 1):
        top = top.band_member_set_coincident(m, 1)
    if mark is not None and inner is not None and inner(_dims(sets[0])):
        leaf = band(top.child(0), inner)
        if len(sets) > 1:  # the statements in program order at each accumulated point
            filters = isl.UnionSetList.alloc(ctx, len(sets))
            for x in sets:
                filters = filters.add(isl.UnionSet.from_set(x))
            leaf = leaf.child(0).insert_sequence(filters).parent()
        leaf = leaf.insert_mark(isl.Id(mark, context=ctx))
        top = leaf.parent()
    node = top.insert_filter(filt)
    node = pin_unused(node, BLOCK_PARAMS, [gx, gy, gz])
    node = pin_unused(node, THREAD_PARAMS, [b, 1, 1])
    return node.insert_mark(isl.Id(KernelMark((gx, gy, gz), (b, 1, 1)).name, context=ctx))


def _outer_blocks(st: tc.Statement, n_lhs: int, sizes, most: int) -> tuple[int, int] | None:
    """(dimension, blocks) for ``blockIdx.z``: the widest lhs index before the column index
    (the last of equals; the last when the sizes are not known), strided over at most
    ``most`` blocks (and 65535), else None (no such index, or one block). Without it every
    thread walked every outer output (``S(a, c) +=! X(a, b, c)``: 256 values of ``a``) while
    the blocks split the reduction down to one value each, one atomic per element read."""
    if n_lhs < 2 or most < 2:
        return None
    extents = [_extent(st.ranges[i], sizes) for i in range(n_lhs - 1)]
    if any(e is None for e in extents):
        return n_lhs - 2, min(most, 65535)
    widest = max(range(n_lhs - 1), key=lambda i: (extents[i], i))
    blocks = min(most, 65535, extents[widest])
    return (widest, blocks) if blocks > 1 else None


def accumulate_mark_name(statements: tuple[int, ...]) -> str:
    """``accumulate S3 atomic``, ``accumulate S3,S4 atomic`` (`codegen.gpu_rows`)."""
    return f"accumulate {','.join(f'S{k}' for k in statements)} atomic"


def build_columns(state: CompileState, domain: isl.UnionSet, threads: int,
                  grid: int, statements: tuple[int, ...] = (0,)) -> isl.Schedule | None:
    """The tree of the module docstring for the column reductions ``statements`` (``domain``:
    their instances; several: the same lhs rank and ranges as the first, accumulated in one
    loop under one mark; None when they run no instance)."""
    fn = state.fn
    st = fn.statements[statements[0]]
    n_lhs = len(st.lhs)
    cols = _extent(st.ranges[n_lhs - 1], state.sizes)
    b = 1
    while b * 2 <= min(threads, 1024):
        b *= 2
    while cols is not None and b > 32 and b // 2 >= cols:
        b //= 2
    gx = max(1, min(grid, -(-cols // b) if cols else grid))
    budget = SM_COUNT * (2048 // b)  # the blocks of b threads the SMs hold at once
    zsplit = _outer_blocks(st, n_lhs, state.sizes, max(1, min(grid, budget) // gx))
    gz = 1 if zsplit is None else zsplit[1]
    red0 = _extent(st.ranges[n_lhs], state.sizes)
    gy = max(1, min(65535, red0 or 1, budget // (gx * gz)))
    ctx = domain.get_ctx()
    sets = {s.get_tuple_name(): s for s in sets_of(domain) if not s.is_empty()}
    updates = [sets[f"S{k}"] for k in statements if f"S{k}" in sets]
    inits = [sets[f"S{k}_init"] for k in statements if f"S{k}_init" in sets]
    if not updates:
        return None
    root = isl.Schedule.from_domain(domain).get_root().child(0)
    if inits:
        filters = isl.UnionSetList.alloc(ctx, 2)
        for part in (inits, updates):
            u = isl.UnionSet.empty(domain.get_space())
            for x in part:
                u = u.union(isl.UnionSet.from_set(x))
            filters = filters.add(u)
        seq = root.insert_sequence(filters)
        gi = max(1, min(grid, -(-cols // b) if cols else grid))
        node = _kernel(seq.child(0).child(0), inits, n_lhs - 1, list(range(n_lhs - 1)), None, b, gi,
                       None, None, zsplit)
        node = node.parent().parent().child(1).child(0)
    else:
        node = root

    def inner(dims: list[str]) -> list[str]:
        return [f"floor({dims[n_lhs]}/{gy})", *dims[n_lhs + 1:]]

    ran = tuple(k for k in statements if f"S{k}" in sets)
    node = _kernel(node, updates, n_lhs - 1, list(range(n_lhs - 1)), inner, b, gx, (n_lhs, gy),
                   accumulate_mark_name(ran), zsplit)
    return node.get_schedule()
