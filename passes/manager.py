"""The pass manager: runs passes in order with callbacks between them (verify, print, time).

    pm = PassManager(parse_pipeline("schedule{fusion=max},tile{sizes=32,32}"),
                     print_after_all=True)
    state = pm.run(CompileState.initial(fn))

After each pass, with ``verify_each`` the schedule tree (if any) is proved to respect every
dependence (`poly.legality.check_legal`; a failure is an internal AssertionError with the tree;
a schedule map and dependences already proved are not proved again),
with ``print_after_all`` the tree is printed in isl syntax (block style, `tcmlir.pretty`),
with ``time_passes`` a table of wall-clock times is printed at the end; extra ``callbacks(pass, state)`` run last.
A precondition that does not hold (a pass that needs a schedule before ``schedule``) is a
`PipelineError` naming the pass.
"""

from __future__ import annotations

import sys
import time
from collections.abc import Callable, Sequence
from typing import TextIO

import islpy as isl

from ..errors import PipelineError
from ..log import timed
from ..poly.legality import check_legal
from ..poly.state import CompileState
from ..pretty import format_schedule
from .base import Pass, format_pass

__all__ = ["Callback", "PassManager"]

Callback = Callable[[Pass, CompileState], None]


class PassManager:
    """Runs ``passes`` on a `CompileState` (see the module docstring)."""

    def __init__(self, passes: Sequence[Pass], *, verify_each: bool = True,
                 print_after_all: bool = False, time_passes: bool = False,
                 out: TextIO | None = None, callbacks: Sequence[Callback] = ()):
        self.passes = tuple(passes)
        self.verify_each = verify_each
        self.print_after_all = print_after_all
        self.time_passes = time_passes
        self.out = out
        self.callbacks = tuple(callbacks)
        self.timings: list[tuple[str, float]] = []

    @property
    def pipeline(self) -> str:
        return ",".join(format_pass(p) for p in self.passes)

    def run(self, state: CompileState) -> CompileState:
        out = self.out if self.out is not None else sys.stderr
        self.timings = []
        proven: tuple[isl.UnionMap, object] | None = None  # (schedule map, deps) last proved
        for p in self.passes:
            if p.requires_schedule and state.schedule is None:
                raise PipelineError(
                    f"pass '{format_pass(p)}' needs a schedule tree: run `schedule` first "
                    f"(pipeline: {self.pipeline})")
            start = time.perf_counter()
            with timed("schedule" if p.name == "schedule" else "passes"):
                state = p.run(state)
            self.timings.append((format_pass(p), time.perf_counter() - start))
            if self.verify_each and state.schedule is not None:
                with timed("verify"):
                    # (a pass that only marks, promotes or sets loop types keeps the order of
                    # the statements' instances: the same schedule map needs no new proof)
                    sched = state.proof_schedule.get_map()
                    if proven is None or proven[1] is not state.deps or not sched.is_equal(proven[0]):
                        check_legal(state.proof_schedule, state.deps, sched)
                        proven = (sched, state.deps)
            if self.print_after_all:
                print(f"// -----// after {format_pass(p)} //----- //", file=out)
                print(format_schedule(state.schedule) if state.schedule is not None
                      else "(no schedule)", file=out)
            for callback in self.callbacks:
                callback(p, state)
        if self.time_passes:
            print(self.format_timings(), file=out)
        return state

    def format_timings(self) -> str:
        total = sum(t for _, t in self.timings) or 1e-12
        width = max([len(n) for n, _ in self.timings] + [4])
        lines = ["===-- pass execution timing --===",
                 f"  {'ms':>9}  {'%':>6}  pass"]
        for name, t in self.timings:
            lines.append(f"  {t * 1e3:9.3f}  {100 * t / total:5.1f}%  {name:<{width}}")
        lines.append(f"  {total * 1e3:9.3f}  100.0%  total")
        return "\n".join(lines)
