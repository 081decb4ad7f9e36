"""The `mark-parallel` pass: mark the outermost loops the host backend may split over threads."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

import islpy as isl

from ..poly.legality import member_is_parallel
from ..poly.state import CompileState
from ..poly.tree import mark_name, node_at, outermost_band_paths
from .base import Pass, register

__all__ = ["PARALLEL", "MarkParallel"]

PARALLEL = "parallel"


@register
@dataclass(frozen=True)
class MarkParallel(Pass):
    """Insert a mark ``parallel`` above each outermost band whose first member is parallel.

    Parallel here is proved against *all* dependences, reductions included (a reduction loop
    run by several host threads would race), not read from the band's coincident flags, which
    ignore reductions. Bands already marked are left alone. Requires a schedule.
    """

    name = "mark-parallel"
    requires_schedule = True

    def run(self, state: CompileState) -> CompileState:
        schedule = state.schedule
        assert schedule is not None
        ctx = state.ctx
        for path in outermost_band_paths(schedule):
            node = node_at(schedule, path)
            if node.has_parent() and mark_name(node.parent()) == PARALLEL:
                continue
            if member_is_parallel(node, 0, state.deps.validity):
                schedule = node.insert_mark(isl.Id(PARALLEL, context=ctx)).get_schedule()
        return dataclasses.replace(state, schedule=schedule)
