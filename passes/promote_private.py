"""The `promote-private` pass: each thread's accumulators kept in registers across a kernel's loop.

For each kernel whose tile band ``T`` starts with block-mapped (dependence-free) members and
goes on with sequential ones (a matmul's ``[mt, nt, kt]``), ``T`` is split after the parallel
members and the promotion node is the sequential band ``K`` (``[kt]``); when every member of
``T`` is dependence-free and a dependence joins two of the kernel's instances (the reduction
lies whole in the point band, as in a convolution tiled with all its input channels), the
node below ``T``. For every tensor the
kernel writes, the footprint *per thread* at ``K`` (the accesses of the instances below the
thread filters, whose sets hold ``_tx`` ...) gets a strided box; it is promoted when no two
threads (or prefix iterations) touch one element (so the copy is private), the box has at most
``max-elements`` slots and all the kernel's accesses to the tensor are affine. The tree becomes::

    band [mt, nt]
      extension { [p] -> cpin_<buf>[p, a] : a in the thread's footprint }   (if live-in)
      extension { [p] -> cpout_<buf>[p, a] : a written by the thread }
        sequence: cpin (unrolled) ; band [kt] ... (accesses go to registers) ; cpout (unrolled)

The copy-in is left out when the tensor is only accessed by one ``!`` reduction whose
initialisation writes every element read (the registers start at the identity). Register
indices are constants only when the loops around the accesses are unrolled — `register-tile`
marks its register band so; otherwise the buffer lives in local memory (correct, slower), so
the pass promotes only in kernels that `register-tile` transformed (a band marked unroll).
Legality of the original statements is proved on ``CompileState.base_schedule``.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

import islpy as isl

from ..poly.gpu_mapping import BLOCK_PARAMS, THREAD_PARAMS
from ..poly.kernel_select import selects
from ..poly.legality import member_is_parallel
from ..poly.promotion import (
    Buffer,
    Promotion,
    compute_box,
    copy_extension,
    footprint,
    graft,
    prove_in_box,
)
from ..poly.scop import maps_of
from ..poly.state import CompileState
from ..poly.tree import node_at, path_of
from .base import Pass, register
from .promote_shared import band_of_copy, promotable_kernels

__all__ = ["PromotePrivate"]

_LEAF = isl.schedule_node_type.leaf


def _leaf_domains(node: isl.ScheduleNode) -> isl.UnionSet:
    found: list[isl.UnionSet] = []

    def visit(n: isl.ScheduleNode) -> bool:
        if n.get_type() == _LEAF:
            found.append(n.get_domain())
        return True

    node.foreach_descendant_top_down(visit)
    out = found[0]
    for d in found[1:]:
        out = out.union(d)
    return out


def _has_unrolled_band(node: isl.ScheduleNode) -> bool:
    hit: list[bool] = []

    def visit(n: isl.ScheduleNode) -> bool:
        if n.get_type() == isl.schedule_node_type.band and any(
                n.band_member_get_ast_loop_type(m) == isl.ast_loop_type.unroll
                for m in range(n.band_n_member())):
            hit.append(True)
        return True

    node.foreach_descendant_top_down(visit)
    return bool(hit)


def _private(fp: isl.Map) -> bool:
    """No two (prefix, thread) pairs touch one element."""
    rel = fp
    for p in (*THREAD_PARAMS, *BLOCK_PARAMS):
        pos = rel.find_dim_by_name(isl.dim_type.param, p)
        if pos >= 0:
            rel = rel.move_dims(isl.dim_type.in_, rel.dim(isl.dim_type.in_), isl.dim_type.param, pos, 1)
    return rel.is_injective()


@register
@dataclass(frozen=True)
class PromotePrivate(Pass):
    """Keep each thread's written elements in registers across the kernel's sequential tile
    loop (see the module docstring)."""

    name = "promote-private"
    requires_schedule = True
    max_elements: int = 128
    only: tuple[int, ...] = ()         # statements of the kernels it maps (poly.kernel_select)
    skip: tuple[int, ...] = ()         # statements of the kernels it leaves alone

    def run(self, state: CompileState) -> CompileState:
        schedule = state.schedule
        assert schedule is not None
        base = state.proof_schedule
        scop = state.scop
        made: list[Buffer] = []
        for k, _, tile in promotable_kernels(base):
            if not _has_unrolled_band(tile) or not selects(tile, self.only, self.skip):
                continue
            n_par = 0
            while n_par < tile.band_n_member() and member_is_parallel(tile, n_par, state.deps.validity):
                n_par += 1
            if n_par == 0:
                continue
            dom = tile.get_domain()
            if not scop.may_reads.intersect_domain(dom).is_empty():
                continue
            if n_par == tile.band_n_member() and state.deps.validity.intersect_domain(
                    dom).intersect_range(dom).is_empty():
                continue  # no sequential tile loop and nothing accumulates below T either
            tpath = path_of(tile)
            if n_par < tile.band_n_member():
                base = tile.band_split(n_par).get_schedule()
                schedule = node_at(schedule, tpath).band_split(n_par).get_schedule()
            # the sequential band K; with no sequential tile member (a reduction tiled whole,
            # as in a register-tiled convolution), the node below T
            seq = node_at(base, tpath).child(0)
            prefix = seq.get_prefix_schedule_union_map()
            mine = _leaf_domains(seq)                    # instances of one thread
            writes = scop.writes.intersect_domain(mine)
            reads = scop.reads.intersect_domain(mine)
            written = sorted({m.get_tuple_name(isl.dim_type.out) for m in maps_of(writes)})
            bufs, fps = [], {}
            for name in written:
                fp = footprint(prefix, writes.union(reads), name)
                if fp is None or not _private(fp):
                    continue
                box = compute_box(fp, interleave=True)  # an interleaved register tile's gaps
                if box is None or box.volume > self.max_elements:
                    continue
                rank = len(box.extent)
                if rank == 0:  # a scalar output (a full reduction's): no coordinates to index
                    continue   # registers by (poly.promotion.local_index); it stays global
                live_in, fill = _live_in(state, mine, name, prefix, reads, fp)
                bufs.append(Buffer(f"{name}_reg{k}", name, "private", k, box, tuple(range(rank)),
                                   box.extent, mine, prefix, n_par, live_in, True, fill))
                fps[bufs[-1].name] = (fp, footprint(prefix, writes, name))
            if not bufs:
                continue
            node = node_at(schedule, path_of(seq))
            for buf in bufs:
                fp_all, fp_w = fps[buf.name]
                if buf.copy_in or buf.fill is not None:
                    e = copy_extension(fp_all, f"cp{'in' if buf.copy_in else 'init'}_{buf.name}")
                    node = graft(node, isl.UnionMap.from_map(e), [
                        (isl.UnionSet.from_set(e.range()), None,
                         band_of_copy(e.range(), buf.n_prefix, len(buf.box.extent)), True)], before=True)
                e = copy_extension(fp_w, f"cpout_{buf.name}")
                node = graft(node, isl.UnionMap.from_map(e), [
                    (isl.UnionSet.from_set(e.range()), None,
                     band_of_copy(e.range(), buf.n_prefix, len(buf.box.extent)), True)], before=False)
            hoisted = [b.fill for b in bufs if b.fill is not None]
            if hoisted:
                # the initialisations run on the registers, before the loop: filtered out of it
                # only now, below the copies' extension, so that a tile where the update never
                # runs (a guarded reduction's empty range: TC's triangular product) still fills
                # and writes back its registers
                keep = seq.get_domain()
                for j in hoisted:
                    init = isl.UnionSet.from_set(scop.domains[f"S{j}_init"])
                    keep = keep.subtract(init.align_params(keep.get_space()))
                node = node.insert_filter(keep)
            schedule = node.get_schedule()
            for buf in bufs:
                prove_in_box(buf, state.fn)
            made.extend(bufs)
        if not made:
            return state
        promotion = (state.promotion or Promotion()).with_buffers(made)
        return dataclasses.replace(state, schedule=schedule, base_schedule=base, promotion=promotion)


def _live_in(state: CompileState, mine: isl.UnionSet, tensor: str, prefix: isl.UnionMap,
             reads: isl.UnionMap, fp_all: isl.Map) -> tuple[bool, int | None]:
    """(copy in, hoisted initialisation): no copy-in when nothing is read; when only one ``!``
    statement ``S<k>`` accesses ``tensor`` here and ``S<k>_init`` writes every element of the
    footprint, no copy-in either and ``k``: the registers are filled with the identity before
    the loop instead (``cpinit_<buf>``) and ``S<k>_init`` is filtered out of the loop (nothing
    else touches those elements in this thread between the two places, `_private`)."""
    users = {m.get_tuple_name(isl.dim_type.in_) for m in maps_of(
        state.scop.writes.union(state.scop.all_reads).intersect_domain(mine))
        if m.get_tuple_name(isl.dim_type.out) == tensor}
    stems = {u.removesuffix("_init") for u in users}
    if len(stems) == 1:
        stem = stems.pop()
        if f"{stem}_init" in users:
            init_writes = state.scop.writes.intersect_domain(mine).intersect_domain(
                isl.UnionSet.from_set(state.scop.domains[f"{stem}_init"]).align_params(mine.get_space()))
            fp_i = footprint(prefix, init_writes, tensor)
            if fp_i is not None and fp_all.is_subset(fp_i):
                return False, int(stem[1:])
    return footprint(prefix, reads, tensor) is not None, None
