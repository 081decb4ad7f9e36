"""Computing a schedule tree with isl's scheduler under TC's fusion strategies.

TC (``tc/core/polyhedral/scop.cc``) runs isl's incremental scheduler with merge callbacks that
decide fusion; islpy exposes no merge callback, so each strategy is the isl option set that
gives the same decisions on TC programs:

====================  ======================================================================
``max``               ``schedule_whole_component=1`` (schedule each dependence component at
                      once: fuse everything that can share outer loops), ``serialize_sccs=0``
``preserve3coincident`` ``whole_component=0`` (clustering), ``maximize_coincidence=1``: two
                      clusters merge only when the merged band keeps its coincident (parallel)
                      dimensions, ``serialize_sccs=0``
``min``               ``serialize_sccs=1``: every strongly connected component (statement)
                      gets its own loop nest
====================  ======================================================================

TC's ``allow_skewing=false`` and ``positive_orthant=true`` are options of TC's isl fork
(``schedule_unit_max_var_coefficient_sum``, ``schedule_nonneg_var_coefficient``) that upstream
isl (and so islpy) lacks. Here they are checked on the result: with ``skew=false`` no band
member of a statement may combine two of its dimensions (``i + j``), with
``positive_orthant=true`` no coefficient of a statement dimension may be negative (no loop
reversal). A result that breaks them is recomputed with ``min`` fusion (each statement alone:
isl then has no reason to skew or reverse), and as a last resort the original program order is
used (always legal, never skewed or reversed). (Adding validity edges ``S[x] -> S[x + e_d]``
would force non-negative coefficients too, but it makes isl encode fusion as parametric shifts
instead of sequences, which TC does not do.)

isl options are per context: they are set right before every ``compute_schedule``.

``sequence_at`` (statement positions) cuts the program into groups scheduled one after the
other, never fused across a cut: under ``max`` fusion the `split-k` folds start a group
(`passes.schedule`). A fold reads ``P(s*M + m, n)`` for every chunk ``s``, and with ``max``
fusion isl searched for a schedule fusing it with the partial sums, with unbounded
coefficients, for minutes on a 96-row matmul split 4 ways (a tuner candidate that timed
out); the two are separate kernels anyway.
"""

from __future__ import annotations

import bisect
from collections.abc import Sequence

import islpy as isl

from ..affine import domain_guard
from .deps import Dependences, compute_dependences
from .scop import Scop, build_scop
from .tree import bands

__all__ = ["FUSION_STRATEGIES", "band_members", "compute_schedule", "has_negative_coefficient",
           "is_skewed"]

FUSION_STRATEGIES = ("max", "preserve3coincident", "min")

_OPTIONS = {
    "max": dict(whole_component=1, serialize_sccs=0, maximize_coincidence=0),
    "preserve3coincident": dict(whole_component=0, serialize_sccs=0, maximize_coincidence=1),
    "min": dict(whole_component=0, serialize_sccs=1, maximize_coincidence=1),
}


def compute_schedule(scop: Scop, deps: Dependences, fusion: str = "max", skew: bool = False,
                     positive_orthant: bool = True,
                     sequence_at: Sequence[int] = ()) -> isl.Schedule:
    """A schedule tree for ``scop`` respecting ``deps.validity`` (see the module docstring);
    ``sequence_at``: positions of statements that start a group scheduled after the previous
    one (program order keeps every dependence between groups legal)."""
    if fusion not in _OPTIONS:
        raise ValueError(f"unknown fusion strategy {fusion!r}")
    if any(domain_guard(st) is not None for st in scop.fn.statements):
        # isl schedules the boxes (the guards' skipped instances made it fuse a `!`
        # initialisation into the reduction's tile band at a padded convolution's border,
        # which register tiling does not take); the guarded domains then filter that tree. Box
        # dependences order every pair of the guarded domains' instances they connect.
        box = build_scop(scop.fn, scop.sizes, scop.ctx, guards=False)
        return _schedule(box, compute_dependences(box), fusion, skew, positive_orthant,
                         sequence_at).intersect_domain(scop.domain)
    return _schedule(scop, deps, fusion, skew, positive_orthant, sequence_at)


def _schedule(scop: Scop, deps: Dependences, fusion: str, skew: bool, positive_orthant: bool,
              sequence_at: Sequence[int]) -> isl.Schedule:
    def acceptable(schedule: isl.Schedule) -> bool:
        return ((skew or not is_skewed(schedule))
                and not (positive_orthant and has_negative_coefficient(schedule)))

    cuts = tuple(sorted(set(sequence_at)))
    schedule = _isl_schedule(scop, deps, fusion, cuts)
    if not acceptable(schedule) and fusion != "min":
        schedule = _isl_schedule(scop, deps, "min", cuts)
    if not acceptable(schedule):
        schedule = original_with_coincidence(scop, deps)
    return schedule


# isl solves one integer program per dependence component, whose (dense) tableau grows with
# the square of the statements in it: 250 statements take 0.2 s, 1000 take 36 s. Longer
# programs are scheduled in consecutive chunks of statements, run in sequence (program order
# keeps every dependence between chunks legal); each chunk is fused as the strategy says.
CHUNK_STATEMENTS = 128
SCHEDULE_WHOLE_UP_TO = 256
# With fixed sizes, unbounded constant terms let isl's integer programs range over shifts as
# large as the sizes: `S(d) +=! X(n, d); O(n, d) = X(n, d) - S(d) / N; M(n) max=! O(n, d)`
# took 0.9 s at 512 x 512 and more than 200 s at 600 x 1024 (a minute-long hang of the GPU
# tests at 600 x 4096). Shifts that fuse (stencil radii) are small, sequencing is a sequence
# node; with this bound the corpus's and the benchmarks' schedules are unchanged (their PTX
# digests, `tools/ptx_digest.py`), and a parametric scop keeps the bound off.
FIXED_SIZE_MAX_CONSTANT = 64


def _isl_schedule(scop: Scop, deps: Dependences, fusion: str,
                  cuts: tuple[int, ...] = ()) -> isl.Schedule:
    ctx = scop.ctx
    for key, value in _OPTIONS[fusion].items():
        getattr(ctx, f"set_schedule_{key}")(value)
    ctx.set_schedule_outer_coincidence(0)
    ctx.set_schedule_max_coefficient(-1)
    ctx.set_schedule_max_constant_term(-1 if scop.sizes is None else FIXED_SIZE_MAX_CONSTANT)
    ctx.set_schedule_carry_self_first(1)
    ctx.set_schedule_algorithm(0)  # ISL_SCHEDULE_ALGORITHM_ISL (Pluto-like)
    whole = len(scop.fn.statements) <= SCHEDULE_WHOLE_UP_TO
    if whole and not cuts:
        return _solve(scop, deps, scop.domain)
    schedule = None
    for chunk in _chunks(scop, cuts, whole):
        part = _solve(scop, deps, chunk)
        schedule = part if schedule is None else schedule.sequence(part)
    assert schedule is not None
    return schedule


def _chunks(scop: Scop, cuts: tuple[int, ...] = (), whole: bool = False) -> list[isl.UnionSet]:
    """The domains of consecutive groups of statements, in program order: cut before each
    position of ``cuts`` and (unless ``whole``) every `CHUNK_STATEMENTS` statements (an
    ``S{k}_init`` stays with its ``S{k}``)."""
    groups: dict[tuple[int, int], isl.UnionSet] = {}
    for name, info in scop.statements.items():
        dom = isl.UnionSet.from_set(scop.domains[name])
        k = (bisect.bisect_right(cuts, info.index), 0 if whole else info.index // CHUNK_STATEMENTS)
        groups[k] = dom if k not in groups else groups[k].union(dom)
    return [groups[k] for k in sorted(groups)]


def _solve(scop: Scop, deps: Dependences, domain: isl.UnionSet) -> isl.Schedule:
    def within(umap: isl.UnionMap) -> isl.UnionMap:
        return umap.intersect_domain(domain).intersect_range(domain)

    sc = (isl.ScheduleConstraints.on_domain(domain)
          .set_context(scop.context)
          .set_validity(within(deps.validity))
          .set_coincidence(within(deps.coincidence))
          .set_proximity(within(deps.proximity)))
    return sc.compute_schedule()


def band_members(node: isl.ScheduleNode) -> list[list[isl.Aff]]:
    """For each member of a band node, the affine pieces of its partial schedule."""
    mupa = node.band_get_partial_schedule()
    members = []
    for m in range(mupa.dim(isl.dim_type.out)):
        pieces: list[isl.Aff] = []
        pw_affs: list[isl.PwAff] = []
        mupa.get_at(m).foreach_pw_aff(pw_affs.append)
        for pa in pw_affs:
            pieces.extend(aff for _set, aff in pa.get_pieces())
        members.append(pieces)
    return members


def _coefficients(aff: isl.Aff) -> list[int]:
    return [int(aff.get_coefficient_val(isl.dim_type.in_, d).to_python())
            for d in range(aff.dim(isl.dim_type.in_))]


def is_skewed(schedule: isl.Schedule) -> bool:
    """True if some band member combines two statement dimensions (i + j)."""
    return any(sum(c != 0 for c in _coefficients(aff)) > 1
               for band in bands(schedule) for member in band_members(band) for aff in member)


def has_negative_coefficient(schedule: isl.Schedule) -> bool:
    """True if some band member runs a statement dimension backwards."""
    return any(c < 0 for band in bands(schedule) for member in band_members(band)
               for aff in member for c in _coefficients(aff))


def original_with_coincidence(scop: Scop, deps: Dependences) -> isl.Schedule:
    """The program-order schedule, its band members marked coincident where they are."""
    from .legality import band_is_permutable, member_is_parallel

    def mark(node: isl.ScheduleNode) -> isl.ScheduleNode:
        if node.get_type() != isl.schedule_node_type.band:
            return node
        node = node.band_set_permutable(int(band_is_permutable(node, deps.validity)))
        for m in range(node.band_n_member()):
            node = node.band_member_set_coincident(
                m, int(member_is_parallel(node, m, deps.coincidence)))
        return node

    return scop.schedule.map_schedule_node_bottom_up(mark)
