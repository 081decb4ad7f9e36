"""The `mark-parallel` pass: mark the outermost loops the host backend may split over threads."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

import islpy as isl

from ..poly.legality import member_is_parallel
from ..poly.state import CompileState
from ..poly.tree import mark_name, node_at, outermost_band_paths
from .base import Pass, register

__all__ = ["PARALLEL", "PARALLEL_END", "MarkParallel"]

PARALLEL = "parallel"
PARALLEL_END = "parallel-end"


@register
@dataclass(frozen=True)
class MarkParallel(Pass):
    """Insert a mark ``parallel`` above the first member of each outermost band that makes a
    loop (takes more than one value at the sizes compiled for), when that member is parallel.

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
            # Members with one value at these sizes (a batch of 16 tiled by 32) give no loop:
            # the outer loop is the first member with more than one.
            member = _first_loop_member(node)
            if member_is_parallel(node, member, state.deps.validity):
                if member > 0:
                    node = node.band_split(member).child(0)
                # The parallel member gets a band of its own and the rest sits under a
                # `parallel-end` mark: when isl drops the member's loop as degenerate (one
                # iteration), the first loop under `parallel` must not be taken for it.
                if node.band_n_member() > 1:
                    node = node.band_split(1)
                node = node.child(0).insert_mark(isl.Id(PARALLEL_END, context=ctx)).parent()
                schedule = node.insert_mark(isl.Id(PARALLEL, context=ctx)).get_schedule()
        return dataclasses.replace(state, schedule=schedule)


def _first_loop_member(node: isl.ScheduleNode) -> int:
    """The first member of band ``node`` that takes more than one value on its domain (the
    last member when none does)."""
    domain = node.get_domain()
    partial = node.band_get_partial_schedule()
    last = node.band_n_member() - 1
    for m in range(last):
        values = isl.UnionMap.from_union_pw_aff(partial.get_at(m)).intersect_domain(domain).range()
        if values.is_empty():
            continue
        if not isl.Set.from_union_set(values).is_singleton():
            return m
    return last
