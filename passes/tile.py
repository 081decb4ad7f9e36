"""The `tile` pass: tile the outermost band(s) of the schedule tree."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

from ..poly.kernel_select import selects
from ..poly.state import CompileState
from ..poly.tree import node_at, outermost_band_paths, tile_band
from .base import Pass, register

__all__ = ["Tile", "tile_band"]  # tile_band: re-exported (`poly.tree`)


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
    reorder dependent iterations). With ``only`` / ``skip`` (`poly.kernel_select`) it tiles
    only the bands of the statements they select.
    """

    name = "tile"
    requires_schedule = True
    sizes: tuple[int, ...] = (32, 32)
    only: tuple[int, ...] = ()         # statements of the kernels it maps (poly.kernel_select)
    skip: tuple[int, ...] = ()         # statements of the kernels it leaves alone

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
            if not selects(node, self.only, self.skip):
                continue
            sizes = self.sizes
            if chunked is not None and chunked(node, state.fn):
                sizes = (0, *sizes)
            schedule = tile_band(node, sizes).get_schedule()
        return dataclasses.replace(state, schedule=schedule)
