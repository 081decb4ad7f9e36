"""The `specialize` pass: fix size parameters to values (before or after scheduling)."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

from ..errors import PipelineError
from ..poly.deps import compute_dependences
from ..poly.scop import build_scop
from ..poly.state import CompileState
from .base import Pass, register

__all__ = ["Specialize"]


@register
@dataclass(frozen=True)
class Specialize(Pass):
    """Fix sizes: ``specialize{N=64,K=3}``.

    The scop is rebuilt with those parameters fixed (its context and domains gain ``N = 64``)
    and the dependences recomputed; an existing schedule tree keeps its shape, its domain is
    intersected with the parameter values. Requires nothing; every name must be a size of the
    function and every value >= 1.
    """

    name = "specialize"
    free_options = "sizes"
    sizes: tuple[tuple[str, int], ...] = ()

    def __post_init__(self):
        for key, value in self.sizes:
            if value < 1:
                raise ValueError(f"size {key} must be >= 1, got {value}")

    def run(self, state: CompileState) -> CompileState:
        unknown = [k for k, _ in self.sizes if k not in state.fn.sizes]
        if unknown:
            raise PipelineError(
                f"specialize: {', '.join(unknown)} is not a size of {state.fn.name} "
                f"(sizes: {', '.join(state.fn.sizes) or 'none'})")
        sizes = {**(state.sizes or {}), **dict(self.sizes)}
        scop = build_scop(state.fn, sizes, state.ctx)
        deps = compute_dependences(scop)
        schedule = state.schedule
        if schedule is not None:
            schedule = schedule.intersect_domain(scop.domain)
        return dataclasses.replace(state, scop=scop, deps=deps, schedule=schedule, sizes=sizes)

