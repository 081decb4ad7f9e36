"""What the profiler reads off a compiled kernel's schedule: its launches and their accesses.

A compiled `tcmlir.api.Kernel` keeps the texts of its stages, not the isl state, so the
profiler lowers the function again with the same options and sizes (`compiler.lower`: isl
scheduling and the passes, no LLVM) and reads, per launched kernel (a ``kernel`` mark on the
GPU, a top-level group of the loop AST on the host):

* the isl statements it runs and its launch configuration;
* the tensors promoted to shared memory or registers in it (`poly.promotion.Buffer.kernel`);
* the threads that combine each reduction (``reduction S<k> threads=B`` / ``rows threads=B``
  marks; 1 where a reduction runs sequentially in each thread);
* on the GPU, the **stride along threadIdx.x** of every global access: the band member the
  ``map-to-threads`` filter ``v mod B = _tx`` pins is found in the tree (`member_filter`
  reproduces the filter); neighbouring threads run the instances whose schedule differs by
  one in that member and agrees everywhere else (the prefix schedule, the other members, the
  subtree below); the access relation maps such pairs of instances to pairs of elements, whose
  differences (``isl.Map.deltas``) linearised row-major are the stride in elements;
* which thread runs each instance (`thread_map`: the instances reaching the kernel's leaves,
  whose domains carry the ``_bx .. _tz`` filters, with those parameters as output dimensions),
  and from it, with isl emptiness tests only (no counting, so any size is cheap):
  the tensors whose re-reads are all by the thread that read the element first
  (``same_thread_reads``: a row kernel's phases, which reuse the loaded row, registers where
  unrolled) and the operands a thread re-reads for several outputs of one reduction
  (``thread_reuse``: conv's ``I`` for every ``f``, what register tiling keeps in registers).
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any

import islpy as isl

from ..poly.gpu_mapping import (
    BLOCK_PARAMS,
    THREAD_PARAMS,
    first_band_below,
    kernel_marks,
    member_extent,
    member_filter,
)
from ..poly.scop import maps_of, sets_of
from ..poly.tree import mark_name, node_at

__all__ = ["AccessStride", "KernelStructure", "kernel_structures"]

_FILTER = isl.schedule_node_type.filter
_REDUCTION_MARK = re.compile(r"^(?:reduction S\d+|rows) threads=(\d+)")


@dataclass(frozen=True)
class AccessStride:
    """How far apart (in elements) neighbouring threads along x access ``tensor``."""

    statement: str
    tensor: str
    kind: str           # "read" or "write"
    stride: int | None  # None: not one constant (a gather, or several strides)


@dataclass(frozen=True)
class KernelStructure:
    """One launched kernel as the schedule describes it."""

    name: str
    statements: tuple[str, ...]
    grid: tuple[int, int, int] | None = None
    block: tuple[int, int, int] | None = None
    promoted: frozenset[str] = frozenset()
    reduction_threads: int = 1
    strides: tuple[AccessStride, ...] = ()
    thread_mapped: bool = False  # whether a band member is on threadIdx.x
    rows: bool = False           # a ``rows`` mark (map-rows / map-mixed): the row stays on chip
    same_thread_reads: frozenset[str] = frozenset()  # every re-read by the thread that read it
    thread_reuse: tuple[tuple[str, str], ...] = ()    # (reduction, operand) re-read per output
    register_tiled: bool = False  # the options keep accumulators / operands in registers

    @property
    def threads(self) -> int | None:
        if self.grid is None or self.block is None:
            return None
        g, b = self.grid, self.block
        return g[0] * g[1] * g[2] * b[0] * b[1] * b[2]


def kernel_structures(kernel: Any) -> tuple[tuple[KernelStructure, ...], Any]:
    """The launched kernels of a compiled ``kernel`` (cuda or cpu) and the lowered state."""
    from ..compiler import lower

    fn = kernel.function.ir
    state = lower(fn, kernel.sizes, kernel.options, kernel.target, verify=False)
    if kernel.target == "cuda":
        return _cuda_kernels(kernel, state), state
    return _host_groups(kernel, state), state


def _names(domain: isl.UnionSet) -> tuple[str, ...]:
    return tuple(sorted(s.get_tuple_name() for s in sets_of(domain)))


def _cuda_kernels(kernel: Any, state: Any) -> tuple[KernelStructure, ...]:
    sched = state.proof_schedule
    marks = kernel_marks(sched)
    launches = kernel.runner.image.kernels
    assert len(marks) == len(launches), (
        f"{len(marks)} kernel marks but {len(launches)} launches\n{sched}")
    buffers = state.promotion.buffers if state.promotion is not None else ()
    out = []
    for k, ((path, km), launch) in enumerate(zip(marks, launches, strict=True)):
        node = node_at(sched, path)
        promoted = frozenset(b.tensor for b in buffers if b.kernel == k)
        on_chip = frozenset(kernel.runner.image.on_chip)
        shared = {b.tensor: b for b in buffers if b.kernel == k and b.space == "shared"}
        strides, mapped = _strides(state, node, km.block, promoted | on_chip, dict(kernel.sizes),
                                   shared)
        threads = thread_map(node)
        same, reuse = _thread_reads(state, threads, on_chip)
        opts = kernel.options
        tiled = bool(opts is not None and (opts.use_private_memory or opts.register_tile))
        out.append(KernelStructure(
            launch.name, _names(node.get_domain()), tuple(launch.grid), tuple(launch.block),
            promoted, _reduction_threads(node), strides, mapped, _has_rows_mark(node),
            same, reuse, tiled))
    return tuple(out)


def _host_groups(kernel: Any, state: Any) -> tuple[KernelStructure, ...]:
    from ..codegen.ast_groups import top_level_groups
    from ..poly.loops import build_ast

    entries = kernel.runner.entries if kernel.runner is not None else ()
    groups = top_level_groups(build_ast(state))
    out = []
    for g, node in enumerate(groups):
        names: set[str] = set()

        def visit(n: isl.AstNode, names: set[str] = names) -> bool:
            if n.get_type() == isl.ast_node_type.user:
                names.add(n.user_get_expr().get_op_arg(0).get_id().get_name())
            return True

        node.foreach_descendant_top_down(visit)
        label = entries[g].name if g < len(entries) else f"{kernel.function.entry}_{g}"
        out.append(KernelStructure(label, tuple(sorted(names))))
    return tuple(out)


def _reduction_threads(node: isl.ScheduleNode) -> int:
    best = 1

    def visit(n: isl.ScheduleNode) -> None:
        nonlocal best
        m = _REDUCTION_MARK.match(mark_name(n) or "")
        if m:
            best = max(best, int(m.group(1)))
        for i in range(n.n_children()):
            visit(n.child(i))

    visit(node)
    return best


def _has_rows_mark(node: isl.ScheduleNode) -> bool:
    if (mark_name(node) or "").startswith("rows threads="):
        return True
    return any(_has_rows_mark(node.child(i)) for i in range(node.n_children()))


def thread_map(kernel_node: isl.ScheduleNode) -> isl.UnionMap:
    """Instance -> ``thread[_bx, _by, _bz, _tx, _ty, _tz]`` for the statements (``S<k>``,
    ``S<k>_init``) below ``kernel_node``: their domains at the leaves, where every mapping
    filter above has pinned the parameters, with the parameters moved to the range."""
    ctx = kernel_node.get_ctx()
    names = (*BLOCK_PARAMS, *THREAD_PARAMS)
    params = isl.Set.read_from_str(ctx, f"[{', '.join(names)}] -> {{ : }}").get_space()
    out: isl.UnionMap | None = None

    def visit(n: isl.ScheduleNode) -> None:
        nonlocal out
        if n.get_type() == isl.schedule_node_type.leaf:
            for s in sets_of(n.get_domain()):
                if not s.get_tuple_name().startswith("S"):
                    continue
                m = isl.Map.from_domain(s.align_params(params))
                for name in names:
                    pos = m.find_dim_by_name(isl.dim_type.param, name)
                    m = m.move_dims(isl.dim_type.out, m.dim(isl.dim_type.out),
                                    isl.dim_type.param, pos, 1)
                m = isl.UnionMap.from_map(m.set_tuple_name(isl.dim_type.out, "thread"))
                out = m if out is None else out.union(m)
            return
        for i in range(n.n_children()):
            visit(n.child(i))

    visit(kernel_node)
    return out if out is not None else isl.UnionMap.empty(params)


def _thread_reads(state: Any, threads: isl.UnionMap, skip: frozenset[str]
                  ) -> tuple[frozenset[str], tuple[tuple[str, str], ...]]:
    """(tensors every re-read of which is by the thread that read the element, (reduction,
    operand) pairs whose operand element one thread reads for several of its outputs; from
    global or shared memory alike); ``skip``: the tensors that live on chip (no buffer)."""
    if threads.is_empty():
        return frozenset(), ()
    fn, scop = state.fn, state.scop
    dom = threads.domain()
    reads = scop.all_reads.align_params(dom.get_space()).intersect_domain(dom)
    writes = scop.writes.align_params(dom.get_space()).intersect_domain(dom)
    same_thread = threads.apply_range(threads.reverse())
    tensors = {m.get_tuple_name(isl.dim_type.out) for m in maps_of(reads)}
    same: set[str] = set()
    for t in sorted(tensors - skip):
        acc = _to_tensor(reads, t)
        same_elem = acc.apply_range(acc.reverse())
        if same_elem.subtract(same_thread).is_empty():
            same.add(t)
    reuse = []
    for name in sorted(s.get_tuple_name() for s in sets_of(dom)):
        if name.endswith("_init"):
            continue
        stmt = fn.statements[int(name[1:])]
        if stmt.reduction is None or not stmt.reduction_indices:
            continue
        mine = isl.UnionSet.from_set(_set_named(dom, name))
        lhs = writes.intersect_domain(mine)
        same_out = lhs.apply_range(lhs.reverse())
        for t in sorted({e.tensor for e in _ir_reads(stmt)} - skip - {stmt.tensor}):
            if fn.tensor(t).rank == 0:
                continue
            acc = _to_tensor(reads.intersect_domain(mine), t)
            again = acc.apply_range(acc.reverse()).intersect(same_thread).subtract(same_out)
            if not again.is_empty():
                reuse.append((name, t))
    return frozenset(same), tuple(reuse)


def _ir_reads(stmt: Any) -> list[Any]:
    from .. import ir

    return [e for e in ir.walk(stmt.rhs) if isinstance(e, ir.Read)]


def _to_tensor(umap: isl.UnionMap, tensor: str) -> isl.UnionMap:
    out = None
    for m in maps_of(umap):
        if m.get_tuple_name(isl.dim_type.out) == tensor:
            part = isl.UnionMap.from_map(m)
            out = part if out is None else out.union(part)
    return out if out is not None else isl.UnionMap.empty(umap.get_space())


def _set_named(us: isl.UnionSet, name: str) -> isl.Set:
    return next(s for s in sets_of(us) if s.get_tuple_name() == name)


def _tx_filters(node: isl.ScheduleNode) -> list[isl.ScheduleNode]:
    found = []

    def visit(n: isl.ScheduleNode) -> None:
        if n.get_type() == _FILTER:
            f = n.filter_get_filter()
            pos = f.get_space().find_dim_by_name(isl.dim_type.param, "_tx")
            if pos >= 0 and any(s.involves_dims(isl.dim_type.param, s.find_dim_by_name(
                    isl.dim_type.param, "_tx"), 1) for s in sets_of(f)):
                found.append(n)
                return
        for i in range(n.n_children()):
            visit(n.child(i))

    visit(node)
    return found


def _strides(state: Any, kernel_node: isl.ScheduleNode, block: tuple[int, int, int],
             promoted: frozenset[str], sizes: dict[str, int], shared: dict[str, Any] | None = None
             ) -> tuple[tuple[AccessStride, ...], bool]:
    """Global accesses' strides along threadIdx.x (kind "read" / "write") and, for tensors
    read from a shared-memory buffer (``shared``: tensor -> `poly.promotion.Buffer`), the
    stride of those reads in the buffer's elements (kind "shared")."""
    shared = shared or {}
    scop = state.scop
    fn = state.fn
    out: list[AccessStride] = []
    mapped = False
    for filt in _tx_filters(kernel_node):
        sub = filt.child(0).get_subtree_schedule_union_map()
        band = first_band_below(filt.child(0))
        member = None if band is None else _thread_member(band, block[0])
        lanes = 1 if band is None else _lanes(band)
        if member is not None:
            # map-to-threads: the member's value v runs over threads as v mod B, so a thread's
            # own loop over it advances floor(v / B): time keeps that, not v
            sub = _coarsen(sub, member, block[0])
        times = filt.get_prefix_schedule_union_map().flat_range_product(sub)
        thread_of = _thread_relation(filt.filter_get_filter())
        for t in maps_of(times):
            stmt = t.get_tuple_name(isl.dim_type.in_)
            tx = thread_of.get(stmt)
            if tx is None:
                continue
            t = _drop_mapping_params(t)
            same_time = t.apply_range(t.reverse())
            next_thread = tx.apply_range(_shift(tx, 0)).apply_range(tx.reverse())
            same_time = same_time.align_params(next_thread.get_space())
            neighbours = next_thread.align_params(same_time.get_space()).intersect(same_time)
            if neighbours.is_empty():
                continue
            mapped = True
            dom = isl.UnionSet.from_set(scop.domains[stmt])
            for kind, umap in (("read", scop.all_reads), ("write", scop.writes)):
                for acc in maps_of(umap.intersect_domain(dom)):
                    tensor = acc.get_tuple_name(isl.dim_type.out)
                    if fn.tensor(tensor).rank == 0:
                        continue
                    if tensor in promoted and not (kind == "read" and tensor in shared):
                        continue
                    acc = acc.align_params(neighbours.get_space())
                    nb = neighbours.align_params(acc.get_space())
                    pairs = nb.apply_domain(acc).apply_range(acc)
                    if tensor in promoted:
                        out.append(AccessStride(stmt, tensor, "shared",
                                                _buffer_stride(pairs, shared[tensor], sizes)))
                        continue
                    stride = _linear_stride(pairs, fn.tensor(tensor), sizes)
                    if lanes > 1 and stride is not None and abs(stride) == lanes:
                        stride //= lanes  # a vector of `lanes` elements per thread, adjacent
                    out.append(AccessStride(stmt, tensor, kind, stride))
    return tuple(_dedupe(out)), mapped


def _lanes(band: isl.ScheduleNode) -> int:
    """The lanes of a thread's vector access (`gpu_mapping.split_lanes`: a last member
    ``v mod L``, unrolled, below the thread filter), else 1. Neighbouring threads' accesses at
    the same lane are then ``L`` apart while each thread's ``L`` are adjacent: coalesced."""
    m = band.band_n_member() - 1
    if m < 1 or band.band_member_get_ast_loop_type(m) != isl.ast_loop_type.unroll:
        return 1
    extent = member_extent(band, m)
    return extent if extent in (2, 4, 8, 16) else 1


def _thread_member(band: isl.ScheduleNode, extent: int) -> int | None:
    """The band member the ``_tx`` filter above ``band`` pins (``v mod extent = _tx``)."""
    domain = band.get_domain()
    for m in range(band.band_n_member()):
        if member_filter(band, m, 1, extent, "_tx").is_equal(domain):
            return m
    return None


def _thread_relation(filt: isl.UnionSet) -> dict[str, isl.Map]:
    """Per statement, instance -> [threadIdx.x] as the filter pins it (other mapping
    parameters projected out)."""
    out = {}
    for s in sets_of(filt):
        pos = s.find_dim_by_name(isl.dim_type.param, "_tx")
        rel = isl.Map.from_domain(s).move_dims(isl.dim_type.out, 0, isl.dim_type.param, pos, 1)
        out[s.get_tuple_name()] = _drop_mapping_params(rel)
    return out


def _coarsen(sub: isl.UnionMap, member: int, extent: int) -> isl.UnionMap:
    out = None
    for m in maps_of(sub):
        n = m.dim(isl.dim_type.out)
        if member >= n:
            return sub
        src = [f"t{i}" for i in range(n)]
        dst = [f"floor(t{i} / {extent})" if i == member else f"t{i}" for i in range(n)]
        c = _anonymous_map(m, src, dst)
        part = isl.UnionMap.from_map(m.apply_range(c))
        out = part if out is None else out.union(part)
    return sub if out is None else out


def _anonymous_map(like: isl.Map, src: list[str], dst: list[str]) -> isl.Map:
    params = [like.get_dim_name(isl.dim_type.param, i) for i in range(like.dim(isl.dim_type.param))]
    text = f"[{', '.join(params)}] -> {{ [{', '.join(src)}] -> [{', '.join(dst)}] }}"
    out = isl.Map.read_from_str(like.get_ctx(), text)
    space = like.get_space().range()
    if space.has_tuple_id(isl.dim_type.set):
        tid = space.get_tuple_id(isl.dim_type.set)
        out = out.set_tuple_id(isl.dim_type.in_, tid).set_tuple_id(isl.dim_type.out, tid)
    return out


def _drop_mapping_params(m: isl.Map) -> isl.Map:
    for name in (*BLOCK_PARAMS, *THREAD_PARAMS):
        pos = m.find_dim_by_name(isl.dim_type.param, name)
        if pos >= 0:
            m = m.project_out(isl.dim_type.param, pos, 1)
    return m


def _shift(t: isl.Map, pos: int) -> isl.Map:
    """The range space of ``t`` to itself, dimension ``pos`` plus one."""
    n = t.dim(isl.dim_type.out)
    src = [f"t{i}" for i in range(n)]
    return _anonymous_map(t, src, [f"t{i} + 1" if i == pos else f"t{i}" for i in range(n)])


def _buffer_stride(pairs: isl.Map, buf: Any, sizes: dict[str, int]) -> int | None:
    """The stride in ``buf``'s elements (its storage order and padding) of the element pairs."""
    vec = _delta(pairs, sizes)
    if vec is None or any(d % s for d, s in zip(vec, buf.box.stride, strict=True)):
        return None
    return sum(d // s * w for d, s, w in zip(vec, buf.box.stride, buf.strides(), strict=True))


def _delta(pairs: isl.Map, sizes: dict[str, int]) -> list[int] | None:
    """The one difference vector of the element pairs at ``sizes``, else None."""
    if pairs.is_empty():
        return None
    deltas = pairs.deltas()
    for i in range(deltas.dim(isl.dim_type.param)):
        name = deltas.get_dim_name(isl.dim_type.param, i)
        if name in sizes:
            deltas = deltas.fix_val(isl.dim_type.param, i,
                                    isl.Val.int_from_si(deltas.get_ctx(), int(sizes[name])))
    deltas = deltas.project_out(isl.dim_type.param, 0, deltas.dim(isl.dim_type.param))
    if not deltas.is_singleton():
        return None
    point = deltas.sample_point()
    return [int(point.get_coordinate_val(isl.dim_type.set, d).to_python())
            for d in range(deltas.dim(isl.dim_type.set))]


def _linear_stride(pairs: isl.Map, tensor: Any, sizes: dict[str, int]) -> int | None:
    vec = _delta(pairs, sizes)
    if vec is None:
        return None
    try:
        shape = [s.evaluate(sizes) for s in tensor.shape]
    except KeyError:
        return None
    stride, row = 0, 1
    for d in reversed(range(len(shape))):
        stride += vec[d] * row
        row *= shape[d]
    return stride


def _dedupe(items: list[AccessStride]) -> list[AccessStride]:
    seen, out = set(), []
    for a in items:
        if a not in seen:
            seen.add(a)
            out.append(a)
    return out
