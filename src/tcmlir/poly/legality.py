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

__all__ = ["band_is_permutable", "check_legal", "member_is_parallel", "violations"]


def violations(schedule: isl.Schedule, validity: isl.UnionMap) -> isl.UnionMap:
    """The dependences of ``validity`` that ``schedule`` does not run source-before-sink."""
    sched = schedule.get_map()
    domain = schedule.get_domain()
    deps = validity.intersect_domain(domain).intersect_range(domain)
    times = deps.apply_domain(sched).apply_range(sched)
    bad = isl.UnionMap.empty(deps.get_space())
    for m in maps_of(times):
        forward = isl.Map.lex_lt(m.get_space().domain())
        backward = m.subtract(forward)
        if not backward.is_empty():
            # Report the instance pairs, not the time pairs.
            back = isl.UnionMap.from_map(backward)
            bad = bad.union(deps.intersect(
                sched.apply_range(back).apply_range(sched.reverse())))
    return bad


def check_legal(schedule: isl.Schedule, deps) -> None:
    """Raise AssertionError (with the tree) if ``schedule`` breaks a dependence of ``deps``.

    ``deps`` is a `Dependences` (its ``validity`` is checked) or an isl union map.
    """
    validity = deps if isinstance(deps, isl.UnionMap) else deps.validity
    missing = validity.intersect_domain(validity.domain().subtract(schedule.get_domain()))
    assert missing.is_empty(), (
        f"schedule does not cover dependence sources {missing.domain()}\n{schedule}")
    bad = violations(schedule, validity)
    assert bad.is_empty(), (
        f"schedule violates dependences\n  {bad}\nschedule tree:\n{schedule}")


def _active_pairs(node: isl.ScheduleNode, deps: isl.UnionMap) -> isl.UnionMap:
    """Dependences between instances below ``node`` that the outer schedule does not separate."""
    domain = node.get_domain()
    prefix = node.get_prefix_schedule_union_map()
    same_prefix = prefix.apply_range(prefix.reverse())
    return deps.intersect_domain(domain).intersect_range(domain).intersect(same_prefix)


def _member_map(node: isl.ScheduleNode, member: int) -> isl.UnionMap:
    upa = node.band_get_partial_schedule().get_at(member)
    return isl.UnionMap.from_union_pw_aff(upa)


def member_is_parallel(node: isl.ScheduleNode, member: int, deps: isl.UnionMap) -> bool:
    """True if band ``member`` of ``node`` carries none of ``deps`` (the loop may run in parallel).

    Members before ``member`` count as outer loops: dependences they carry are not active.
    """
    pairs = _active_pairs(node, deps)
    for m in range(member):
        mm = _member_map(node, m)
        pairs = pairs.intersect(mm.apply_range(mm.reverse()))
    mm = _member_map(node, member)
    return pairs.is_subset(mm.apply_range(mm.reverse()))


def band_is_permutable(node: isl.ScheduleNode, deps: isl.UnionMap) -> bool:
    """True if every active dependence has a non-negative distance on every band member."""
    pairs = _active_pairs(node, deps)
    if pairs.is_empty():
        return True
    for m in range(node.band_n_member()):
        mm = _member_map(node, m)
        times = pairs.apply_domain(mm).apply_range(mm)
        for t in maps_of(times):
            if not t.subtract(isl.Map.lex_le(t.get_space().domain())).is_empty():
                return False
    return True
