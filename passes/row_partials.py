"""Column reductions as phases of the row kernel, for `map-mixed` (its one-pass form).

`map-mixed` first tries to run the column reductions of a program inside its row kernel, so
that the operands they share with the row statements (a layernorm gradient's ``X`` and
``O_grad``) are read from DRAM once. `build_fused` gives::

    sequence
      filter { S<k>_init ... }                  the column reductions' identities
        kernel grid=GI,1,1 block=B',1,1         (the init kernel of `map_columns`)
      filter { row statements; S<k> ... }
        kernel grid=G,1,1 block=B,1,1           the map-rows tree, with one more kind of phase:
          mark "rows threads=B local=..."
            filter n mod G = _bx
              band [n]                          (S<k>: its reduced row index)
                sequence
                  ... row phases ...
                  filter { S<k> }               in program order among the row phases
                    mark "accumulate S<k> over-rows atomic"
                      filter d mod B = _tx
                        band [floor(d / B)]     unrolled: one call site per column stride
                                                (vector lanes: floor(d / L) mod B = _tx, band
                                                [floor(d / (L B)), d mod L], both unrolled)

The NVPTX lowering (`codegen.gpu_partials`) gives each call site of ``S<k>`` a register
that accumulates over every row of the block and folds it into ``lhs(d)`` atomically after the
row loop. Conditions (None otherwise, and `map-mixed` falls back to column kernels): every
column reduction has one lhs index and reduces over exactly the row indices (same ranges); the
row members carry no dependence once the column reductions' own reduction dependences are set
aside (a row statement that reads a column result across rows refuses); within a row, column
instances depend on nothing but their reduction; the stride loop is unrolled (the column
extent is a multiple of ``B``, times the vector lanes, with at most `map_rows.UNROLL_STRIDES`
strides), so that every call site stands for one column; and every thread reaches every
barrier (isl proves it).
"""

from __future__ import annotations

import dataclasses

import islpy as isl

from .. import ir as tc
from ..poly.gpu_mapping import (
    BLOCK_PARAMS,
    THREAD_PARAMS,
    KernelMark,
    member_extent,
    member_filter,
    pin_unused,
    vector_lanes,
)
from ..poly.legality import member_is_parallel
from ..poly.scop import sets_of
from ..poly.state import CompileState
from .map_columns import _extent, _kernel
from .map_reductions import _full_participation
from .map_rows import (
    UNROLL_STRIDES,
    _band,
    _insert,
    _named,
    _no_self_deps,
    _phase,
    _split_over_threads,
    _up_to_filter,
    local_tensors,
    rows_mark_name,
)

__all__ = ["build_fused", "fusable", "over_rows_mark_name"]


def over_rows_mark_name(statement: int) -> str:
    return f"accumulate S{statement} over-rows atomic"


def fusable(fn: tc.Function, rows: tuple[int, ...], columns: tuple[int, ...]) -> bool:
    """Every column reduction has one lhs index and reduces over exactly the row indices."""
    r = min(len(fn.statements[k].lhs) for k in rows)
    first = fn.statements[rows[0]]
    row_ranges = [(x.lo, x.hi) for x in first.ranges[:r]]
    for k in columns:
        st = fn.statements[k]
        red = st.reduction_indices
        if len(st.lhs) != 1 or len(red) != r:
            return False
        if [(st.range_of(n).lo, st.range_of(n).hi) for n in red] != row_ranges:
            return False
    return True


def _rows_first(fn: tc.Function, columns: tuple[int, ...]) -> tc.Function:
    """``fn`` with each column reduction's ranges listed reduced (row) indices first: what
    `map_rows.local_tensors` reads as "the row's own element" (``var(n)`` read by ``G_grad``
    in row ``n``'s iteration may then stay in shared memory)."""
    sts = list(fn.statements)
    for k in columns:
        st = sts[k]
        order = [st.range_of(n) for n in st.reduction_indices] + [st.range_of(n) for n in st.lhs]
        sts[k] = dataclasses.replace(st, ranges=tuple(order))
    return dataclasses.replace(fn, statements=tuple(sts))


def _column_phase(node: isl.ScheduleNode, state: CompileState, k: int, b: int,
                  vector_bytes: int) -> isl.ScheduleNode | None:
    """Fill the leaf ``node`` below column reduction k's phase filter (None to refuse)."""
    st = state.fn.statements[k]
    name = f"S{k}"
    update = node.get_domain()
    if update.is_empty():
        return _up_to_filter(node)
    band = _insert(node, _band(update, {name: [st.index_names.index(n) for n in st.lhs]}), True)
    span = member_extent(band, band.band_n_member() - 1)
    lanes = vector_lanes(state.fn, [name], vector_bytes)
    if span is not None and span % (lanes * b):
        lanes = 1  # (as `_split_over_threads` decides)
    if span is None or span % (lanes * b) or span // (lanes * b) > UNROLL_STRIDES:
        return None  # not unrolled: a call site would stand for several columns
    if not _no_self_deps(band, state, name, allow_reduction=True):
        return None
    node = _split_over_threads(band, b, lanes)
    node = node.insert_mark(isl.Id(over_rows_mark_name(k), context=node.get_ctx()))
    return _up_to_filter(node)


def _init_kernel(state: CompileState, domain: isl.UnionSet, columns: tuple[int, ...],
                 threads: int, grid: int) -> isl.Schedule | None:
    sets = [s for s in sets_of(domain) if s.get_tuple_name() in {f"S{k}_init" for k in columns}
            and not s.is_empty()]
    if not sets:
        return None
    u = isl.UnionSet.empty(domain.get_space())
    for s in sets:
        u = u.union(isl.UnionSet.from_set(s))
    st = state.fn.statements[columns[0]]
    cols = _extent(st.range_of(st.lhs[-1]), state.sizes)
    b = 1
    while b * 2 <= min(threads, 1024):
        b *= 2
    while cols is not None and b > 32 and b // 2 >= cols:
        b //= 2
    gi = max(1, min(grid, -(-cols // b) if cols else grid))
    root = isl.Schedule.from_domain(u).get_root().child(0)
    return _kernel(root, sets, 0, [], None, b, gi, None, None).get_schedule()


def build_fused(state: CompileState, domain: isl.UnionSet, rows: tuple[int, ...],
                columns: tuple[int, ...], r: int, b: int, grid: int, threads: int,
                vector_bytes: int = 0) -> isl.Schedule | None:
    """The tree of the module docstring (``domain``: every instance, with the block/thread
    parameters), or None when a condition fails."""
    fn = state.fn
    ctx = domain.get_ctx()
    order = tuple(sorted(rows + columns))
    names = {f"S{k}" for k in order} | {f"S{k}_init" for k in rows}
    body = _named(domain, names)
    row_dims: dict[str, list[int]] = {}
    for s in sets_of(body):
        name = s.get_tuple_name()
        k = int(name[1:].removesuffix("_init"))
        st = fn.statements[k]
        row_dims[name] = ([st.index_names.index(n) for n in st.reduction_indices]
                          if k in columns else list(range(r)))
    schedule = isl.Schedule.from_domain(body)
    band = _insert(schedule.get_root().child(0), _band(body, row_dims), True)
    # the column reductions' own dependences across rows become per-thread registers folded
    # atomically after the row loop; every other dependence must stay within a row
    cols = _named(domain, {f"S{k}" for k in columns})
    validity = state.deps.validity.subtract(
        state.deps.reduction.intersect_domain(cols).intersect_range(cols))
    for m in range(r):
        if not member_is_parallel(band, m, validity):
            return None
    filters = isl.UnionSetList.alloc(ctx, len(order))
    for k in order:
        filters = filters.add(_named(body, {f"S{k}", f"S{k}_init"}))
    seq = band.child(0).insert_sequence(filters)
    for i, k in enumerate(order):
        leaf = seq.child(i).child(0)
        phase = (_column_phase(leaf, state, k, b, vector_bytes) if k in columns
                 else _phase(leaf, state, k, r, b, vector_bytes))
        if phase is None:
            return None
        seq = phase.parent()
    if b > 1 and not _full_participation(seq, b):
        return None
    band = seq.parent()
    local = local_tensors(_rows_first(fn, columns))
    node = band.insert_filter(member_filter(band, r - 1, 1, grid, "_bx"))
    node = node.insert_mark(isl.Id(rows_mark_name(b, local), context=ctx))
    node = pin_unused(node, BLOCK_PARAMS, [grid, 1, 1])
    node = pin_unused(node, THREAD_PARAMS, [b, 1, 1])
    node = node.insert_mark(isl.Id(KernelMark((grid, 1, 1), (b, 1, 1)).name, context=ctx))
    fused = node.get_schedule()
    init = _init_kernel(state, domain, columns, threads, grid)
    return fused if init is None else init.sequence(fused)
