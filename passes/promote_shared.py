"""The `promote-shared` pass: reused tensor tiles of each GPU kernel copied to shared memory.

For each kernel (``kernel`` mark) whose first band is the tile band ``T`` (the block-mapped
members and the sequential tile loops, e.g. a matmul's ``kt``), the promotion node is ``N``, the
child of ``T``: below it the threads work on one tile. For every tensor the kernel only reads
(affine accesses, no gather in the kernel) and re-reads inside one tile (the access relation,
with the prefix schedule, is not injective: two instances of one tile read one element) or
reads across its rows where consecutive threads along x move (`strided_along_x`: a transpose;
the copy then reads rows, coalesced, into a buffer in the tensor's order padded by one element,
so the column reads hit distinct banks), the
footprint per tile (`poly.promotion.footprint`) gets a box; boxes are promoted in order of first
access while they fit in ``max-bytes``. The tree becomes::

    band T
      extension { [p] -> cpin_<buf>[p, a] : a in footprint(p);  [p] -> sync_<k>_0[p] }
        sequence
          filter cpin_<buf>:  filter (linear index mod threads = thread id): band [a]
          ...                 (one child per promoted tensor)
          filter sync_<k>_0                         barrier: the tile is in shared memory
          filter <original statements>:  N ...      reads of <tensor> go to the buffer
          filter sync_<k>_1                         barrier: the tile may be overwritten

(the last barrier comes from a second graft). Copies read exactly the footprint, never outside
the tensor, consecutive threads reading consecutive elements. The buffer's storage order puts
the dimension of largest extent innermost (a matmul's A tile is stored transposed; on a tie in
a register-tiled kernel, one indexed by an output index: a convolution's weights by channel),
padded by 16 bytes against bank conflicts while keeping rows 16-byte aligned. The copy mapping is proved
to run each element on exactly one thread, and every buffer access to stay in the box.

With ``copy-bytes`` (0: off), a buffer whose rows are contiguous in the tensor and in shared
memory is copied ``copy-bytes`` at a time where `poly.vector_copy` proves it aligned: the
footprint splits into vector leaders (``cpvin_<buf>`` / ``cpvnext_<buf>``, one per thread in
turn, as above with the linear index over the lanes) and the one-element rest of ragged tile
edges (``cpin_<buf>`` / ``cpnext_<buf>``). A tile stored transposed (a matmul's A) keeps
one-element copies, unless ``copy-transposed``: then a copy reads ``copy-bytes`` at once
into registers and stores them one by one (no cp.async, which cannot scatter: the loads
of a double-buffered tile are synchronous then).

Kernels with a ``reduction`` mark (`map-reduction`), without a band, or with gathers are left
alone. Legality of the original statements is proved on ``CompileState.base_schedule`` (the
tree before the first graft), since isl computes no schedule map for trees with extensions.
"""

from __future__ import annotations

import dataclasses
import re
from dataclasses import dataclass

import islpy as isl

from ..poly.gpu_mapping import THREAD_PARAMS, first_band_below, kernel_marks, parallel_members
from ..poly.kernel_select import selects
from ..poly.legality import member_is_parallel
from ..poly.promotion import (
    Buffer,
    Promotion,
    compute_box,
    copy_band,
    copy_extension,
    copy_parts,
    footprint,
    graft,
    prove_copy_mapping,
    prove_in_box,
    sync_extension,
    thread_copy_filter,
)
from ..poly.scheduler import band_members
from ..poly.scop import maps_of, sets_of
from ..poly.state import CompileState
from ..poly.tree import node_at, path_of
from ..poly.vector_copy import copy_lanes, leaders_aligned, split_footprint
from .base import Pass, register

__all__ = ["PromoteShared", "band_of_copy", "element_bytes", "has_reduction_mark", "promotable_kernels"]


def element_bytes(dtype) -> int:
    """Bytes per element in memory (bool is stored as one byte)."""
    return max(1, dtype.bits // 8)


def promotable_kernels(base: isl.Schedule):
    """(kernel index, kernel mark, tile band) of each kernel of ``base`` that promotion may
    transform: it has a first band and no ``reduction`` mark; last kernel first, so the
    paths of earlier kernels stay valid while later ones are grafted."""
    marks = kernel_marks(base)
    for k in reversed(range(len(marks))):
        path, km = marks[k]
        kernel = node_at(base, path)
        tile = first_band_below(kernel.child(0))
        if tile is not None and not has_reduction_mark(kernel):
            yield k, km, tile


def has_reduction_mark(node: isl.ScheduleNode) -> bool:
    hit: list[bool] = []

    def visit(n: isl.ScheduleNode) -> bool:
        if n.get_type() == isl.schedule_node_type.mark and n.mark_get_id().get_name().startswith("reduction"):
            hit.append(True)
        return True

    node.foreach_descendant_top_down(visit)
    return bool(hit)


def band_of_copy(copy_set: isl.Set, n_prefix: int, rank: int) -> isl.MultiUnionPwAff:
    """The band ``[a_0, ..., a_{rank-1}]`` over a copy statement's element dimensions."""
    _, ma_a = copy_parts(copy_set.get_space(), n_prefix, rank)
    ma_a = ma_a.reset_tuple_id(isl.dim_type.out)
    mpa = isl.MultiPwAff.from_multi_aff(ma_a).intersect_domain(copy_set)
    return isl.MultiUnionPwAff.from_multi_pw_aff(mpa)




@register
@dataclass(frozen=True)
class PromoteShared(Pass):
    """Copy each GPU kernel's reused read-only tiles to shared memory (see the module
    docstring); ``max_bytes`` bounds the shared memory per kernel (static shared memory,
    at most 48 KiB), ``unroll_copies`` asks isl to unroll the copy loops (those of at most
    `MAX_UNROLLED_COPIES` copies per thread: a block of few threads keeps its loops),
    ``copy_bytes`` (0:
    off) the bytes one vector copy moves, ``copy_transposed`` lets it read them at once into
    a buffer that stores them apart (transposed) and store them one by one."""

    name = "promote-shared"
    requires_schedule = True
    max_bytes: int = 48 * 1024
    unroll_copies: bool = False
    double_buffer: bool = False
    copy_bytes: int = 0
    copy_transposed: bool = False
    only: tuple[int, ...] = ()         # statements of the kernels it maps (poly.kernel_select)
    skip: tuple[int, ...] = ()         # statements of the kernels it leaves alone

    def __post_init__(self):
        if not 0 < self.max_bytes <= 48 * 1024:
            raise ValueError(f"promote-shared: max-bytes must be in (0, 49152], got {self.max_bytes}")
        if self.copy_bytes not in (0, 4, 8, 16):
            raise ValueError(f"promote-shared: copy-bytes must be 0 (off), 4, 8 or 16, got {self.copy_bytes}")

    def run(self, state: CompileState) -> CompileState:
        schedule = state.schedule
        assert schedule is not None
        base = state.proof_schedule
        scop, fn = state.scop, state.fn
        promotion = state.promotion or Promotion()
        made: list[Buffer] = []
        for k, km, tile in promotable_kernels(base):
            if tile.n_children() != 1 or not selects(tile, self.only, self.skip):
                continue
            node = tile.child(0)
            dom = node.get_domain()
            if not scop.may_reads.intersect_domain(dom).is_empty():
                continue
            prefix = node.get_prefix_schedule_union_map()
            n_prefix = tile.band_n_member() + _outer_members(tile)
            # two stages when the tile band ends with a sequential loop (a matmul's kt) and
            # the elements are 4 or 8 bytes (what cp.async copies one by one)
            sequential = not member_is_parallel(tile, tile.band_n_member() - 1, state.deps.validity)
            stages = 2 if self.double_buffer and sequential else 1
            reads = scop.reads.intersect_domain(dom)
            strided = strided_along_x(node, reads, km.block, state.deps.validity)
            written = {m.get_tuple_name(isl.dim_type.out) for m in maps_of(scop.writes.intersect_domain(dom))}
            tagged = prefix.range_product(reads)
            budget = self.max_bytes
            bufs: list[Buffer] = []
            tiled = _register_tiled(node)
            for t in fn.tensors:
                if t.name in written:
                    continue
                acc = [m for m in maps_of(tagged) if m.get_tuple_name(isl.dim_type.out) is None
                       and _range_tensor(m) == t.name]
                if not acc:
                    continue
                # promoted when re-read inside a tile, or when the threads along x read it
                # across its rows (a transpose): the copy then reads rows, coalesced
                transposed = t.name in strided
                if all(m.is_injective() for m in acc) and not transposed:
                    continue
                fp = footprint(prefix, reads, t.name)
                if fp is None:
                    continue
                box = compute_box(fp)
                if box is None or len(box.extent) == 0:
                    continue
                rank = len(box.extent)
                # ties: in a register-tiled kernel, a dimension indexed by an output index
                # goes inner (a convolution's weights W1(g, f, c, kh, kw) with 16 f and 16 c:
                # f innermost, so a thread's registers along f read adjacent words)
                outs = _output_dims(fn, dom, t.name) if tiled else set()
                order = tuple(sorted(range(rank), key=lambda d: (box.extent[d], d in outs, d)))
                if rank == 1:
                    order = (0,)
                esize = element_bytes(t.dtype)
                t_stages = stages if esize in (4, 8) else 1
                if transposed:  # read down columns: one element of padding, no bank conflict
                    order = tuple(range(rank))
                    inner = box.extent[-1] + (1 if rank > 1 else 0)
                else:  # 16-byte rows, for vector reads along them
                    pad = max(1, 16 // esize) if rank > 1 else 0
                    inner = _round_up(box.extent[order[-1]], max(1, 16 // esize)) + pad
                storage = (*(box.extent[d] for d in order[:-1]), inner)
                slots = 1
                for e in storage:
                    slots *= e
                if slots * esize * t_stages > budget:
                    continue
                budget -= slots * esize * t_stages
                buf = Buffer(f"{t.name}_sh{k}", t.name, "shared", k, box, order, storage,
                             dom, prefix, n_prefix, True, False, stages=t_stages)
                lanes, whole = copy_lanes(buf, t, self.copy_bytes, esize, state.sizes,
                                          scatter=self.copy_transposed)
                if whole and not leaders_aligned(split_footprint(fp, lanes)[0], buf, lanes):
                    # a tile origin off the lanes: the stores one by one, or one-element copies
                    whole, lanes = False, lanes if self.copy_transposed else 1
                if lanes > 1:
                    buf = dataclasses.replace(buf, copy_lanes=lanes, copy_scatter=not whole)
                bufs.append(buf)
            if not bufs:
                continue
            schedule = _graft_shared(schedule, path_of(node), bufs, fp_of={
                b.name: footprint(prefix, reads, b.tensor) for b in bufs}, km_block=km.block, k=k,
                unroll=self.unroll_copies, n_prefix=n_prefix)
            for buf in bufs:
                prove_in_box(buf, fn)
            made.extend(bufs)
        if not made:
            return state
        return dataclasses.replace(state, schedule=schedule, base_schedule=base,
                                   promotion=promotion.with_buffers(made))


def strided_along_x(node: isl.ScheduleNode, reads: isl.UnionMap, block: tuple[int, ...],
                    validity: isl.UnionMap) -> set[str]:
    """Tensors that consecutive threads along ``threadIdx.x`` read with a stride: the thread
    band's x member (as `map-to-threads` chose it) moves along a statement dimension that some
    index of the access uses but its last (contiguous) index does not — a transpose's
    ``A(n, m)`` with ``n`` on ``x``. Reads that do not move with ``x`` (broadcasts) are not
    strided."""
    band = first_band_below(node)
    if band is None:
        return set()
    members = parallel_members(band, validity, sum(1 for b in block if b > 1) or 1)
    if not members:
        return set()
    x_dims: dict[str, set[int]] = {}
    for aff in band_members(band)[members[-1]]:
        name = aff.get_domain_space().get_tuple_name(isl.dim_type.set)
        x_dims.setdefault(name, set()).update(
            d for d in range(aff.dim(isl.dim_type.in_))
            if not aff.get_coefficient_val(isl.dim_type.in_, d).is_zero())
    out: set[str] = set()
    for m in maps_of(reads):
        dims = x_dims.get(m.get_tuple_name(isl.dim_type.in_))
        rank = m.dim(isl.dim_type.out)
        if not dims or rank < 2:
            continue
        for ma in _access_functions(m):
            uses = [{d for d in dims if not ma.get_aff(j).get_coefficient_val(
                isl.dim_type.in_, d).is_zero()} for j in range(rank)]
            if not uses[-1] and any(uses[:-1]):
                out.add(m.get_tuple_name(isl.dim_type.out))
    return out


def _register_tiled(node: isl.ScheduleNode) -> bool:
    """Some band below ``node`` has all its members unrolled (`register-tile`'s register part)."""
    hit: list[bool] = []

    def visit(n: isl.ScheduleNode) -> bool:
        if n.get_type() == isl.schedule_node_type.band and all(
                n.band_member_get_ast_loop_type(m) == isl.ast_loop_type.unroll
                for m in range(n.band_n_member())):
            hit.append(True)
        return not hit

    node.foreach_descendant_top_down(visit)
    return bool(hit)


def _output_dims(fn, dom: isl.UnionSet, tensor: str) -> set[int]:
    """Dimensions of ``tensor`` that a read in a statement of ``dom`` indexes with an
    expression of that statement's lhs indices."""
    from .. import ir

    out: set[int] = set()
    for inst in sets_of(dom):
        m = re.match(r"^S(\d+)$", inst.get_tuple_name() or "")
        if m is None:
            continue
        st = fn.statements[int(m.group(1))]
        for rd in (x for x in ir.walk(st.rhs) if isinstance(x, ir.Read) and x.tensor == tensor):
            for j, index in enumerate(rd.indices):
                if any(isinstance(x, ir.Index) and x.name in st.lhs for x in ir.walk(index)):
                    out.add(j)
    return out


def _access_functions(m: isl.Map) -> list[isl.MultiAff]:
    """The affine functions of the accesses in ``m`` (one statement's reads of one tensor,
    several reads in one map — a stencil's ``A(i)`` and ``A(i + 1)`` — taken one by one)."""
    out: list[isl.MultiAff] = []
    for bm in m.get_basic_maps():
        one = isl.Map.from_basic_map(bm)
        if one.is_single_valued():
            isl.PwMultiAff.from_map(one).foreach_piece(lambda _set, ma: out.append(ma))
    return out


def _outer_members(band: isl.ScheduleNode) -> int:
    """Band members above ``band`` (0 for a kernel's first band)."""
    n, node = 0, band
    while node.has_parent():
        node = node.parent()
        if node.get_type() == isl.schedule_node_type.band:
            n += node.band_n_member()
    return n


def _range_tensor(tagged: isl.Map) -> str | None:
    """Tensor name of a map ``S[...] -> [[p] -> T[a]]``."""
    rng = tagged.range()
    if not rng.is_wrapping():
        return None
    return rng.unwrap().get_tuple_name(isl.dim_type.out)


# isl unrolls a shared copy (`unroll_copies`) of at most this many copies per thread: a block
# of one thread copying a 128x8 tile got 1,024 copy statements per stage from isl (issue 31:
# 30-50 s compiles of tuning candidates); the default tiles copy 2-8 per thread
MAX_UNROLLED_COPIES = 32


def _round_up(v: int, m: int) -> int:
    return (v + m - 1) // m * m


def _graft_shared(schedule: isl.Schedule, path: tuple[int, ...], bufs: list[Buffer],
                  fp_of: dict[str, isl.Map], km_block: tuple[int, int, int], k: int,
                  unroll: bool, n_prefix: int) -> isl.Schedule:
    """Graft the copies and barriers of ``bufs`` around the node at ``path`` (see the module
    docstring). Double-buffered buffers are copied one tile ahead with cp.async: the first
    tile's copies (``cpin``, first iteration only) and a commit, the next tile's copies
    (``cpnext``) and a commit, then ``wait``: wait for all but the newest group, barrier."""
    node = node_at(schedule, path)
    prefix_set = isl.Set.from_union_set(bufs[0].prefix.range())
    ahead_map = _one_ahead(prefix_set, n_prefix)
    first = prefix_set.subtract(ahead_map.range())          # iterations with no predecessor
    parts: list = []
    ext: isl.UnionMap | None = None

    def add(e: isl.Map, buf: Buffer | None, ahead: bool, lanes: int = 1) -> None:
        nonlocal ext
        copy_set = e.range()
        if buf is None:  # a barrier or a commit
            parts.append((isl.UnionSet.from_set(copy_set), None, None, False))
        else:
            filt = thread_copy_filter(copy_set, buf, n_prefix, km_block, ahead=ahead, lanes=lanes)
            prove_copy_mapping(copy_set, filt, THREAD_PARAMS)
            per_thread = -(-buf.box.volume // (lanes * km_block[0] * km_block[1] * km_block[2]))
            parts.append((isl.UnionSet.from_set(copy_set), isl.UnionSet.from_set(filt),
                          copy_band(copy_set, buf, n_prefix, ahead=ahead, lanes=lanes),
                          unroll and per_thread <= MAX_UNROLLED_COPIES))
        ext = isl.UnionMap.from_map(e) if ext is None else ext.union(isl.UnionMap.from_map(e))

    def add_copies(fp: isl.Map, buf: Buffer, stem: str, ahead: bool) -> None:
        """The copies of ``fp``: vector leaders and the one-element rest (`copy-bytes`)."""
        if buf.copy_lanes == 1:
            add(copy_extension(fp, f"cp{stem}_{buf.name}"), buf, ahead)
            return
        leaders, rest = split_footprint(fp, buf.copy_lanes)
        if not leaders.is_empty():
            add(copy_extension(leaders, f"cpv{stem}_{buf.name}"), buf, ahead, buf.copy_lanes)
        if not rest.is_empty():
            add(copy_extension(rest, f"cp{stem}_{buf.name}"), buf, ahead)

    staged = [b for b in bufs if b.stages > 1]
    for buf in bufs:
        fp = fp_of[buf.name]
        add_copies(fp.intersect_domain(first) if buf.stages > 1 else fp, buf, "in", False)
    if staged:
        add(sync_extension(first, f"commit_{k}_0"), None, False)
        for buf in staged:
            nxt = ahead_map.apply_range(fp_of[buf.name])  # [p] -> elements of tile p + 1
            if not nxt.is_empty():
                add_copies(nxt, buf, "next", True)
        add(sync_extension(prefix_set, f"commit_{k}_1"), None, False)
        add(sync_extension(prefix_set, f"wait_{k}_0"), None, False)
    else:
        add(sync_extension(prefix_set, f"sync_{k}_0"), None, False)
    assert ext is not None
    node = graft(node, ext, parts, before=True)
    s1 = sync_extension(prefix_set, f"sync_{k}_1")
    node = graft(node, isl.UnionMap.from_map(s1),
                 [(isl.UnionSet.from_set(s1.range()), None, None, False)], before=False)
    return node.get_schedule()


def _one_ahead(prefix_set: isl.Set, n_prefix: int) -> isl.Map:
    """``{ [p] -> [p + e_last] }`` between prefix values that both occur."""
    space = prefix_set.get_space()
    text = ", ".join(f"p{i}" for i in range(n_prefix))
    out = ", ".join(f"p{i}" if i < n_prefix - 1 else f"p{i} + 1" for i in range(n_prefix))
    params = ", ".join(space.get_dim_name(isl.dim_type.param, i)
                       for i in range(space.dim(isl.dim_type.param)))
    m = isl.Map.read_from_str(space.get_ctx(), f"[{params}] -> {{ [{text}] -> [{out}] }}")
    return m.intersect_domain(prefix_set).intersect_range(prefix_set)
