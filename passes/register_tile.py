"""The `register-tile` pass: each GPU thread computes a micro-tile of outputs held in registers.

Runs after `map-to-blocks` and before `map-to-threads`. In each kernel, the point band ``P``
right below the block-mapped tile band ``T`` (so `tile` must have run) has members
``u_0 .. u_{n-1}`` with ``u_i`` in ``[0, T_i)``. With register sizes ``R_0, R_1, ...`` for
its leading members, ``P`` becomes three bands::

    band T                                   (unchanged: blocks, sequential tile loops)
      band [floor(u_i / R_i) for i < r]      thread part: `map-to-threads` maps it, T_i/R_i threads
        band [u_j for j >= r]                the other members (a matmul's k point loop)
          band [u_i mod R_i for i < r]       register part, every member unrolled by isl
            ...                              the statements, as before

so a thread owns a contiguous ``R_0 x R_1 ...`` block of outputs and walks the reduction once
for all of them; `promote-private` then keeps the accumulators in registers. Permuting the
members of ``P`` is legal because ``P`` is permutable (checked); the pass manager proves it.

When bands lie below ``P`` (a convolution's window loops ``kh``, ``kw``) and no member is
interleaved, the nest form of `passes/register_nest.py` applies instead: the register part goes
below those bands.

**Interleaved members** (``interleave``: a width ``V_i`` per register-tiled member, 0 = the
contiguous block above). With tile extent ``T_i``, ``G = R_i / V_i`` groups of ``V_i`` adjacent
elements spaced ``S = T_i / G`` apart: ``u = g*S + t*V + v`` gives thread part
``floor((u mod S) / V)`` (still ``T_i / R_i`` threads) and *two* register members ``floor(u / S)``
and ``u mod V`` (both unrolled)::

    band [floor((u_i mod S_i) / V_i) ...]         thread part
      band [u_j for j >= r]
        band [floor(u_i / S_i), u_i mod V_i ...]  register part

For a 128-wide tile with ``R = 8, V = 4`` thread ``t`` owns columns ``4t .. 4t+3`` and
``64+4t .. 64+4t+3``: the 8 threads of a 128-bit shared-memory phase read 128 contiguous bytes
(no bank conflict), where the contiguous block puts them 32 bytes apart (2-way conflicts).
The thread footprint then has gaps; `poly.promotion.compute_box` compresses them
(``interleave=True``), so `promote-private` keeps the ``R_i`` accumulators in registers. A
width that does not divide ``R_i`` (or equals it) gives the contiguous block.

A kernel is left alone when: its tile band is not followed by a point band; ``P`` is not
permutable; a register-tiled member carries a dependence (it must go to threads); a member's
tile extent is not a multiple of its register size; or ``P`` has no member left after the
register part (nothing would be gained by the permutation — the tile is then split only).
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

import islpy as isl

from ..poly.gpu_mapping import first_band_below, kernel_marks
from ..poly.kernel_select import selects
from ..poly.legality import member_is_parallel
from ..poly.scop import sets_of
from ..poly.state import CompileState
from ..poly.tree import node_at
from .base import Pass, register
from .register_nest import band_chain_below, split_nest_band

__all__ = ["RegisterTile", "point_extent"]

_BAND = isl.schedule_node_type.band


def point_extent(band: isl.ScheduleNode, member: int) -> int | None:
    """``max + 1`` of band member ``member`` over the band's domain (None if unbounded)."""
    upa = band.band_get_partial_schedule().get_at(member)
    values = isl.UnionMap.from_union_pw_aff(upa).range()
    hi = None
    for s in sets_of(values):
        v = s.dim_max_val(0)
        if not v.is_int():
            return None
        hi = int(v.to_python()) if hi is None else max(hi, int(v.to_python()))
    return None if hi is None else hi + 1


@register
@dataclass(frozen=True)
class RegisterTile(Pass):
    """Split each kernel's point band into thread, sequential and register parts (see the
    module docstring); ``sizes`` are the outputs per thread along the leading point members."""

    name = "register-tile"
    requires_schedule = True
    sizes: tuple[int, ...] = (8, 8)
    interleave: tuple[int, ...] = ()   # per member: group width V (0: contiguous)
    only: tuple[int, ...] = ()         # statements of the kernels it maps (poly.kernel_select)
    skip: tuple[int, ...] = ()         # statements of the kernels it leaves alone

    def __post_init__(self):
        if not self.sizes or any(s < 1 for s in self.sizes):
            raise ValueError(f"register tile sizes must be >= 1, got {self.sizes}")
        if len(self.interleave) > len(self.sizes) or any(v < 0 for v in self.interleave):
            raise ValueError(f"register-tile: interleave takes a width >= 0 per register-tiled "
                             f"member (at most {len(self.sizes)}), got {self.interleave}")
        for v, r in zip(self.interleave, self.sizes, strict=False):
            if v and r % v:
                raise ValueError(f"register-tile: interleave width {v} does not divide the "
                                 f"register size {r}")

    def run(self, state: CompileState) -> CompileState:
        schedule = state.schedule
        assert schedule is not None
        for path, _ in reversed(kernel_marks(schedule)):
            if not selects(node_at(schedule, path), self.only, self.skip):
                continue
            outer = first_band_below(node_at(schedule, path).child(0))
            if outer is None or outer.n_children() != 1 or outer.child(0).get_type() != _BAND:
                continue
            point = outer.child(0)
            if band_chain_below(point) and not any(self.interleave):  # window bands below P
                new = split_nest_band(point, self.sizes, state.deps.validity)
            else:
                new = split_point_band(point, self.sizes, state.deps.validity, self.interleave)
            if new is not None:
                schedule = new.get_schedule()
        return dataclasses.replace(state, schedule=schedule)


def split_point_band(point: isl.ScheduleNode, sizes: tuple[int, ...],
                     validity: isl.UnionMap, interleave: tuple[int, ...] = ()
                     ) -> isl.ScheduleNode | None:
    """The register tiling of point band ``point`` (None: left alone, see the module docstring);
    ``interleave[i]`` > 0 spreads member ``i``'s registers in groups of that width."""
    n = point.band_n_member()
    r = min(len(sizes), n)
    if r == 0 or r == n or not point.band_get_permutable():
        return None
    ctx = point.get_ctx()
    extents: list[int] = []
    for i in range(r):
        if not member_is_parallel(point, i, validity):
            return None
        extent = point_extent(point, i)
        if extent is None or extent % sizes[i] or extent // sizes[i] < 1:
            return None
        extents.append(extent)
    mupa = point.band_get_partial_schedule()
    coincident = [point.band_member_get_coincident(i) for i in range(n)]
    threads, regs = [], []
    for i in range(r):
        u = mupa.get_at(i)
        size = isl.Val.int_from_si(ctx, sizes[i])
        width = interleave[i] if i < len(interleave) else 0
        if 0 < width < sizes[i] and sizes[i] % width == 0:
            # u = g*S + t*V + v: thread t, registers (g, v); S = extent / (R / V)
            span = isl.Val.int_from_si(ctx, extents[i] // sizes[i] * width)
            v = isl.Val.int_from_si(ctx, width)
            threads.append(u.mod_val(span).scale_down_val(v).floor())
            regs.extend([u.scale_down_val(span).floor(), u.mod_val(v)])
        else:
            threads.append(u.scale_down_val(size).floor())
            regs.append(u.mod_val(size))
    rest = [mupa.get_at(j) for j in range(r, n)]

    def band_of(upas: list[isl.UnionPwAff]) -> isl.MultiUnionPwAff:
        space = isl.Space.set_alloc(ctx, 0, len(upas)).align_params(mupa.get_space().params())
        lst = isl.UnionPwAffList.alloc(ctx, len(upas))
        for u in upas:
            lst = lst.add(u)
        return isl.MultiUnionPwAff.from_union_pw_aff_list(space, lst)

    node = point.delete()
    node = node.insert_partial_schedule(band_of(regs))
    for m in range(len(regs)):
        node = node.band_member_set_ast_loop_type(m, isl.ast_loop_type.unroll)
    node = node.insert_partial_schedule(band_of(rest))
    node = node.insert_partial_schedule(band_of(threads))
    node = node.band_set_permutable(1)
    for i in range(r):
        node = node.band_member_set_coincident(i, int(coincident[i]))
    return node
