"""The `schedule` pass: compute a schedule tree with isl's scheduler."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field

from ..poly.scheduler import FUSION_STRATEGIES, compute_schedule
from ..poly.state import CompileState
from .base import Pass, register
from .split_k import fold_statements

__all__ = ["Schedule"]


@register
@dataclass(frozen=True)
class Schedule(Pass):
    """Replace the schedule tree by isl's schedule for the scop's dependences.

    ``fusion`` is TC's outer fusion strategy (max, preserve3coincident, min); ``skew`` allows
    skewed band members (i + j); ``positive-orthant`` forbids loop reversal. Band members are
    coincident when they carry no dependence other than reductions. Under ``max`` fusion the
    folds of `split-k` start a group of statements scheduled after the partial sums
    (``sequence_at`` of `poly.scheduler.compute_schedule`: isl took minutes fusing them; the
    other strategies separate them anyway, and keep a ragged last chunk's partial sum in the
    kernel of the others). Requires nothing; any
    previous tree is discarded (the schedule is recomputed from the dependences).
    """

    name = "schedule"
    fusion: str = field(default="max", metadata={"choices": FUSION_STRATEGIES})
    skew: bool = False
    positive_orthant: bool = True

    def run(self, state: CompileState) -> CompileState:
        schedule = compute_schedule(state.scop, state.deps, self.fusion, self.skew,
                                    self.positive_orthant,
                                    fold_statements(state.fn) if self.fusion == "max" else ())
        return dataclasses.replace(state, schedule=schedule)
