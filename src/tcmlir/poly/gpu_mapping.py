"""The GPU mapping in the schedule tree: kernels, block and thread indices, coverage proof.

How a mapping is recorded (so the tree prints in isl syntax and re-parses):

* the block and thread indices are isl parameters ``_bx _by _bz _tx _ty _tz`` of the whole
  tree (the schedule's parameters are aligned to include them);
* every top-level group of statements sits under a mark ``kernel grid=GX,GY,GZ block=BX,BY,BZ``
  — one launch each, in tree order;
* below it, filters pin each mapped band member to an index: ``floor(v / S) mod G = _bx`` for
  blocks (``v`` the member's schedule value, ``S`` 1) and ``floor(v / S) mod B = _tx`` for
  threads (``S`` = the grid extent when threads share the member with blocks, else 1). The isl
  AST then has strided loops ``for (c = B*_bx + _tx; c < N; c += B*G)``: every (block, thread)
  covers its share exactly once, and more iterations than threads or blocks are looped over.

Only band members that carry no dependence at all (reductions included) are mapped, innermost
mapped member to ``.x`` so that consecutive threads touch consecutive addresses.
`check_coverage` proves with isl that the mapping runs every statement instance exactly once.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any

import islpy as isl

from .legality import member_is_parallel
from .scop import sets_of
from .tree import mark_name

__all__ = [
    "BLOCK_PARAMS", "THREAD_PARAMS", "KernelMark", "build_context", "check_coverage",
    "kernel_groups", "kernel_marks", "parallel_members", "parse_kernel_mark", "split_lanes",
    "vector_lanes",
]

BLOCK_PARAMS = ("_bx", "_by", "_bz")
THREAD_PARAMS = ("_tx", "_ty", "_tz")
_KERNEL_RE = re.compile(r"^kernel grid=(\d+),(\d+),(\d+) block=(\d+),(\d+),(\d+)$")
_BAND = isl.schedule_node_type.band
_MARK = isl.schedule_node_type.mark
_FILTER = isl.schedule_node_type.filter
_SEQ = (isl.schedule_node_type.sequence, isl.schedule_node_type.set)


@dataclass(frozen=True)
class KernelMark:
    grid: tuple[int, int, int]
    block: tuple[int, int, int]

    @property
    def name(self) -> str:
        return (f"kernel grid={','.join(map(str, self.grid))} "
                f"block={','.join(map(str, self.block))}")


def parse_kernel_mark(name: str | None) -> KernelMark | None:
    m = _KERNEL_RE.match(name or "")
    if not m:
        return None
    v = tuple(int(x) for x in m.groups())
    return KernelMark(v[:3], v[3:])  # type: ignore[arg-type]


def kernel_groups(schedule: isl.Schedule) -> list[tuple[int, ...]]:
    """Paths of the subtrees that become kernels: each child of top-level sequences, else the root's child."""
    paths: list[tuple[int, ...]] = []

    def visit(node: isl.ScheduleNode, path: tuple[int, ...]) -> None:
        kind = node.get_type()
        if kind in _SEQ:  # children are filters: a kernel goes below each filter
            for i in range(node.n_children()):
                visit(node.child(i).child(0), (*path, i, 0))
        elif kind in (_FILTER, _MARK) and node.n_children() == 1 and node.child(0).get_type() in _SEQ:
            visit(node.child(0), (*path, 0))
        else:
            paths.append(path)

    visit(schedule.get_root().child(0), (0,))
    return paths


def kernel_marks(schedule: isl.Schedule) -> list[tuple[tuple[int, ...], KernelMark]]:
    """(path, KernelMark) of every kernel mark, in tree order."""
    found: list[tuple[tuple[int, ...], KernelMark]] = []

    def visit(node: isl.ScheduleNode, path: tuple[int, ...]) -> None:
        km = parse_kernel_mark(mark_name(node))
        if km is not None:
            found.append((path, km))
            return
        for i in range(node.n_children()):
            visit(node.child(i), (*path, i))

    visit(schedule.get_root(), ())
    return found


def first_band_below(node: isl.ScheduleNode) -> isl.ScheduleNode | None:
    """The first band reached through marks and filters only."""
    while node.get_type() != _BAND:
        if node.get_type() not in (_MARK, _FILTER) or node.n_children() != 1:
            return None
        node = node.child(0)
    return node


def parallel_members(band: isl.ScheduleNode, validity: isl.UnionMap, limit: int) -> list[int]:
    """Leading band members that carry no dependence (at most ``limit``), leaving out members
    that take one value (`member_extent` 1: a tile loop over one tile, the point loop of a
    tile of 1): a hardware dimension given to such a member has one index with work and the
    rest idle (a rank-4 permutation tiled ``(1, 1, 4, 64)`` ran on one thread per block with
    its two leading point members on ``threadIdx``). Parametric members always count."""
    members: list[int] = []
    for m in range(band.band_n_member()):
        if len(members) >= limit or not member_is_parallel(band, m, validity):
            break
        if member_extent(band, m) == 1:
            continue
        members.append(m)
    return members


def with_params(schedule: isl.Schedule, names: tuple[str, ...]) -> isl.Schedule:
    """``schedule`` with every parameter in ``names`` added to its parameter space."""
    space = schedule.get_domain().get_space().params()
    for name in names:
        if space.find_dim_by_name(isl.dim_type.param, name) < 0:
            pos = space.dim(isl.dim_type.param)
            space = space.add_dims(isl.dim_type.param, 1).set_dim_name(isl.dim_type.param, pos, name)
    return schedule.align_params(space)


def member_extent(band: isl.ScheduleNode, member: int) -> int | None:
    """``max + 1`` of ``band``'s member ``member`` over the band's domain, when that maximum is
    a known constant and the minimum is at least 0, else None.

    A specialised kernel whose member takes only 16 values needs only 16 blocks (or threads)
    along it: the rest would be launched only to exit.
    """
    upa = band.band_get_partial_schedule().get_at(member)
    rng = isl.UnionMap.from_union_pw_aff(upa).intersect_domain(band.get_domain()).range()
    if rng.is_empty():
        return None
    values = isl.Set.from_union_set(rng)
    lo, hi = values.dim_min_val(0), values.dim_max_val(0)
    if not (lo.is_int() and hi.is_int()) or lo.to_python() < 0:
        return None
    return int(hi.to_python()) + 1


def member_filter(band: isl.ScheduleNode, member: int, divisor: int, extent: int,
                  param: str) -> isl.UnionSet:
    """Instances of ``band``'s domain with ``floor(v / divisor) mod extent == param``."""
    domain = band.get_domain()
    ctx = band.get_ctx()
    upa = band.band_get_partial_schedule().get_at(member)
    if divisor > 1:
        upa = upa.scale_down_val(isl.Val.int_from_si(ctx, divisor)).floor()
    upa = upa.mod_val(isl.Val.int_from_si(ctx, extent))
    space = domain.get_space()
    pos = space.find_dim_by_name(isl.dim_type.param, param)
    assert pos >= 0, f"parameter {param} missing from the tree (with_params first)"
    pid = isl.UnionPwAff.param_on_domain_id(domain, space.get_dim_id(isl.dim_type.param, pos))
    return upa.sub(pid).zero_union_set().intersect(domain)


def vector_lanes(fn: Any, names: Any, vector_bytes: int) -> int:
    """Elements a thread accesses at once along its innermost member for statements ``names``
    (``S<k>`` / ``S<k>_init``) of ``fn``: ``vector_bytes`` over the widest element they touch
    (1 when vectors are off or one element already fills them)."""
    from .. import ir as tc

    if vector_bytes <= 1:
        return 1
    width = 1
    for name in names:
        m = re.match(r"^S(\d+)", name)
        if m is None:
            continue
        st = fn.statements[int(m.group(1))]
        tensors = {st.tensor} | {x.tensor for x in tc.walk(st.rhs) if isinstance(x, tc.Read)}
        width = max(width, *(fn.tensor(t).dtype.itemsize for t in tensors))
    return vector_bytes // width if vector_bytes >= 2 * width else 1


def split_lanes(band: isl.ScheduleNode, lanes: int, stride: int = 1) -> isl.ScheduleNode:
    """``band`` with its last member ``v`` replaced by ``floor(v / (lanes * stride))`` and a new
    last member ``v mod lanes`` (unrolled by the AST generator): strip-mining in place, legal
    whatever the dependences. A thread whose filter fixes ``floor(v / lanes) mod stride`` then
    walks ``lanes`` adjacent elements in straight-line code (vector accesses)."""
    ctx = band.get_ctx()
    m = band.band_n_member() - 1
    mupa = band.band_get_partial_schedule()
    coincident = [band.band_member_get_coincident(i) for i in range(m + 1)]
    v = mupa.get_at(m)
    mupa = mupa.set_at(m, v.scale_down_val(isl.Val.int_from_si(ctx, lanes * stride)).floor())
    if lanes > 1:
        lane = v.mod_val(isl.Val.int_from_si(ctx, lanes))
        mupa = mupa.flat_range_product(isl.MultiUnionPwAff.from_union_pw_aff(lane))
        coincident.append(coincident[m])
    node = band.delete().insert_partial_schedule(mupa).band_set_permutable(band.band_get_permutable())
    for i, c in enumerate(coincident):
        node = node.band_member_set_coincident(i, c)
    if lanes > 1:
        node = node.band_member_set_ast_loop_type(m + 1, isl.ast_loop_type.unroll)
    return node


def pin_unused(node: isl.ScheduleNode, params: tuple[str, ...], extents: list[int]) -> isl.ScheduleNode:
    """Insert a filter at ``node`` fixing each parameter whose extent is 1 to 0.

    A kernel launched with fewer blocks or threads than another one in the same tree must not
    read the unused indices as free: pinning them keeps the coverage proof per kernel exact.
    """
    domain = node.get_domain()
    space = domain.get_space()
    filt = domain
    for name, extent in zip(params, extents, strict=True):
        pos = space.find_dim_by_name(isl.dim_type.param, name)
        if extent == 1 and pos >= 0:
            pid = isl.UnionPwAff.param_on_domain_id(domain, space.get_dim_id(isl.dim_type.param, pos))
            filt = filt.intersect(pid.zero_union_set())
    return node if filt.is_equal(domain) else node.insert_filter(filt)


def build_context(schedule: isl.Schedule, context: isl.Set) -> isl.Set:
    """The AST build context: ``context`` plus the ranges of the mapping parameters used."""
    marks = [km for _, km in kernel_marks(schedule)]
    space = schedule.get_domain().get_space().params()
    ctx_set = context.align_params(space)
    for names, pick in ((BLOCK_PARAMS, lambda k: k.grid), (THREAD_PARAMS, lambda k: k.block)):
        for i, name in enumerate(names):
            pos = ctx_set.find_dim_by_name(isl.dim_type.param, name)
            if pos < 0:
                continue
            hi = max((pick(k)[i] for k in marks), default=1)
            ctx_set = ctx_set.lower_bound_val(isl.dim_type.param, pos, isl.Val.zero(ctx_set.get_ctx()))
            ctx_set = ctx_set.upper_bound_val(isl.dim_type.param, pos,
                                              isl.Val.int_from_si(ctx_set.get_ctx(), hi - 1))
    return ctx_set


def check_coverage(schedule: isl.Schedule, domain: isl.UnionSet, context: isl.Set) -> None:
    """Prove that every instance of ``domain`` runs exactly once under the mapping.

    For each statement, the executed instances as a relation instance → (mapping parameters)
    must be total on the statement's domain (within ``context``) and single-valued. The
    statements below an ``mma`` mark (`passes/map_mma.py`) belong to a block, whose threads
    share them: for those, the block indices alone. Raises an AssertionError carrying the
    tree otherwise.
    """
    executed = schedule.get_map().domain()
    bounds = build_context(schedule, context)
    mapping = [n for n in (*BLOCK_PARAMS, *THREAD_PARAMS)
               if executed.get_space().find_dim_by_name(isl.dim_type.param, n) >= 0]
    expected = {s.get_tuple_name(): s for s in sets_of(domain)}
    per_block = _mma_statements(schedule)
    seen: set[str] = set()
    for s in sets_of(executed):
        name = s.get_tuple_name()
        seen.add(name)
        rel = isl.Map.from_domain(s.intersect_params(bounds.align_params(s.get_space().params())))
        for param in mapping:
            pos = rel.find_dim_by_name(isl.dim_type.param, param)
            if name in per_block and param in THREAD_PARAMS:
                rel = rel.project_out(isl.dim_type.param, pos, 1)
                continue
            rel = rel.move_dims(isl.dim_type.out, rel.dim(isl.dim_type.out), isl.dim_type.param, pos, 1)
        want = expected[name]
        want = want.intersect_params(context.align_params(want.get_space().params()))
        got = rel.domain()
        want, got = want.align_params(got.get_space().params()), got.align_params(want.get_space().params())
        if not got.is_equal(want):
            raise AssertionError(f"mapping does not cover {name} exactly: runs {got}, "
                                 f"domain {want}\n{schedule}")
        if not rel.is_single_valued():
            raise AssertionError(f"mapping runs some instance of {name} more than once\n{schedule}")
    missing = set(expected) - seen
    if missing:
        raise AssertionError(f"mapping never runs {', '.join(sorted(missing))}\n{schedule}")


def _mma_statements(schedule: isl.Schedule) -> set[str]:
    """The statements below an ``mma`` mark (one tensor-core kernel: its block's threads
    run them together)."""
    names: set[str] = set()

    def visit(node: isl.ScheduleNode) -> None:
        if (mark_name(node) or "").startswith("mma "):
            names.update(s.get_tuple_name() for s in sets_of(node.get_domain()))
            return
        for i in range(node.n_children()):
            visit(node.child(i))

    visit(schedule.get_root())
    return names
