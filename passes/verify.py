"""The `verify` pass: prove that the schedule tree respects every dependence."""

from __future__ import annotations

from dataclasses import dataclass

from ..poly.legality import check_legal
from ..poly.state import CompileState
from .base import Pass, register

__all__ = ["Verify"]


@register
@dataclass(frozen=True)
class Verify(Pass):
    """Leave the tree unchanged; fail (AssertionError with the tree) if it is illegal.

    Every validity dependence (RAW, WAR, WAW, reductions included) mapped through the tree's
    schedule must go lexicographically forward. Requires a schedule.
    """

    name = "verify"
    requires_schedule = True

    def run(self, state: CompileState) -> CompileState:
        assert state.schedule is not None
        check_legal(state.schedule, state.deps)
        return state
