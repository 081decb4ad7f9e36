"""The `map-reduction` pass: a reduction member of each kernel on threadIdx.x, combined per block.

Runs after `map-to-threads`. For each kernel, the chain of bands below its mark is the tile
band ``T`` and, when tiled, the point band ``P``; the candidate *reduction member* is the
innermost member of the innermost band. The kernel is rewritten (when every check below holds)
into::

    kernel grid=... block=B,1,1
      filter (pins, blocks)            unchanged: block filters do not depend on band shapes
        band T minus its last member   (the reduction's tile member, when it is merged below)
          band P minus its last member (sequential in every thread: uniform across the block)
            mark "reduction S<k> threads=B"
              filter R mod B = _tx
                band [R]               R = the reduction member (tile * S + point when merged)
                  ...                  the statements, as before

Any thread mapping `map-to-threads` made is dropped: every thread of the block then shares the
outer loops, so at the mark all of them work on the same lhs element(s) of ``S<k>``; the NVPTX
backend gives ``S<k>`` a private accumulator under the mark and combines it after the subtree
(warp shuffles, shared memory, thread 0 folds into the lhs). The member is not block-mapped
(`map-to-blocks` maps only dependence-free members), so one block owns each lhs element.

Checks (else the kernel is left exactly as it was): the member carries no non-reduction
dependence (`member_is_parallel` against ``validity - reduction``) and carries the reduction
dependences of exactly one update ``S<k>`` (dtype float32/64 or a 32/64-bit integer); all
instances of ``S<k>`` under one outer iteration write the same element; no other statement under
the mark touches ``S<k>``'s tensor; *every* thread has instances under the mark at every outer
iteration (so isl puts no ``_tx`` guard or bound above the mark and every thread reaches the
barriers): ``B`` is the largest power of two <= ``threads`` (and <= 1024) for which this holds,
and at least ``min-threads``; and the result runs every instance exactly once
(`gpu_mapping.check_coverage`). A kernel in which `map-to-threads` mapped two or more members
(matmul-like) keeps that mapping: its reduction is left sequential per thread.
"""

from __future__ import annotations

import dataclasses
import re
from dataclasses import dataclass

import islpy as isl

from ..dtypes import DType
from ..poly.gpu_mapping import (
    THREAD_PARAMS,
    KernelMark,
    check_coverage,
    first_band_below,
    kernel_marks,
    member_filter,
    pin_unused,
    with_params,
)
from ..poly.kernel_select import selects
from ..poly.legality import check_legal, member_is_parallel, same_prefix
from ..poly.scop import maps_of, sets_of
from ..poly.state import CompileState
from ..poly.tree import node_at, path_of
from .base import Pass, register

__all__ = ["REDUCTION_MARK", "MapReduction", "parse_reduction_mark", "reduction_mark_name"]

REDUCTION_MARK = re.compile(r"^reduction S(\d+) threads=(\d+)(?: atomic)?$")
_BAND = isl.schedule_node_type.band
_FILTER = isl.schedule_node_type.filter
_DTYPES = (DType.FLOAT32, DType.FLOAT64, DType.INT32, DType.INT64, DType.UINT32, DType.UINT64)


def reduction_mark_name(statement: int, threads: int) -> str:
    return f"reduction S{statement} threads={threads}"


def parse_reduction_mark(name: str | None) -> tuple[int, int] | None:
    """(statement index, threads) of a ``reduction S<k> threads=B`` mark name, else None."""
    m = REDUCTION_MARK.match(name or "")
    return (int(m.group(1)), int(m.group(2))) if m else None


@register
@dataclass(frozen=True)
class MapReduction(Pass):
    """Map the innermost reduction member of each kernel to ``threadIdx.x`` (see the module
    docstring): ``threads`` is the most threads per block used for one reduction (a power of
    two is taken, at most 1024); kernels where fewer than ``min-threads`` threads would have
    work at every step are left alone. Requires `map-to-blocks` (and `map-to-threads`) first.
    """

    name = "map-reduction"
    requires_schedule = True
    threads: int = 256
    min_threads: int = 2
    only: tuple[int, ...] = ()         # statements of the kernels it maps (poly.kernel_select)
    skip: tuple[int, ...] = ()         # statements of the kernels it leaves alone

    def __post_init__(self):
        if self.threads < 1 or self.min_threads < 1:
            raise ValueError("map-reduction: threads and min-threads must be >= 1")

    def run(self, state: CompileState) -> CompileState:
        schedule = state.schedule
        assert schedule is not None
        marks = kernel_marks(schedule)
        if not marks:
            return state
        schedule = with_params(schedule, THREAD_PARAMS)
        updates = {f"S{k}" for k, st in enumerate(state.fn.statements) if st.reduction is not None}
        for path, km in reversed(marks):
            # only a kernel that runs a reduction update can map one (`_checks`): the others
            # are left before any tree surgery (in a definition of many kernels, each attempt
            # rebuilt the whole tree: quadratic)
            names = {s.get_tuple_name() for s in sets_of(node_at(schedule, path).get_domain())}
            if not names & updates or not selects(node_at(schedule, path), self.only, self.skip):
                continue
            mapped = _map_kernel(state, schedule, path, km, self.threads, self.min_threads)
            if mapped is not None:
                schedule = mapped
        return dataclasses.replace(state, schedule=schedule)


# ---------------------------------------------------------------- one kernel


def _band_parts(band: isl.ScheduleNode) -> tuple[isl.MultiUnionPwAff, bool, list[bool]]:
    n = band.band_n_member()
    return (band.band_get_partial_schedule(), band.band_get_permutable(),
            [band.band_member_get_coincident(m) for m in range(n)])


def _insert_band(node: isl.ScheduleNode, mupa: isl.MultiUnionPwAff, permutable: bool,
                 coincident: list[bool]) -> isl.ScheduleNode:
    node = node.insert_partial_schedule(mupa).band_set_permutable(permutable)
    for m, c in enumerate(coincident):
        node = node.band_member_set_coincident(m, c)
    return node


def _without_last(mupa: isl.MultiUnionPwAff) -> isl.MultiUnionPwAff:
    return mupa.drop_dims(isl.dim_type.out, mupa.dim(isl.dim_type.out) - 1, 1)


def _as_map(upa: isl.UnionPwAff, domain: isl.UnionSet) -> isl.UnionMap:
    return isl.UnionMap.from_union_pw_aff(upa).intersect_domain(domain)


def _merged(tile: isl.UnionPwAff, point: isl.UnionPwAff, domain: isl.UnionSet) -> isl.UnionPwAff | None:
    """``tile * S + point`` when (tile, point) is the tiling of that value by some S, else None."""
    top = None
    for s in maps_of(_as_map(point, domain)):
        vals = s.range()
        vals = vals.project_out(isl.dim_type.param, 0, vals.dim(isl.dim_type.param))
        if vals.is_empty():
            continue
        hi = vals.dim_max_val(0)
        if not hi.is_int():
            return None
        top = max(top or 0, int(hi.to_python()))
    if top is None or top < 1:
        return None
    ctx = tile.get_ctx()
    size = isl.Val.int_from_si(ctx, top + 1)
    full = tile.scale_val(size).add(point)
    if not _as_map(full.scale_down_val(size).floor(), domain).is_equal(_as_map(tile, domain)):
        return None
    if not _as_map(full.mod_val(size), domain).is_equal(_as_map(point, domain)):
        return None
    return full


def _statement_of(deps: isl.UnionMap) -> str | None:
    names = {m.get_tuple_name(isl.dim_type.in_) for m in maps_of(deps)}
    names |= {m.get_tuple_name(isl.dim_type.out) for m in maps_of(deps)}
    return names.pop() if len(names) == 1 else None


def _active(node: isl.ScheduleNode, deps: isl.UnionMap) -> isl.UnionMap:
    return same_prefix(node, deps)


def _map_kernel(state: CompileState, schedule: isl.Schedule, path: tuple[int, ...],
                km: KernelMark, threads: int, min_threads: int) -> isl.Schedule | None:
    """``schedule`` with kernel ``path`` reduction-mapped, or None to leave it alone.

    The member tried first is the innermost one of the innermost band (merged with its tile
    member when it was tiled); then, for a tile band over a point band, the tile band's last
    member when it was left untiled (it moves below the point band).
    """
    if km.block[1] > 1 or km.block[2] > 1:
        return None  # two or more members on threads: keep that mapping
    for outer_last in (False, True):
        mapped = _attempt(state, schedule, path, km, threads, min_threads, outer_last)
        if mapped is not None:
            return mapped
    return None


def _attempt(state: CompileState, schedule: isl.Schedule, path: tuple[int, ...],
             km: KernelMark, threads: int, min_threads: int,
             outer_last: bool) -> isl.Schedule | None:
    top = node_at(schedule, path).child(0)
    if top.get_type() == _FILTER:  # map-to-threads pinned an unused _tx to 0: free it again
        top = top.delete().insert_filter(_unpinned(top.filter_get_filter(), "_tx"))
    outer = first_band_below(top)
    if outer is None:
        return None
    bands = [outer]
    below = outer.child(0) if outer.n_children() == 1 else None
    if below is not None and below.get_type() == _FILTER and below.n_children() == 1 \
            and below.child(0).get_type() == _BAND:
        below = below.delete()  # the thread filter of map-to-threads: the block is re-mapped
        bands = [below.parent(), below]
    elif below is not None and below.get_type() == _BAND:
        bands = [outer, below]
    if outer_last:
        if len(bands) != 2:
            return None
        rband = _sink_outer_last(bands[1])
        if rband is None:
            return None
        return _finish(state, rband, path, km, threads, min_threads)
    inner = bands[-1]
    mupa_in, perm_in, coin_in = _band_parts(inner)
    red = mupa_in.get_at(mupa_in.dim(isl.dim_type.out) - 1)
    merge_tile = False
    if len(bands) == 2:
        mupa_out = bands[0].band_get_partial_schedule()
        full = _merged(mupa_out.get_at(mupa_out.dim(isl.dim_type.out) - 1), red, inner.get_domain())
        if full is not None:
            red, merge_tile = full, True
    # rebuild: [outer minus tile member] -> [inner minus last] -> band [red] -> children
    node = inner.delete()
    node = node.insert_partial_schedule(isl.MultiUnionPwAff.from_union_pw_aff(red))
    rband_depth = 0
    if mupa_in.dim(isl.dim_type.out) > 1:
        node = _insert_band(node, _without_last(mupa_in), perm_in, coin_in[:-1])
        node = node.child(0)
        rband_depth = 1
    if merge_tile:
        top = node
        for _ in range(rband_depth):
            top = top.parent()
        out = top.parent()
        assert out.get_type() == _BAND
        mupa_o, perm_o, coin_o = _band_parts(out)
        top = out.delete()
        if mupa_o.dim(isl.dim_type.out) > 1:
            top = _insert_band(top, _without_last(mupa_o), perm_o, coin_o[:-1]).child(0)
        node = top
        for _ in range(rband_depth):
            node = node.child(0)
    return _finish(state, node, path, km, threads, min_threads)


def _sink_outer_last(inner: isl.ScheduleNode) -> isl.ScheduleNode | None:
    """Move the last member of the band above ``inner`` to a new band below it."""
    mupa_o, perm_o, coin_o = _band_parts(inner.parent())
    red = mupa_o.get_at(mupa_o.dim(isl.dim_type.out) - 1)
    node = inner.child(0).insert_partial_schedule(isl.MultiUnionPwAff.from_union_pw_aff(red))
    node = node.parent().parent()  # the outer band
    node = node.delete()
    depth = 1
    if mupa_o.dim(isl.dim_type.out) > 1:
        node = _insert_band(node, _without_last(mupa_o), perm_o, coin_o[:-1])
        depth = 2
    for _ in range(depth):
        node = node.child(0)
    return node if node.get_type() == _BAND else None


def _finish(state: CompileState, rband: isl.ScheduleNode, path: tuple[int, ...],
            km: KernelMark, threads: int, min_threads: int) -> isl.Schedule | None:
    rpath = path_of(rband)
    if not _checks(state, rband):
        return None
    stmt = _statement_of(_active(rband, state.deps.reduction))
    k = int(stmt[1:])
    trial_schedule = rband.get_schedule()
    for b in _candidates(threads, min_threads):
        trial = _with_filter(trial_schedule, rpath, path, km, k, b, state.ctx)
        if trial is not None:
            try:
                check_legal(trial, state.deps)
                # a thread filter of map-to-threads left below the mark (a padded point band
                # under a sequence) would keep some threads' share of the reduction from
                # running: the tuner met block (2, 1, 1) with tiles (1, 1, 2) on a matmul
                check_coverage(trial, state.scop.domain, state.scop.context)
            except AssertionError:
                return None
            return trial
    return None


def _unpinned(filt: isl.UnionSet, param: str) -> isl.UnionSet:
    """``filt`` without its constraints on parameter ``param``."""
    space = filt.get_space()
    pos = space.find_dim_by_name(isl.dim_type.param, param)
    if pos < 0:
        return filt
    return filt.project_out(isl.dim_type.param, pos, 1).align_params(space)


def _candidates(threads: int, min_threads: int) -> list[int]:
    b = 1
    while b * 2 <= min(threads, 1024):
        b *= 2
    found = []
    while b >= max(2, min_threads):
        found.append(b)
        b //= 2
    return found


def _checks(state: CompileState, rband: isl.ScheduleNode) -> bool:
    deps = state.deps
    if not member_is_parallel(rband, 0, deps.validity.subtract(deps.reduction)):
        return False
    active = _active(rband, deps.reduction)
    if active.is_empty():
        return False
    stmt = _statement_of(active)
    if stmt is None or not re.fullmatch(r"S\d+", stmt):
        return False
    k = int(stmt[1:])
    st = state.fn.statements[k]
    if st.reduction is None or state.fn.tensor(st.tensor).dtype not in _DTYPES:
        return False
    domain = rband.get_domain()
    writes = state.scop.writes.intersect_domain(domain)
    reads = state.scop.all_reads.intersect_domain(domain)
    own = writes.intersect_domain(_named(domain, stmt))
    # every instance of S<k> under one outer iteration writes the same element
    prefix = rband.get_prefix_schedule_union_map().intersect_domain(_named(domain, stmt))
    same = prefix.apply_range(prefix.reverse())
    if not same.is_subset(own.apply_range(own.reverse())):
        return False
    # no other statement under the mark touches the tensor
    for m in maps_of(writes.union(reads)):
        name = m.get_tuple_name(isl.dim_type.in_)
        if name not in (stmt, f"{stmt}_init") and m.get_tuple_name(isl.dim_type.out) == st.tensor:
            return False
    return True


def _named(domain: isl.UnionSet, name: str) -> isl.UnionSet:
    found = isl.UnionSet.empty(domain.get_space())
    for s in sets_of(domain):
        if s.get_tuple_name() == name:
            found = found.union(isl.UnionSet.from_set(s))
    return found


def _with_filter(schedule: isl.Schedule, rpath: tuple[int, ...], kpath: tuple[int, ...],
                 km: KernelMark, k: int, b: int, ctx: isl.Context) -> isl.Schedule | None:
    """Insert the ``_tx`` filter and the reduction mark above the band at ``rpath``, pin
    ``_ty``/``_tz``, set the kernel's block; None when some thread would sit idle."""
    rband = node_at(schedule, rpath)
    rband = _split_init(rband, k, ctx)
    if rband is None:
        return None
    node = rband.insert_filter(member_filter(rband, 0, 1, b, "_tx"))
    node = node.insert_mark(isl.Id(reduction_mark_name(k, b), context=ctx))
    if not _full_participation(node.child(0).child(0), b):
        return None
    mark = node_at(node.get_schedule(), kpath)
    mark = pin_unused(mark.child(0), THREAD_PARAMS, [b, 1, 1]).parent()
    new = KernelMark(km.grid, (b, 1, 1))
    mark = mark.delete().insert_mark(isl.Id(new.name, context=ctx))
    return mark.get_schedule()


def _split_init(rband: isl.ScheduleNode, k: int, ctx: isl.Context) -> isl.ScheduleNode | None:
    """The band to put under the reduction mark: ``rband`` itself when only ``S<k>`` runs below
    it; when ``S<k>_init`` does too, a sequence [init, update] above two copies of the band,
    the init's copy pinned to thread 0, and the update's copy returned. (Left together, the
    init's instances, which only thread 0 runs, make isl split the subtree under a ``_tx``
    guard: the combine and its barriers would be copied under it, and the block would hang.)
    None when other statements run below the band."""
    domain = rband.get_domain()
    names = {s.get_tuple_name() for s in sets_of(domain)}
    stmt, init = f"S{k}", f"S{k}_init"
    if names == {stmt}:
        return rband
    if names != {stmt, init}:
        return None
    filters = isl.UnionSetList.alloc(ctx, 2).add(_named(domain, init)).add(_named(domain, stmt))
    seq = rband.insert_sequence(filters)
    init_band = seq.child(0).child(0)
    seq = pin_unused(init_band, THREAD_PARAMS, [1, 1, 1]).parent().parent()
    return seq.child(1).child(0)


def _full_participation(rband: isl.ScheduleNode, b: int) -> bool:
    """Every ``_tx`` in [0, b) has an instance under ``rband`` at every outer iteration. The
    instances are those reaching the leaves below, through the filters there: a phase
    pinned to ``_tx = 0`` below a row sequence counts for thread 0 only."""
    prefix = rband.get_prefix_schedule_union_map()
    outer = prefix.intersect_domain(_leaf_domain(rband)).range()
    for s in sets_of(outer):
        pos = s.find_dim_by_name(isl.dim_type.param, "_tx")
        if pos < 0:
            return False
        bounded = (s.lower_bound_val(isl.dim_type.param, pos, isl.Val.zero(s.get_ctx()))
                   .upper_bound_val(isl.dim_type.param, pos, isl.Val.int_from_si(s.get_ctx(), b - 1)))
        anyone = s.project_out(isl.dim_type.param, pos, 1).align_params(s.get_space().params())
        anyone = anyone.lower_bound_val(isl.dim_type.param, pos, isl.Val.zero(s.get_ctx()))
        anyone = anyone.upper_bound_val(isl.dim_type.param, pos, isl.Val.int_from_si(s.get_ctx(), b - 1))
        if not anyone.is_subset(bounded):
            return False
    return True


def _leaf_domain(node: isl.ScheduleNode) -> isl.UnionSet:
    """The statement instances that reach the leaves below ``node`` (its domain, restricted by
    the filters below it)."""
    found = [node.get_domain().empty(node.get_domain().get_space())]

    def visit(n: isl.ScheduleNode) -> bool:
        if n.get_type() == isl.schedule_node_type.leaf:
            found[0] = found[0].union(n.get_domain())
        return True

    node.foreach_descendant_top_down(visit)
    return found[0]
