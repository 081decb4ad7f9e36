"""Proofs (by isl, not by sampling) about a schedule tree and the dependences of its scop.

* `check_legal`: every validity dependence goes forward in time: the pairs (source time, sink
  time) obtained by mapping the dependences through ``schedule.get_map()`` are all
  lexicographically increasing. The pass manager calls it after each pass.
* `member_is_parallel`: a band member carries no dependence (among the instances below the
  band, the dependences between instances with equal outer schedule have distance 0 there).
* `band_is_permutable`: every dependence not carried outside the band has a non-negative
  distance on every member (the band may be tiled / interchanged).
"""

from __future__ import annotations

import islpy as isl

from .scop import maps_of

__all__ = ["band_is_permutable", "check_legal", "member_is_parallel", "same_prefix",
           "violations"]


def violations(schedule: isl.Schedule, validity: isl.UnionMap,
               sched: isl.UnionMap | None = None) -> isl.UnionMap:
    """The dependences of ``validity`` that ``schedule`` does not run source-before-sink
    (``sched``: its schedule map, when the caller has it).

    Each dependence map (one statement to another) goes through the two statements' own
    schedule maps, so the work is linear in the number of dependence maps."""
    sched = schedule.get_map() if sched is None else sched
    of = {m.get_tuple_name(isl.dim_type.in_): m for m in maps_of(sched)}
    deps = validity.intersect_domain(schedule.get_domain()).intersect_range(schedule.get_domain())
    bad = isl.UnionMap.empty(deps.get_space())
    for dep in maps_of(deps):
        src = of.get(dep.get_tuple_name(isl.dim_type.in_))
        dst = of.get(dep.get_tuple_name(isl.dim_type.out))
        if src is None or dst is None:  # an empty dependence of a statement with no instance
            assert dep.is_empty(), f"dependence {dep} of a statement the schedule lacks"
            continue
        times = dep.apply_domain(src).apply_range(dst)
        backward = times.subtract(isl.Map.lex_lt(times.get_space().domain()))
        if not backward.is_empty():
            # Report the instance pairs, not the time pairs.
            pairs = src.apply_range(backward).apply_range(dst.reverse())
            bad = bad.union(isl.UnionMap.from_map(dep.intersect(pairs)))
    return bad


def check_legal(schedule: isl.Schedule, deps, sched: isl.UnionMap | None = None) -> None:
    """Raise AssertionError (with the tree) if ``schedule`` breaks a dependence of ``deps``.

    ``deps`` is a `Dependences` (its ``validity`` is checked) or an isl union map; ``sched``
    is ``schedule.get_map()`` when the caller has it.
    """
    validity = deps if isinstance(deps, isl.UnionMap) else deps.validity
    missing = validity.intersect_domain(validity.domain().subtract(schedule.get_domain()))
    assert missing.is_empty(), (
        f"schedule does not cover dependence sources {missing.domain()}\n{schedule}")
    bad = violations(schedule, validity, sched)
    assert bad.is_empty(), (
        f"schedule violates dependences\n  {bad}\nschedule tree:\n{schedule}")


def _time_pairs(node: isl.ScheduleNode, deps: isl.UnionMap, members: int) -> tuple[list[isl.Map], int]:
    """The dependences between instances below ``node``, as pairs of times: the prefix
    schedule then band members ``0 .. members-1`` of ``node``, flattened into one space
    (one map, or none). Returns the maps and the number of prefix dimensions.

    Mapping into one time space keeps this linear in the number of statements; relating
    instances by ``prefix ∘ prefix⁻¹`` pairs every statement with every other (quadratic).
    """
    domain = node.get_domain()
    prefix = node.get_prefix_schedule_union_map()
    n_prefix = _range_dim(prefix)
    sched = prefix
    partial = node.band_get_partial_schedule()
    for m in range(members):
        sched = sched.flat_range_product(isl.UnionMap.from_union_pw_aff(partial.get_at(m)))
    active = deps.intersect_domain(domain).intersect_range(domain)
    return maps_of(active.apply_domain(sched).apply_range(sched)), n_prefix


def same_prefix(node: isl.ScheduleNode, pairs: isl.UnionMap) -> isl.UnionMap:
    """The pairs of instance pairs ``pairs`` (dependences, say) between instances below
    ``node`` whose outer schedule (``node``'s prefix schedule) is the same.

    Each pair goes to its source's and its sink's prefix time (``[a -> b] -> P(a)`` and
    ``[a -> b] -> P(b)``) and the two are intersected: linear in the maps of ``pairs``, where
    ``pairs ∩ (P ∘ P⁻¹)`` builds every statement pair first (quadratic)."""
    domain = node.get_domain()
    prefix = node.get_prefix_schedule_union_map()
    pairs = pairs.intersect_domain(domain).intersect_range(domain)
    at_source = pairs.domain_map().apply_range(prefix)
    at_sink = pairs.range_map().apply_range(prefix)
    return at_source.intersect(at_sink).domain().unwrap()


def _range_dim(umap: isl.UnionMap) -> int:
    found: list[int] = []
    umap.foreach_map(lambda m: found.append(m.dim(isl.dim_type.out)))
    return found[0] if found else 0


def _equal_upto(times: isl.Map, n: int) -> isl.Map:
    """The pairs of ``times`` whose first ``n`` time dimensions are equal."""
    for i in range(n):
        times = times.equate(isl.dim_type.in_, i, isl.dim_type.out, i)
    return times


def _dimension(times: isl.Map, d: int) -> isl.Map:
    """``times`` projected onto time dimension ``d`` (a map of one dimension to one)."""
    n = times.dim(isl.dim_type.in_)
    for kind in (isl.dim_type.in_, isl.dim_type.out):
        times = times.project_out(kind, d + 1, n - d - 1).project_out(kind, 0, d)
    return times


def member_is_parallel(node: isl.ScheduleNode, member: int, deps: isl.UnionMap) -> bool:
    """True if band ``member`` of ``node`` carries none of ``deps`` (the loop may run in parallel).

    Members before ``member`` count as outer loops: dependences they carry are not active.
    """
    times, n_prefix = _time_pairs(node, deps, member + 1)
    d = n_prefix + member
    for t in times:
        same_outer = _dimension(_equal_upto(t, d), d)
        if not same_outer.is_subset(isl.Map.identity(same_outer.get_space())):
            return False
    return True


def band_is_permutable(node: isl.ScheduleNode, deps: isl.UnionMap) -> bool:
    """True if every active dependence has a non-negative distance on every band member."""
    n_members = node.band_n_member()
    times, n_prefix = _time_pairs(node, deps, n_members)
    for t in times:
        active = _equal_upto(t, n_prefix)
        for m in range(n_members):
            dist = _dimension(active, n_prefix + m)
            if not dist.subtract(isl.Map.lex_le(dist.get_space().domain())).is_empty():
                return False
    return True
