"""The `map-to-blocks` pass: one GPU kernel per top-level group, its outer band on blockIdx."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

import islpy as isl

from ..errors import PipelineError
from ..poly.gpu_mapping import (
    BLOCK_PARAMS,
    THREAD_PARAMS,
    KernelMark,
    first_band_below,
    kernel_groups,
    member_extent,
    member_filter,
    parallel_members,
    pin_unused,
    with_params,
)
from ..poly.state import CompileState
from ..poly.tree import node_at
from .base import Pass, register

__all__ = ["MapToBlocks"]


@register
@dataclass(frozen=True)
class MapToBlocks(Pass):
    """Wrap each top-level group of statements in a ``kernel grid=... block=1,1,1`` mark and map
    the leading dependence-free members of its first band (the tile band after `tile`) to
    ``blockIdx``: member value ``mod grid`` equals the block index, the innermost mapped member
    on ``.x``. The grid option is an upper bound: a member of a specialised kernel with fewer
    values gets that many blocks. Groups without such a member become one-block kernels.
    Requires a schedule; must run before `map-to-threads` and only once.
    """

    name = "map-to-blocks"
    requires_schedule = True
    grid: tuple[int, ...] = (256, 256)

    def __post_init__(self):
        if not 1 <= len(self.grid) <= 3 or any(g < 1 for g in self.grid):
            raise ValueError(f"grid takes 1 to 3 positive extents, got {self.grid}")

    def run(self, state: CompileState) -> CompileState:
        schedule = state.schedule
        assert schedule is not None
        taken = set(BLOCK_PARAMS + THREAD_PARAMS) & set(state.fn.sizes)
        if taken:
            raise PipelineError(f"size names {', '.join(sorted(taken))} are reserved for the GPU mapping")
        if "kernel grid=" in str(schedule):
            raise PipelineError("map-to-blocks: the tree is already mapped")
        schedule = with_params(schedule, BLOCK_PARAMS)
        ctx = state.ctx
        # Work from the last group to the first so that earlier paths stay valid.
        for path in reversed(kernel_groups(schedule)):
            node = node_at(schedule, path)
            band = first_band_below(node)
            grid = [1, 1, 1]
            if band is not None:
                members = parallel_members(band, state.deps.validity, len(self.grid))
                # innermost mapped member -> x: member members[-1] gets grid[0] on _bx, ...
                for hw, member in enumerate(reversed(members)):
                    # A specialised member with fewer values than the grid option launches only
                    # the blocks that have work (a grid of 1024 x 1024 for 16 tiles spent most of
                    # a small matmul's time launching empty blocks).
                    span = member_extent(band, member)
                    grid[hw] = self.grid[hw] if span is None else min(self.grid[hw], span)
                    filt = member_filter(band, member, 1, grid[hw], BLOCK_PARAMS[hw])
                    band = band.insert_filter(filt).child(0)
                node = node_at(band.get_schedule(), path)
            node = pin_unused(node, BLOCK_PARAMS, grid)
            mark = KernelMark(tuple(grid), (1, 1, 1))  # type: ignore[arg-type]
            schedule = node.insert_mark(isl.Id(mark.name, context=ctx)).get_schedule()
        return dataclasses.replace(state, schedule=schedule)
