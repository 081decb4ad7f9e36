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
    parse_kernel_mark,
    pin_unused,
    with_params,
)
from ..poly.kernel_select import describe_selection, selects, statement_numbers
from ..poly.state import CompileState
from ..poly.tree import mark_name, node_at
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
    Requires a schedule; must run before `map-to-threads` and only once per group.

    With ``only`` / ``skip`` (`poly.kernel_select`: a program whose kernels are mapped each
    their own way, `MappingOptions.kernels`) it maps only the groups they select and leaves
    groups already under a kernel mark alone; the pipeline runs the per-kernel mappings first
    and the shared one (``skip``) last, so a group that the shared one skips but no per-kernel
    one mapped — one that straddles two per-kernel mappings, as under another fusion than
    the one they were made for — is a `PipelineError`.
    """

    name = "map-to-blocks"
    requires_schedule = True
    grid: tuple[int, ...] = (256, 256)
    only: tuple[int, ...] = ()         # statements of the kernels it maps (poly.kernel_select)
    skip: tuple[int, ...] = ()         # statements of the kernels it leaves alone

    def __post_init__(self):
        if not 1 <= len(self.grid) <= 3 or any(g < 1 for g in self.grid):
            raise ValueError(f"grid takes 1 to 3 positive extents, got {self.grid}")

    def run(self, state: CompileState) -> CompileState:
        schedule = state.schedule
        assert schedule is not None
        taken = set(BLOCK_PARAMS + THREAD_PARAMS) & set(state.fn.sizes)
        if taken:
            raise PipelineError(f"size names {', '.join(sorted(taken))} are reserved for the GPU mapping")
        selective = bool(self.only or self.skip)
        if not selective and "kernel grid=" in str(schedule):
            raise PipelineError("map-to-blocks: the tree is already mapped")
        schedule = with_params(schedule, BLOCK_PARAMS)
        ctx = state.ctx
        # Work from the last group to the first so that earlier paths stay valid.
        for path in reversed(kernel_groups(schedule)):
            node = node_at(schedule, path)
            if selective and parse_kernel_mark(mark_name(node)) is not None:
                continue  # mapped by an earlier (per-kernel) map-to-blocks
            if not selects(node, self.only, self.skip):
                if self.skip and not self.only:
                    numbers = ",".join(f"S{k}" for k in sorted(statement_numbers(node)))
                    raise PipelineError(
                        f"map-to-blocks: the kernel of {numbers} is left to the per-kernel "
                        f"mappings ({describe_selection(self.skip, ())}) but none of them maps "
                        "it whole: they were made for another fusion; use the fusion they were "
                        "made for, or drop `kernels` from the options")
                continue
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
