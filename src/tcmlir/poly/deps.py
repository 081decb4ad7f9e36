"""Dependences of a scop, from isl's dataflow analysis relative to the original schedule.

* RAW (flow): each read's last writer (``UnionAccessInfo.compute_flow``, may-reads included);
* WAW: each write's previous writer of the same element;
* WAR: the reads between a write's previous writer and itself (writes kill older reads), so
  together with WAW every read-before-write ordering is implied.

Reduction dependences are the self-dependences of an update statement ``S{k}`` through its
accumulator ``lhs(lhs indices)`` (same lhs point, another reduction point). They order the
reduction but do not prevent running it in parallel with a proper combine, so they are kept out
of the *coincidence* constraints (as TC does), but stay in *validity* so a sequential schedule
is always legal. A statement whose right-hand side also reads its own tensor gets no
reduction dependences (conservative: every self-dependence is then a real one).
"""

from __future__ import annotations

from dataclasses import dataclass

import islpy as isl

from .. import ir
from .scop import Scop, maps_of

__all__ = ["Dependences", "compute_dependences", "format_dependences"]


@dataclass(frozen=True, eq=False)
class Dependences:
    """Dependence relations (isl union maps from source instance to sink instance)."""

    raw: isl.UnionMap
    war: isl.UnionMap
    waw: isl.UnionMap
    reduction: isl.UnionMap     # the part of raw/war/waw carried by reductions only
    validity: isl.UnionMap      # all of raw, war, waw
    coincidence: isl.UnionMap   # validity minus reduction dependences

    @property
    def proximity(self) -> isl.UnionMap:
        """All dependences (keep producers near consumers)."""
        return self.validity


def compute_dependences(scop: Scop) -> Dependences:
    """RAW, WAR, WAW of ``scop`` relative to ``scop.schedule``, and the reduction subset."""
    sched = scop.schedule
    raw = (isl.UnionAccessInfo.from_sink(scop.all_reads)
           .set_must_source(scop.writes).set_schedule(sched)
           .compute_flow().get_may_dependence())
    waw = (isl.UnionAccessInfo.from_sink(scop.writes)
           .set_must_source(scop.writes).set_schedule(sched)
           .compute_flow().get_may_dependence())
    war = (isl.UnionAccessInfo.from_sink(scop.writes)
           .set_may_source(scop.all_reads).set_kill(scop.writes).set_schedule(sched)
           .compute_flow().get_may_dependence())
    # A statement instance does not depend on itself (its read precedes its write).
    war = war.subtract(scop.domain.identity())
    raw, war, waw = raw.coalesce(), war.coalesce(), waw.coalesce()
    validity = raw.union(war).union(waw).coalesce()
    reduction = validity.intersect(_accumulator_pairs(scop)).coalesce()
    coincidence = validity.subtract(reduction).coalesce()
    return Dependences(raw, war, waw, reduction, validity, coincidence)


def _accumulator_pairs(scop: Scop) -> isl.UnionMap:
    """``S{k}[x] -> S{k}[y]`` with the same lhs point, for reduction updates ``S{k}``."""
    pairs = isl.UnionMap.empty(scop.domain.get_space())
    for name, info in scop.statements.items():
        stmt = scop.fn.statements[info.index]
        if info.is_init or stmt.reduction is None or _reads_own_tensor(stmt):
            continue
        acc = scop.writes.intersect_domain(isl.UnionSet.from_set(scop.domains[name]))
        pairs = pairs.union(acc.apply_range(acc.reverse()))
    return pairs


def _reads_own_tensor(stmt: ir.Statement) -> bool:
    return any(isinstance(e, ir.Read) and e.tensor == stmt.tensor for e in ir.walk(stmt.rhs))


def format_dependences(deps: Dependences, context: isl.Set | None = None) -> str:
    """The ``--stage deps`` text: each kind, one relation per line."""
    lines = []
    for kind in ("raw", "war", "waw", "reduction"):
        umap = getattr(deps, kind)
        lines.append(f"{kind}:")
        maps = maps_of(umap)
        if not maps:
            lines.append("  (none)")
        for m in maps:
            lines.append(f"  {m if context is None else m.gist_params(context)}")
    return "\n".join(lines)
