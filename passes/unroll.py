"""The `unroll` pass: strip-mine the innermost band member and have isl unroll the strip."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

import islpy as isl

from ..poly.kernel_select import selects
from ..poly.state import CompileState
from ..poly.tree import leaf_band_paths, node_at
from .base import Pass, register

__all__ = ["Unroll", "unroll_band"]


@register
@dataclass(frozen=True)
class Unroll(Pass):
    """Unroll the innermost loop of every innermost band by ``factor`` (iterations of a
    thread: `unroll_band`).

    For each band with no band below it other than bands isl unrolls already (a register
    tile's: a matmul's k point loop counts as innermost above its 8x8 register band), its last
    member is split into a band of its own and
    strip-mined by ``factor`` (a strip loop ``floor(x / factor)`` over a point loop
    ``x - factor * floor(x / factor)`` in ``[0, factor)``); the point loop's isl AST loop type
    is set to ``unroll``, so isl's AST builder emits ``factor`` copies of the body (with the
    guards a partial strip needs) instead of a loop. Execution order is unchanged, so the pass
    is legal by construction (the pass manager proves it anyway). ``factor=1`` does nothing.
    Requires a schedule.
    """

    name = "unroll"
    requires_schedule = True
    factor: int = 4
    only: tuple[int, ...] = ()         # statements of the kernels it maps (poly.kernel_select)
    skip: tuple[int, ...] = ()         # statements of the kernels it leaves alone

    def __post_init__(self):
        if self.factor < 1:
            raise ValueError(f"unroll factor must be >= 1, got {self.factor}")

    def run(self, state: CompileState) -> CompileState:
        schedule = state.schedule
        assert schedule is not None
        if self.factor == 1:
            return state
        # Deepest first: transforming a band leaves the paths of bands outside it valid.
        for path in sorted(leaf_band_paths(schedule, ignore=_fully_unrolled), key=len,
                           reverse=True):
            if not selects(node_at(schedule, path), self.only, self.skip):
                continue
            schedule = unroll_band(node_at(schedule, path), self.factor).get_schedule()
        return dataclasses.replace(state, schedule=schedule)


def _fully_unrolled(node: isl.ScheduleNode) -> bool:
    return all(node.band_member_get_ast_loop_type(i) == isl.ast_loop_type.unroll
               for i in range(node.band_n_member()))


def member_stride(node: isl.ScheduleNode) -> int:
    """The stride of the values the single member of band ``node`` takes over the instances
    that reach it (1 when dense): 32 for a point loop a filter ``v mod 32 = threadIdx.x``
    gave to threads."""
    upa = node.band_get_partial_schedule().get_at(0)
    values = isl.UnionMap.from_union_pw_aff(upa).intersect_domain(node.get_domain()).range()
    if values.is_empty():
        return 1
    stride = isl.Set.from_union_set(values).get_stride(0)
    return max(1, stride.to_python()) if stride.is_int() else 1


def unroll_band(node: isl.ScheduleNode, factor: int) -> isl.ScheduleNode:
    """Strip-mine the last member of band ``node`` by ``factor`` of its own iterations and mark
    the strip unrolled; returns a node in the transformed tree.

    The strip spans ``factor * stride`` values of the member, ``stride`` being the stride of
    the values a thread takes (`member_stride`): a point loop given to 32 threads by
    ``v mod 32 = tx`` unrolls ``factor`` of each thread's iterations. A strip narrower than the
    stride would hold one iteration per thread (nothing to unroll), and isl (0.26, islpy
    2026.2.2) builds a wrong AST for some of those: ``{ S[n] : 0 <= n < 128, n = tx mod 32 }``
    scheduled by ``floor(n / 16)`` gives ``S(tx);`` alone, dropping three of the four instances
    (tests/test_unroll_strides.py pins it)."""
    n = node.band_n_member()
    if n > 1:
        node = node.band_split(n - 1).child(0)
    ctx = node.get_ctx()
    ctx.set_tile_scale_tile_loops(0)
    ctx.set_tile_shift_point_loops(1)
    span = factor * member_stride(node)
    sizes = isl.MultiVal.zero(node.band_get_space()).set_at(0, isl.Val.int_from_si(ctx, span))
    node = node.band_tile(sizes).child(0)
    return node.band_member_set_ast_loop_type(0, isl.ast_loop_type.unroll)
