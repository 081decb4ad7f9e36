"""The state the passes transform: the function, its scop and dependences, the schedule tree.

Passes are pure: each takes a `CompileState` and returns a new one (`dataclasses.replace`).
Every isl object of a state lives in ``scop.ctx``.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

import islpy as isl

from .. import ir
from ..log import timed
from .deps import Dependences, compute_dependences
from .promotion import Promotion
from .scop import Scop, build_scop

__all__ = ["CompileState"]


@dataclass(frozen=True, eq=False)
class CompileState:
    """``fn`` modelled as ``scop`` with ``deps``; ``schedule`` is None until `schedule` runs.

    ``sizes`` are the size values fixed so far (None: fully parametric). After a promotion
    pass, ``schedule`` holds copy statements and barriers in extension nodes, ``base_schedule``
    the tree of the original statements alone (where legality and coverage are proved: isl
    computes no schedule map for trees with extensions) and ``promotion`` the buffers.
    """

    fn: ir.Function
    scop: Scop
    deps: Dependences
    schedule: isl.Schedule | None = None
    sizes: Mapping[str, int] | None = None
    base_schedule: isl.Schedule | None = None
    promotion: Promotion | None = None

    @property
    def proof_schedule(self) -> isl.Schedule | None:
        """The tree whose schedule map isl can compute: the original statements' schedule."""
        return self.base_schedule if self.base_schedule is not None else self.schedule

    @classmethod
    def initial(cls, fn: ir.Function, sizes: Mapping[str, int] | None = None,
                ctx: isl.Context | None = None) -> CompileState:
        """The state before any pass: the scop of ``fn`` (specialised to ``sizes``) and deps."""
        with timed("scop"):
            scop = build_scop(fn, sizes, ctx)
            deps = compute_dependences(scop)
        return cls(fn, scop, deps, None, None if sizes is None else dict(sizes))

    @property
    def ctx(self) -> isl.Context:
        return self.scop.ctx
