"""The `tile` pass: tile the outermost band(s) of the schedule tree."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

import islpy as isl

from ..poly.state import CompileState
from ..poly.tree import node_at, outermost_band_paths
from .base import Pass, register

__all__ = ["Tile", "tile_band"]


@register
@dataclass(frozen=True)
class Tile(Pass):
    """Tile each outermost band (the first band on each branch below the root).

    ``sizes[m]`` is the tile size of band member ``m``: the band becomes a tile band (the tile
    index ``floor(x / size)`` per member) over a point band (``x - size * tile`` in
    ``[0, size)``). A size of 0, and every member past the end of ``sizes``, leaves the member
    untiled: it stays whole in the tile band and has no point member; extra sizes are ignored.
    Both bands keep the coincident and permutable flags. A band of `split-k` partial sums whose
    first member is their chunk index (`split_k.chunk_member_band`) keeps that member untiled and
    takes ``sizes`` for the members after it. Requires a schedule; a band that is
    not permutable is left alone when it has more than one tiled member (tiling it would
    reorder dependent iterations).
    """

    name = "tile"
    requires_schedule = True
    sizes: tuple[int, ...] = (32, 32)

    def __post_init__(self):
        if any(s < 0 for s in self.sizes):
            raise ValueError(f"tile sizes must be >= 0, got {self.sizes}")

    def run(self, state: CompileState) -> CompileState:
        schedule = state.schedule
        assert schedule is not None
        chunked = None
        if state.fn.temporaries:  # split-k partial sums: their chunk member stays untiled
            from .split_k import chunk_member_band
            chunked = chunk_member_band
        for path in outermost_band_paths(schedule):
            node = node_at(schedule, path)
            sizes = self.sizes
            if chunked is not None and chunked(node, state.fn):
                sizes = (0, *sizes)
            schedule = tile_band(node, sizes).get_schedule()
        return dataclasses.replace(state, schedule=schedule)


def tile_band(node: isl.ScheduleNode, sizes: tuple[int, ...]) -> isl.ScheduleNode:
    """Tile band ``node`` (see `Tile`); returns the tile band node."""
    n = node.band_n_member()
    per_member = [sizes[m] if m < len(sizes) else 0 for m in range(n)]
    if not any(per_member):
        return node
    if sum(1 for s in per_member if s) > 1 and not node.band_get_permutable():
        return node
    ctx = node.get_ctx()
    ctx.set_tile_scale_tile_loops(0)
    ctx.set_tile_shift_point_loops(1)
    mv = isl.MultiVal.zero(node.band_get_space())
    for m, s in enumerate(per_member):
        mv = mv.set_at(m, isl.Val.int_from_si(ctx, s or 1))
    node = node.band_tile(mv)
    untiled = [m for m, s in enumerate(per_member) if not s]
    if untiled:
        node = _drop_members(node.child(0), untiled).parent()
    return node


def _drop_members(point: isl.ScheduleNode, members: list[int]) -> isl.ScheduleNode:
    """Remove ``members`` (all zero after a size-1 tiling) from point band ``point``."""
    mupa = point.band_get_partial_schedule()
    coincident = [point.band_member_get_coincident(m) for m in range(point.band_n_member())]
    permutable = point.band_get_permutable()
    for m in sorted(members, reverse=True):
        mupa = mupa.drop_dims(isl.dim_type.out, m, 1)
        del coincident[m]
    point = point.delete()
    if not coincident:
        return point
    point = point.insert_partial_schedule(mupa)
    point = point.band_set_permutable(permutable)
    for m, c in enumerate(coincident):
        point = point.band_member_set_coincident(m, c)
    return point
