"""The `map-to-threads` pass: the point band of each kernel on threadIdx (innermost on .x)."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

import islpy as isl

from ..errors import PipelineError
from ..poly.gpu_mapping import (
    THREAD_PARAMS,
    KernelMark,
    first_band_below,
    kernel_marks,
    member_filter,
    parallel_members,
    pin_unused,
    with_params,
)
from ..poly.state import CompileState
from ..poly.tree import node_at
from .base import Pass, register

__all__ = ["MapToThreads"]

_BAND = isl.schedule_node_type.band


@register
@dataclass(frozen=True)
class MapToThreads(Pass):
    """Map threads inside each kernel made by `map-to-blocks`.

    The band mapped is the point band right below the block-mapped tile band (so `tile` must
    have run): its leading dependence-free members go to ``threadIdx`` with ``v mod block``
    (innermost on ``.x``, so consecutive threads touch consecutive elements); the kernel mark
    records the block extents. A kernel whose band was not tiled, or whose point band has no
    dependence-free member, keeps one thread per block (correct, slow). Requires
    `map-to-blocks` before it.
    """

    name = "map-to-threads"
    requires_schedule = True
    block: tuple[int, ...] = (32, 8)

    def __post_init__(self):
        if not 1 <= len(self.block) <= 3 or any(b < 1 for b in self.block):
            raise ValueError(f"block takes 1 to 3 positive extents, got {self.block}")

    def run(self, state: CompileState) -> CompileState:
        schedule = state.schedule
        assert schedule is not None
        marks = kernel_marks(schedule)
        if not marks:
            raise PipelineError("map-to-threads needs kernels: run `map-to-blocks` first")
        schedule = with_params(schedule, THREAD_PARAMS)
        ctx = state.ctx
        for path, km in reversed(marks):
            mark = node_at(schedule, path)
            outer = first_band_below(mark.child(0))
            block = [1, 1, 1]
            if outer is not None and outer.n_children() == 1 and outer.child(0).get_type() == _BAND:
                band = outer.child(0)
                members = parallel_members(band, state.deps.validity, len(self.block))
                for hw, member in enumerate(reversed(members)):
                    block[hw] = self.block[hw]
                    filt = member_filter(band, member, 1, self.block[hw], THREAD_PARAMS[hw])
                    band = band.insert_filter(filt).child(0)
                mark = node_at(band.get_schedule(), path)
            mark = pin_unused(mark.child(0), THREAD_PARAMS, block).parent()
            new = KernelMark(km.grid, tuple(block))  # type: ignore[arg-type]
            mark = mark.delete().insert_mark(isl.Id(new.name, context=ctx))
            schedule = mark.get_schedule()
        return dataclasses.replace(state, schedule=schedule)

