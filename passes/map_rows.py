"""The `map-rows` pass: a row program as one GPU kernel, one block per row, phases in order.

A *row program* is a function whose statements all start with the same row indices (``n`` in
softmax: every statement's first lhs index ranges over ``[0, N)``) and whose rows are
independent (isl: the row member carries no dependence). Its tree is rebuilt as::

    kernel grid=G,1,1 block=B,1,1
      filter (pins _by, _bz, _ty, _tz to 0)
        mark "rows threads=B local=mx,s"      the row loop: a block barrier after each phase
          filter n mod G = _bx                rows strided over the blocks (grid-stride loop)
            band [n]                          the row members, sequential in every block
              sequence                        one phase per statement, in program order
                filter { S0_init; S0 }        a reduction phase
                  sequence
                    filter { S0_init }  ->  filter _tx = 0  ->  band [inner lhs dims]
                    filter { S0 }       ->  band [inner lhs dims]
                                              mark "reduction S0 threads=B"
                                                filter d mod B = _tx  ->  band [reduction dims]
                filter { S2 }                 a pointwise phase
                  filter d mod B = _tx  ->  band [inner dims]   (no inner dims: _tx = 0)

The innermost dimension of each phase is split over ``threadIdx.x`` (consecutive threads,
consecutive elements). Reductions are combined per block by the ``reduction`` mark's lowering
(`codegen.gpu_reduce`); the NVPTX lowering of the ``rows`` mark (`codegen.gpu_rows`) puts a
barrier between the phases and at the end of each row, and keeps the ``local`` tensors —
temporaries of rank r accessed only at the row's own element, such as softmax's ``mx(n)`` and
``s(n)`` — in shared memory instead of global memory.

A full reduction (one statement reducing into a scalar) goes to `map_full_reduction`: every
block of the grid folds its share into the scalar atomically; a column reduction (reduced over
an outer dimension, ``S(d) +=! X(n, d)``) to `map_columns`: a thread per column, coalesced.

Checks (a `PipelineError` names the failed one; `row_program_problem` gives the structural ones
without sizes): every statement's first r indices are lhs indices over the same ranges
(r = the smallest lhs rank, at least 1), and at least one statement has more; the row members
carry no dependence; within a phase of one row, instances of a statement depend on each other
only through its own reduction (so splitting the phase over threads races on nothing); a
reduction's right-hand side does not read its own lhs tensor. ``B`` is the largest power of two
<= ``threads`` for which isl proves that every ``_tx`` has instances below the ``rows`` mark and
below each ``reduction`` mark at every row (so every thread reaches every barrier); with
B = 1 the row runs on one thread. A reduction whose values the combine cannot shuffle (bool,
8/16-bit integers) runs on thread 0 of the block. ``G`` is ``grid`` capped by the rows (sizes
fixed) and by the blocks of B threads the SMs hold at once (`gpu_defaults.SM_COUNT` x
min(32, 2048 / B)). No statement instance (``i in N:N``): one kernel of one thread that runs
nothing. Requires a schedule (replaced); run it instead of tile/map-to-blocks/map-to-threads/
map-reduction.
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass

import islpy as isl

from .. import ir as tc
from ..dtypes import DType
from ..errors import PipelineError
from ..gpu_device import SM_COUNT
from ..poly.gpu_mapping import (
    BLOCK_PARAMS,
    THREAD_PARAMS,
    KernelMark,
    member_extent,
    member_filter,
    pin_unused,
    split_lanes,
    vector_lanes,
    with_params,
)
from ..poly.legality import member_is_parallel
from ..poly.scop import sets_of
from ..poly.state import CompileState
from .base import Pass, register
from .map_columns import build_columns, column_problem
from .map_full_reduction import build_full_reduction, full_reduction_problem, single_thread
from .map_reductions import _full_participation, reduction_mark_name

__all__ = ["MapRows", "parse_rows_mark", "row_program_problem", "rows_first", "rows_mark_name"]

_FILTER = isl.schedule_node_type.filter
# values the block combine shuffles (codegen.gpu_reduce); half types compute in float32
_SHUFFLED = (DType.FLOAT32, DType.FLOAT64, DType.INT32, DType.INT64, DType.UINT32, DType.UINT64)


UNROLL_STRIDES = 16  # stride loops of at most this many trips: unrolled by isl
# row members linearised over the blocks (`_row_filter`; isl took 45 s deriving fifteen)
LINEAR_ROW_MEMBERS = 4

def rows_mark_name(threads: int, local: tuple[str, ...]) -> str:
    return f"rows threads={threads} local={','.join(local)}"


def parse_rows_mark(name: str | None) -> tuple[int, tuple[str, ...]] | None:
    """(threads, local tensors) of a ``rows threads=B local=a,b`` mark name, else None."""
    text = name or ""
    if not text.startswith("rows threads="):
        return None
    head, _, local = text.partition(" local=")
    return int(head.removeprefix("rows threads=")), tuple(t for t in local.split(",") if t)


def _reads(e: tc.Expr) -> list[tc.Read]:
    return [x for x in tc.walk(e) if isinstance(x, tc.Read)]


def row_rank(fn: tc.Function) -> int:
    return min((len(s.lhs) for s in fn.statements), default=0)


def rows_first(fn: tc.Function) -> tc.Function:
    """``fn`` with each statement's loops reordered, the lhs indices all statements share
    (same name and range, in the first's lhs order) first: a batch norm's ``d(n, c, h, w) =
    X(n, c, h, w) - mean(c)`` iterates ``(c, n, h, w)``, rows ``c``. Only the loop order
    changes (an lhs index carries no dependence); ``fn`` itself when nothing moves."""
    if not fn.statements or any(not st.lhs for st in fn.statements):
        return fn
    first = fn.statements[0]
    common = [x for x in first.lhs if all(
        x in st.lhs and (st.range_of(x).lo, st.range_of(x).hi)
        == (first.range_of(x).lo, first.range_of(x).hi) for st in fn.statements)]
    if not common:
        return fn
    statements = []
    for st in fn.statements:
        ranges = tuple(st.range_of(x) for x in common) + tuple(
            rng for rng in st.ranges if rng.name not in common)
        statements.append(st if ranges == st.ranges else dataclasses.replace(st, ranges=ranges))
    if all(a is b for a, b in zip(statements, fn.statements, strict=True)):
        return fn
    return dataclasses.replace(fn, statements=tuple(statements))


def row_program_problem(fn: tc.Function) -> str | None:
    """Why ``fn`` is not a row program (structurally, without sizes), or None if it is. The
    row indices are each statement's first ``r`` loop indices, lhs indices of it (in any lhs
    position: see `rows_first`) over the first statement's ranges."""
    r = row_rank(fn)
    if r < 1:
        return "some statement writes a scalar (no row index)"
    first = fn.statements[0]
    rows = [(x.lo, x.hi) for x in first.ranges[:r]]
    for st in fn.statements:
        if not set(st.index_names[:r]) <= set(st.lhs):
            return f"statement {st.tensor}: its first {r} indices are not lhs indices"
        if [(x.lo, x.hi) for x in st.ranges[:r]] != rows:
            return f"statement {st.tensor}: its row indices range differently from the first statement's"
        if st.reduction is not None and st.reduction_indices \
                and any(rd.tensor == st.tensor for rd in _reads(st.rhs)):
            return f"reduction {st.tensor} reads its own lhs tensor"
    if all(len(st.index_names) == r for st in fn.statements):
        return "no statement has an index beyond the row indices"
    return None


def local_tensors(fn: tc.Function) -> tuple[str, ...]:
    """Temporaries of rank r that every statement accesses only at its own row's element."""
    r = row_rank(fn)
    found = []
    for t in fn.temporaries:
        if t.rank != r:
            continue
        ok, used = True, False
        for st in fn.statements:
            row = tuple(st.index_names[:r])
            if st.tensor == t.name:
                used = True
                ok &= tuple(st.lhs) == row
            for rd in _reads(st.rhs):
                if any(x.tensor == t.name for i in rd.indices for x in _reads(i)):
                    ok = False
                if rd.tensor == t.name:
                    used = True
                    ok &= all(isinstance(i, tc.Index) for i in rd.indices) and \
                        tuple(i.name for i in rd.indices) == row  # type: ignore[union-attr]
        first = next((st for st in fn.statements
                      if st.tensor == t.name or any(rd.tensor == t.name for rd in _reads(st.rhs))), None)
        # a shared slot starts undefined, a global temporary zeroed: the row must write it first
        fresh = first is not None and first.tensor == t.name and (
            first.init or (first.reduction is None and all(rd.tensor != t.name for rd in _reads(first.rhs))))
        if ok and used and fresh:
            found.append(t.name)
    return tuple(found)


@register
@dataclass(frozen=True)
class MapRows(Pass):
    """Map a row program to one kernel, a block per row (see the module docstring):
    ``threads`` is the most threads per block (a power of two is taken, at most 1024),
    ``grid`` the most blocks (rows beyond it are looped over)."""

    name = "map-rows"
    requires_schedule = True
    threads: int = 512
    grid: int = 528
    vector_bytes: int = 0

    def __post_init__(self):
        if self.threads < 1 or self.grid < 1:
            raise ValueError("map-rows: threads and grid must be >= 1")
        if self.vector_bytes not in (0, 1, 2, 4, 8, 16):
            raise ValueError("map-rows: vector-bytes must be 0 (off) or a power of two <= 16")

    def run(self, state: CompileState) -> CompileState:
        fn = rows_first(state.fn)
        if fn is not state.fn and row_program_problem(fn) is None \
                and row_program_problem(state.fn) is not None:
            # the shared lhs indices first: a new scop, its program order as the schedule
            state = CompileState.initial(fn, state.sizes, state.ctx)
            state = dataclasses.replace(state, schedule=state.scop.schedule)
        domain = with_params(isl.Schedule.from_domain(state.scop.domain),
                             BLOCK_PARAMS + THREAD_PARAMS).get_domain()
        if domain.is_empty():  # no statement instance at these sizes (or at any)
            assert state.schedule is not None
            return dataclasses.replace(state, schedule=single_thread(
                with_params(state.schedule, BLOCK_PARAMS + THREAD_PARAMS)))
        if full_reduction_problem(state.fn) is None:
            schedule = build_full_reduction(state, domain, self.threads, self.grid,
                                            self.vector_bytes)
            if schedule is None:  # too short to split, or sizes not fixed
                assert state.schedule is not None
                schedule = single_thread(with_params(state.schedule, BLOCK_PARAMS + THREAD_PARAMS))
            return dataclasses.replace(state, schedule=schedule)
        if column_problem(state.fn) is None:
            schedule = build_columns(state, domain, self.threads, self.grid)
            if schedule is None:  # the reduction runs no instance at these sizes
                assert state.schedule is not None
                schedule = single_thread(with_params(state.schedule, BLOCK_PARAMS + THREAD_PARAMS))
            return dataclasses.replace(state, schedule=schedule)
        problem = row_program_problem(state.fn)
        if problem is not None:
            raise PipelineError(f"map-rows: {state.fn.name} is not a row program: {problem}")
        r = row_rank(state.fn)
        extents = row_extents(state.fn, state.sizes)
        rows = None
        if extents is not None:  # every row on its own block up to the grid cap
            rows = extents[-1] if r == 1 else math.prod(extents[-LINEAR_ROW_MEMBERS:])
        b = 1
        while b * 2 <= min(self.threads, 1024):
            b *= 2
        local = local_tensors(state.fn)
        while True:
            # no more blocks than the SMs hold at once (more only add tail), nor than rows
            grid = min(self.grid, SM_COUNT * min(32, 2048 // b), rows or self.grid)
            schedule = _build(state, domain, r, b, max(1, grid), local, self.vector_bytes)
            if schedule is not None or b == 1:
                break
            b //= 2
        if schedule is None:
            raise PipelineError(f"map-rows: the rows of {state.fn.name} are not independent, or a "
                                "phase depends on itself other than through its reduction")
        return dataclasses.replace(state, schedule=schedule)


# ---------------------------------------------------------------- building the tree


def _named(domain: isl.UnionSet, names: set[str]) -> isl.UnionSet:
    out = isl.UnionSet.empty(domain.get_space())
    for s in sets_of(domain):
        if s.get_tuple_name() in names:
            out = out.union(isl.UnionSet.from_set(s))
    return out


def _band(domain: isl.UnionSet, dims_of: dict[str, list[int]]) -> isl.MultiUnionPwAff | None:
    """The band mapping each set of ``domain`` to its dims ``dims_of[name]`` (same count)."""
    sets = sets_of(domain)
    n = {len(v) for v in dims_of.values()}
    assert len(n) == 1, dims_of
    count = n.pop()
    if count == 0 or not sets:
        return None
    space = domain.get_space()
    params = [space.get_dim_name(isl.dim_type.param, i) for i in range(space.dim(isl.dim_type.param))]
    members = []
    for m in range(count):
        parts = []
        for s in sets:
            name = s.get_tuple_name()
            dims = [s.get_dim_name(isl.dim_type.set, i) or f"i{i}" for i in range(s.dim(isl.dim_type.set))]
            parts.append(f"{name}[{', '.join(dims)}] -> [({dims[dims_of[name][m]]})]")
        members.append("{ " + "; ".join(parts) + " }")
    text = f"[{', '.join(params)}] -> [{', '.join(members)}]"
    return isl.MultiUnionPwAff.read_from_str(domain.get_ctx(), text)


def _insert(node: isl.ScheduleNode, mupa: isl.MultiUnionPwAff | None,
            coincident: bool) -> isl.ScheduleNode:
    """Insert band ``mupa`` at ``node`` (returns the band, or ``node`` when there is none)."""
    if mupa is None:
        return node
    node = node.insert_partial_schedule(mupa).band_set_permutable(1)
    for m in range(mupa.dim(isl.dim_type.out)):
        node = node.band_member_set_coincident(m, int(coincident))
    return node


def _phase(node: isl.ScheduleNode, state: CompileState, k: int, r: int,
           b: int, vector_bytes: int = 0) -> isl.ScheduleNode | None:
    """Fill the leaf ``node`` below phase k's filter; returns the phase filter, None to refuse."""
    st = state.fn.statements[k]
    n_lhs, n_all = len(st.lhs), len(st.index_names)
    domain = node.get_domain()
    if domain.is_empty():  # the statement runs no instance at these sizes
        return _up_to_filter(node)
    init = f"S{k}_init"
    has_init = any(s.get_tuple_name() == init for s in sets_of(domain))
    update = _named(domain, {f"S{k}"})
    reduces = st.reduction is not None and n_all > n_lhs
    shuffles = state.fn.tensor(st.tensor).dtype.compute in _SHUFFLED
    mapped = reduces and shuffles and b > 1
    if has_init:
        filters = isl.UnionSetList.alloc(node.get_ctx(), 2).add(_named(domain, {init})).add(update)
        node = node.insert_sequence(filters)
        leaf = node.child(0).child(0)
        leaf = _insert(leaf, _band(leaf.get_domain(), {init: list(range(r, n_lhs))}), True)
        leaf = pin_unused(leaf, THREAD_PARAMS, [1, 1, 1])
        node = _up_to_filter(leaf).child(0).child(1).child(0)
    name = f"S{k}"
    if update.is_empty():  # only the initialisation runs
        return _up_to_filter(node)
    if not mapped:  # pointwise: the innermost dim on threads
        band = _insert(node, _band(update, {name: list(range(r, n_all))}), not reduces)
        if band is node or reduces:  # no inner dims, or a reduction without a combine: thread 0
            node = pin_unused(band, THREAD_PARAMS, [1, 1, 1])
        elif b > 1:
            if not _no_self_deps(band, state, name):
                return None
            node = _split_over_threads(band, b, vector_lanes(state.fn, [f"S{k}"], vector_bytes))
        else:
            node = band
        return _up_to_filter(node)
    node = _insert(node, _band(update, {name: list(range(r, n_lhs))}), False)
    if node.get_type() == isl.schedule_node_type.band:
        node = node.child(0)
    rband = _insert(node, _band(update, {name: list(range(n_lhs, n_all))}), False)
    if not _no_self_deps(rband, state, name, allow_reduction=True):
        return None
    node = _split_over_threads(rband, b, vector_lanes(state.fn, [f"S{k}"], vector_bytes))
    node = node.insert_mark(isl.Id(reduction_mark_name(k, b), context=node.get_ctx()))
    if not _full_participation(node.child(0).child(0), b):
        return None
    return _up_to_filter(node)


def _split_over_threads(band: isl.ScheduleNode, b: int, vector: int = 1) -> isl.ScheduleNode:
    """Split ``band``'s last member ``v`` over the block: a filter ``v mod b = _tx`` above the
    band, whose member becomes ``floor(v / b)``. The loop then counts whole strides from 0 (a
    constant trip count when ``b`` divides the extent), so LLVM unrolls it fully and keeps the
    row's values in registers from one phase to the next instead of loading them again.

    With ``vector`` > 1 (when ``vector`` divides the extent and every thread gets a group of
    ``vector``) each thread takes ``vector`` adjacent elements instead of one: the filter is
    ``floor(v / vector) mod b = _tx`` and the member becomes two, ``floor(v / (vector * b))``
    and ``v mod vector`` (`split_lanes`), so a thread's accesses along the row are adjacent and
    LLVM's load/store vectoriser makes 128-bit accesses of them where the alignment is known
    (`codegen.nvptx`). A partial last stride (softmax over 1000 columns, 32 threads of 4
    lanes) is unrolled under its guard: the whole strides stay in registers across phases
    (a scalar loop before, loaded in every phase)."""
    band = _collapse_inner(band, b)
    m = band.band_n_member() - 1
    span = member_extent(band, m)
    if vector > 1 and (span is None or span % vector or span // vector < b):
        vector = 1
    filt = member_filter(band, m, vector, b, "_tx")
    node = split_lanes(band, vector, b)
    # a short stride loop is unrolled by isl itself: every phase then reads the row's elements
    # in straight-line code, and LLVM reuses the first phase's loads in the later ones (left
    # to LLVM, softmax's last phase was unrolled only after value numbering and loaded again)
    if span is not None and span % vector == 0 and -(-span // (vector * b)) <= UNROLL_STRIDES:
        node = node.band_member_set_ast_loop_type(m, isl.ast_loop_type.unroll)
    return node.insert_filter(filt)


def _collapse_inner(band: isl.ScheduleNode, b: int) -> isl.ScheduleNode:
    """``band`` with its last two members ``u, v`` made one, ``u * span(v) + v`` (the same
    order), while the last member has fewer values than the block's ``b`` threads: a batch
    norm's phase over ``(n, h, w)`` with ``w`` = 56 kept 32 of 512 threads; over ``h * 56 + w``
    every thread has work. Only with known extents (fixed sizes)."""
    ctx = band.get_ctx()
    while band.band_n_member() >= 2:
        m = band.band_n_member() - 1
        span, prev = member_extent(band, m), member_extent(band, m - 1)
        if span is None or prev is None or span >= b:
            return band
        mupa = band.band_get_partial_schedule()
        joined = mupa.get_at(m - 1).scale_val(isl.Val.int_from_si(ctx, span)).add(mupa.get_at(m))
        members = isl.MultiUnionPwAff.from_union_pw_aff(joined)
        if m >= 2:
            lead = mupa.drop_dims(isl.dim_type.set, m - 1, 2) if hasattr(mupa, "drop_dims") else None
            if lead is None:
                return band
            members = lead.flat_range_product(members)
        coincident = [band.band_member_get_coincident(i) for i in range(m)]
        coincident[m - 1] = coincident[m - 1] and band.band_member_get_coincident(m)
        permutable = band.band_get_permutable()
        band = band.delete().insert_partial_schedule(members).band_set_permutable(permutable)
        for i, c in enumerate(coincident):
            band = band.band_member_set_coincident(i, c)
    return band


def _up_to_filter(node: isl.ScheduleNode) -> isl.ScheduleNode:
    """The phase filter above ``node`` (the child of the row sequence)."""
    while not (node.get_type() == _FILTER and node.parent().get_type() == isl.schedule_node_type.sequence
               and node.parent().parent().get_type() == isl.schedule_node_type.band):
        node = node.parent()
    return node


def _no_self_deps(band: isl.ScheduleNode, state: CompileState, name: str,
                  allow_reduction: bool = False) -> bool:
    """No two instances of ``name`` under one outer iteration of ``band`` depend on each other
    (other than through the statement's reduction, with ``allow_reduction``)."""
    deps = state.deps.validity
    if allow_reduction:
        deps = deps.subtract(state.deps.reduction)
    domain = band.get_domain()
    own = _named(domain, {name})
    prefix = band.get_prefix_schedule_union_map().intersect_domain(own)
    same = prefix.apply_range(prefix.reverse())
    active = deps.intersect_domain(own).intersect_range(own).intersect(same)
    return active.is_empty()


def row_extents(fn: tc.Function, sizes) -> list[int] | None:
    """The extents of the row indices at ``sizes`` (None when a size is not fixed)."""
    if sizes is None:
        return None
    try:
        return [rng.hi.evaluate(sizes) - rng.lo.evaluate(sizes)
                for rng in fn.statements[0].ranges[:row_rank(fn)]]
    except (KeyError, ValueError):
        return None


def _row_filter(band: isl.ScheduleNode, state: CompileState, r: int, grid: int) -> isl.UnionSet:
    """Rows over the blocks: the row number (the row members linearised, row-major, by their
    extents in the tree, when the sizes are fixed and every row gets its own block)
    ``== _bx``. With one row member, or sizes not fixed,
    the last row member alone (the others walked by every block)."""
    extents = [member_extent(band, m) for m in range(r)]
    # the last LINEAR_ROW_MEMBERS members share the blocks, outer ones are walked by each
    first = max(0, r - LINEAR_ROW_MEMBERS)
    if r == 1 or state.sizes is None or any(e is None for e in extents) \
            or math.prod(extents[first:]) > grid:  # type: ignore[arg-type]
        # (more rows than blocks: a block looping over linearised rows made isl merge the
        # phases of a row whose statements have no inner dimensions)
        return member_filter(band, r - 1, 1, grid, "_bx")
    ctx = band.get_ctx()
    mupa = band.band_get_partial_schedule()
    upa, stride = None, 1
    for m in reversed(range(first, r)):
        term = mupa.get_at(m).scale_val(isl.Val.int_from_si(ctx, stride))
        upa = term if upa is None else upa.add(term)
        stride *= max(1, extents[m])
    upa = upa.mod_val(isl.Val.int_from_si(ctx, grid))
    domain = band.get_domain()
    space = domain.get_space()
    pos = space.find_dim_by_name(isl.dim_type.param, "_bx")
    pid = isl.UnionPwAff.param_on_domain_id(domain, space.get_dim_id(isl.dim_type.param, pos))
    return upa.sub(pid).zero_union_set().intersect(domain)


def _build(state: CompileState, domain: isl.UnionSet, r: int, b: int, grid: int,
           local: tuple[str, ...], vector_bytes: int = 0) -> isl.Schedule | None:
    fn = state.fn
    ctx = domain.get_ctx()
    row_dims = {s.get_tuple_name(): list(range(r)) for s in sets_of(domain)}
    schedule = isl.Schedule.from_domain(domain)
    root = schedule.get_root().child(0)
    band = _insert(root, _band(domain, row_dims), True)
    for m in range(r):
        if not member_is_parallel(band, m, state.deps.validity):
            return None
    filters = isl.UnionSetList.alloc(ctx, len(fn.statements))
    for k in range(len(fn.statements)):
        filters = filters.add(_named(domain, {f"S{k}", f"S{k}_init"}))
    seq = band.child(0).insert_sequence(filters)
    for k in range(len(fn.statements)):
        phase = _phase(seq.child(k).child(0), state, k, r, b, vector_bytes)
        if phase is None:
            return None
        seq = phase.parent()
    if b > 1 and not _full_participation(seq, b):
        return None
    band = seq.parent()
    # above the band, not the sequence: when the row loop is degenerate (one row per block)
    # isl would otherwise copy the mark into each phase, under the phases' `_tx` guards
    node = band.insert_filter(_row_filter(band, state, r, grid))
    node = node.insert_mark(isl.Id(rows_mark_name(b, local), context=ctx))
    node = pin_unused(node, BLOCK_PARAMS, [grid, 1, 1])
    node = pin_unused(node, THREAD_PARAMS, [b, 1, 1])
    mark = KernelMark((grid, 1, 1), (b, 1, 1))
    node = node.insert_mark(isl.Id(mark.name, context=ctx))
    return node.get_schedule()

