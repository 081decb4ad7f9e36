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

import bisect
from dataclasses import dataclass

import islpy as isl

from .. import ir
from .scop import Scop, maps_of, union_all

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
    flows = _PerArrayFlow(scop)
    raw = flows.compute(sinks=scop.all_reads, must=scop.writes)
    waw = flows.compute(sinks=scop.writes, must=scop.writes)
    war = flows.compute(sinks=scop.writes, may=scop.all_reads, kill=scop.writes)
    # A statement instance does not depend on itself (its read precedes its write).
    war = war.subtract(scop.domain.identity())
    raw, war, waw = raw.coalesce(), war.coalesce(), waw.coalesce()
    validity = raw.union(war).union(waw).coalesce()
    reduction = validity.intersect(_accumulator_pairs(scop)).coalesce()
    coincidence = validity.subtract(reduction).coalesce()
    return Dependences(raw, war, waw, reduction, validity, coincidence)


# An array that more statements than this access is analysed one sink statement at a time,
# against the sources since the latest statement whose writes (with those after it) cover
# the sink's elements: ``O(i) = A(i)`` a thousand times took 10 s in one analysis of ``O``
# (isl's dataflow is quadratic in the sources); arrays of fewer statements, every corpus
# program's, keep the analysis of the whole array. The search for a covering window stops
# after WINDOW_MOST writing statements (then all earlier sources stay).
WINDOW_FROM = 16
WINDOW_MOST = 64


class _PerArrayFlow:
    """isl's dataflow analysis, one array at a time.

    A dependence only joins accesses of one array, so the analysis of each array alone, over
    the statements that access it, gives the same relation; one call over the whole program
    compares every sink with every source (quadratic in the number of statements)."""

    def __init__(self, scop: Scop):
        self.empty = isl.UnionMap.empty(scop.domain.get_space())
        self.schedule_of: dict[str, isl.Map] = {}
        for m in maps_of(scop.schedule.get_map()):
            self.schedule_of[m.get_tuple_name(isl.dim_type.in_)] = m
        # program order: statements run in sequence, ``S{k}_init`` right before ``S{k}``
        self.position = {name: (info.index, 0 if info.is_init else 1)
                         for name, info in scop.statements.items()}

    @staticmethod
    def _by_array(umap: isl.UnionMap | None) -> dict[str, list[isl.Map]]:
        found: dict[str, list[isl.Map]] = {}
        if umap is not None:
            for m in maps_of(umap):
                found.setdefault(m.get_tuple_name(isl.dim_type.out), []).append(m)
        return found

    def _union(self, maps: list[isl.Map]) -> isl.UnionMap:
        return union_all([isl.UnionMap.from_map(m) for m in maps], self.empty)

    def compute(self, sinks: isl.UnionMap, must: isl.UnionMap | None = None,
                may: isl.UnionMap | None = None, kill: isl.UnionMap | None = None) -> isl.UnionMap:
        parts = [self._by_array(u) for u in (sinks, must, may, kill)]
        results = []  # per array (a running union would copy the growing one each time)
        for array, sink_maps in parts[0].items():
            must_maps, may_maps, kill_maps = (p.get(array, []) for p in parts[1:])
            if not must_maps and not may_maps:
                continue
            statements = {m.get_tuple_name(isl.dim_type.in_)
                          for m in (*sink_maps, *must_maps, *may_maps, *kill_maps)}
            if len(statements) > WINDOW_FROM and (must_maps or kill_maps):
                window = _Windows(self.position, must_maps, may_maps, kill_maps)
                flows = [self._flow(one, *window.sources(one))
                         for one in self._by_statement(sink_maps)]
                results.append(union_all(flows, self.empty))
            else:
                results.append(self._flow(sink_maps, must_maps, may_maps, kill_maps))
        return union_all(results, self.empty)

    def _flow(self, sink_maps: list[isl.Map], must_maps: list[isl.Map],
              may_maps: list[isl.Map], kill_maps: list[isl.Map]) -> isl.UnionMap:
        statements = {m.get_tuple_name(isl.dim_type.in_)
                      for m in (*sink_maps, *must_maps, *may_maps, *kill_maps)}
        schedule = self._union([self.schedule_of[s] for s in sorted(statements)])
        info = isl.UnionAccessInfo.from_sink(self._union(sink_maps))
        if must_maps:
            info = info.set_must_source(self._union(must_maps))
        if may_maps:
            info = info.set_may_source(self._union(may_maps))
        if kill_maps:
            info = info.set_kill(self._union(kill_maps))
        return info.set_schedule_map(schedule).compute_flow().get_may_dependence()

    def _by_statement(self, maps: list[isl.Map]) -> list[list[isl.Map]]:
        found: dict[str, list[isl.Map]] = {}
        for m in maps:
            found.setdefault(m.get_tuple_name(isl.dim_type.in_), []).append(m)
        return [found[name] for name in sorted(found, key=self.position.__getitem__)]



class _Windows:
    """The sources and kills of one array that one sink statement's accesses can depend on:
    those of the statements from the latest one before it at which the writes (must sources
    and kills) of the statements in between cover every element the sink accesses. An access
    before that statement is overwritten before any sink instance runs, so the analysis of
    the window gives the same relation as the analysis of the whole array."""

    def __init__(self, position: dict[str, tuple[int, int]], must_maps: list[isl.Map],
                 may_maps: list[isl.Map], kill_maps: list[isl.Map]):
        self.position = position
        self.maps = {}  # kind -> (positions, maps), in program order
        for kind, maps in (("must", must_maps), ("may", may_maps), ("kill", kill_maps)):
            ordered = sorted(((self.at(m), i) for i, m in enumerate(maps)))
            self.maps[kind] = ([at for at, _ in ordered], [maps[i] for _, i in ordered])
        writers: dict[tuple[int, int], list[isl.Map]] = {}
        for m in (*must_maps, *kill_maps):
            writers.setdefault(self.at(m), []).append(m)
        self.writer_positions = sorted(writers)
        self.written = {at: [m.range() for m in maps] for at, maps in writers.items()}

    def at(self, m: isl.Map) -> tuple[int, int]:
        return self.position[m.get_tuple_name(isl.dim_type.in_)]

    def sources(self, sink_maps: list[isl.Map]
                ) -> tuple[list[isl.Map], list[isl.Map], list[isl.Map]]:
        sink = self.at(sink_maps[0])
        wanted = isl.UnionSet.from_set(sink_maps[0].range())
        for m in sink_maps[1:]:
            wanted = wanted.union(isl.UnionSet.from_set(m.range()))
        start = None
        covered = isl.UnionSet.empty(wanted.get_space())
        earlier = bisect.bisect_left(self.writer_positions, sink)
        for k in range(earlier - 1, max(-1, earlier - 1 - WINDOW_MOST), -1):
            at = self.writer_positions[k]
            for written in self.written[at]:
                covered = covered.union(isl.UnionSet.from_set(written))
            if wanted.is_subset(covered):
                start = at
                break

        def keep(kind: str) -> list[isl.Map]:
            positions, maps = self.maps[kind]
            first = 0 if start is None else bisect.bisect_left(positions, start)
            return maps[first:bisect.bisect_right(positions, sink)]

        return keep("must"), keep("may"), keep("kill")


def _accumulator_pairs(scop: Scop) -> isl.UnionMap:
    """``S{k}[x] -> S{k}[y]`` with the same lhs point, for reduction updates ``S{k}``."""
    writes: dict[str, list[isl.Map]] = {}
    for m in maps_of(scop.writes):  # by statement once (not the whole relation per statement)
        writes.setdefault(m.get_tuple_name(isl.dim_type.in_), []).append(m)
    pairs = []
    for name, info in scop.statements.items():
        stmt = scop.fn.statements[info.index]
        if info.is_init or stmt.reduction is None or _reads_own_tensor(stmt):
            continue
        for acc in writes.get(name, ()):
            pairs.append(isl.UnionMap.from_map(acc.apply_range(acc.reverse())))
    return union_all(pairs, isl.UnionMap.empty(scop.domain.get_space()))


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
