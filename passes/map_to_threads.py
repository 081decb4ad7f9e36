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
    member_extent,
    member_filter,
    parallel_members,
    pin_unused,
    split_lanes,
    vector_lanes,
    with_params,
)
from ..poly.kernel_select import selects
from ..poly.scop import sets_of
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

    ``vector-bytes`` (0 = off): when the ``.x`` member is the point band's last member and its
    extent is a multiple of ``lanes * block.x`` (``lanes`` = ``vector-bytes`` over the widest
    element the kernel's statements touch), each thread takes ``lanes`` adjacent values of it
    (`split_lanes`: the member becomes ``floor(v / lanes)``, mapped ``mod block.x``, and a new
    unrolled member ``v mod lanes``), so LLVM can merge a thread's accesses into 128-bit ones.
    """

    name = "map-to-threads"
    requires_schedule = True
    block: tuple[int, ...] = (32, 8)
    vector_bytes: int = 0
    only: tuple[int, ...] = ()         # statements of the kernels it maps (poly.kernel_select)
    skip: tuple[int, ...] = ()         # statements of the kernels it leaves alone

    def __post_init__(self):
        if not 1 <= len(self.block) <= 3 or any(b < 1 for b in self.block):
            raise ValueError(f"block takes 1 to 3 positive extents, got {self.block}")
        if self.vector_bytes not in (0, 1, 2, 4, 8, 16):
            raise ValueError("map-to-threads: vector-bytes must be 0 (off) or a power of two <= 16")

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
            if not selects(mark, self.only, self.skip):
                continue
            outer = first_band_below(mark.child(0))
            block = [1, 1, 1]
            if outer is not None and outer.n_children() == 1 and outer.child(0).get_type() == _BAND:
                band = outer.child(0)
                members = parallel_members(band, state.deps.validity, len(self.block))
                for hw, member in enumerate(reversed(members)):
                    block[hw] = self.block[hw]
                    if hw == 0 and member == band.band_n_member() - 1:
                        band = self._vectorised(band, state)
                    filt = member_filter(band, member, 1, self.block[hw], THREAD_PARAMS[hw])
                    band = band.insert_filter(filt).child(0)
                mark = node_at(band.get_schedule(), path)
            mark = pin_unused(mark.child(0), THREAD_PARAMS, block).parent()
            new = KernelMark(km.grid, tuple(block))  # type: ignore[arg-type]
            mark = mark.delete().insert_mark(isl.Id(new.name, context=ctx))
            schedule = mark.get_schedule()
        return dataclasses.replace(state, schedule=schedule)

    def _vectorised(self, band: isl.ScheduleNode, state: CompileState) -> isl.ScheduleNode:
        names = {s.get_tuple_name() for s in sets_of(band.get_domain())}
        lanes = vector_lanes(state.fn, names, self.vector_bytes)
        span = member_extent(band, band.band_n_member() - 1)
        if lanes == 1 or span is None or span % (lanes * self.block[0]):
            return band
        return split_lanes(band, lanes)

