"""The `split-k` pass: a long reduction cut into chunks that different GPU blocks compute.

A small contraction (``C(m, n) +=! A(m, k) * B(n, k)`` with few output tiles and a long
``k``) launches too few blocks for the GPU while each walks the whole of ``k``. This pass
rewrites every *splittable* statement of the `ir.Function` (below) into partial sums over
``S`` chunks of ``k``, one per value of a new leading index, and a fold::

    C(m, n) +=! A(m, k) * B(n, k)          P(s, m, n) +=! A(m, s * KC + kc) * B(n, s * KC + kc)
      (k in [0, K), m in [0, M))      ->     (s in [0, F), kc in [0, KC))
                                           P(s, m, n) +=! ...the same...            (tail,
                                             (s in [F, F+1), kc in [0, L))           L > 0)
                                           C(m, n) = P(0, m, n) + P(1, m, n) + ...
                                                   + P(S'-1, m, n)

with ``KC = ceil(K / S)`` elements per chunk (rounded up to a multiple of ``align``, at most
``K``: `MappingOptions` passes its k tile, so chunks hold whole tiles; with chunks of 13 under
16-wide tiles isl took minutes proving a tile copy's thread mapping), ``F = K div KC`` full
chunks, ``L = K - F*KC``
elements in the last one and ``S' = F + (L > 0) <= S`` chunks (``K < S``: ``K`` chunks of
one). ``P`` is a new temporary of shape ``(S', M, ...)``, indexed affinely: every access of
the partial statement is an affine function of its indices (an earlier form stacked the
chunks along the rows, ``P(s*M + m, n)`` reading ``A(m2 mod M, (m2 div M)*KC + kc)``, whose
floor divisions made isl's AST generation of a promoted candidate take minutes). The chunk
index is the outer member of the partial statement's band: `tile` leaves it untiled
(`chunk_member_band`: the contraction's tile sizes apply to the members after it, so the same
tile sizes, register tile and shared-memory promotion as the original contraction apply) and
`MappingOptions` gives it a grid dimension of its own (``S'`` times as many blocks). A
remainder chunk is a second statement over its own box (no guard, nothing read outside a
tensor); isl may fuse it with the first. The fold is an elementwise statement (its ``S'``
reads unrolled in one expression, consecutive threads reading consecutive ``n``), so it
fuses with elementwise statements after it (fc's bias and ReLU) into one kernel. Results are
deterministic (no atomics); floating-point sums are associated differently from the
unsplit loop. A ``+=`` without ``!`` keeps its accumulation: the fold is ``C += P(...) + ...``.

A statement is splittable when: its operator is ``+=`` / ``+=!`` with exactly one reduction
index; its lhs indices are distinct and the first ranges from 0; its right-hand side does
not read the tensor it writes and has no gather; the first lhs index and the reduction index
appear only inside tensor indices. `splittable` says which statements are and why not.
The chunk arithmetic needs the sizes, so the pass needs a specialised state (not a parametric
kernel: an `OptionsError`); a program with no splittable statement is an `OptionsError`; a
statement whose reduction has fewer than two elements at these sizes is left alone. Must run
before `schedule` (the scop and dependences are rebuilt from the new function); the runtime
allocates ``P`` from its temporaries (the compiled function's, `api.Kernel.compiled_ir`).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from dataclasses import dataclass

import islpy as isl

from .. import ir as tc
from ..dtypes import DType
from ..errors import OptionsError
from ..poly.scop import sets_of
from ..poly.state import CompileState
from ..poly.tree import node_at, outermost_band_paths, tile_band
from .base import Pass, register
from .register_tile import point_extent

__all__ = ["SplitK", "TileFolds", "chunk_member_band", "chunking", "fold_statements",
           "partial_statements", "split_k", "split_note", "splittable", "splittable_statements"]

_RESERVED = {"_bx", "_by", "_bz", "_tx", "_ty", "_tz"}


@register
@dataclass(frozen=True)
class SplitK(Pass):
    """Cut the reduction of every splittable statement into at most ``ways`` chunks computed
    as a stacked partial contraction, then folded elementwise (see the module docstring).
    Requires no schedule and fixed sizes; any schedule is discarded (run it before
    `schedule`). ``ways=1`` leaves the program alone; ``align``: chunk lengths are multiples
    of it (see `chunking`)."""

    name = "split-k"
    ways: int = 2
    align: int = 1

    def __post_init__(self):
        if self.ways < 1:
            raise ValueError(f"split-k ways must be >= 1, got {self.ways}")
        if self.align < 1:
            raise ValueError(f"split-k align must be >= 1, got {self.align}")

    def run(self, state: CompileState) -> CompileState:
        if self.ways == 1:
            return state
        missing = [s for s in state.fn.sizes if s not in (state.sizes or {})]
        if missing:
            raise OptionsError(f"split_k={self.ways} needs every size fixed ({', '.join(missing)} "
                               "not given); it does not combine with a parametric kernel")
        fn = split_k(state.fn, self.ways, state.sizes, self.align)
        if fn is state.fn:
            return state
        return CompileState.initial(fn, state.sizes, state.ctx)


def splittable(fn: tc.Function, st: tc.Statement) -> str | None:
    """None when ``st`` can be split (see the module docstring), else why not."""
    if st.reduction is not tc.Reduction.ADD:
        return "its operator is not += or +=!"
    if fn.tensor(st.tensor).dtype is DType.BOOL:
        return "it sums booleans"
    if len(st.reduction_indices) != 1:
        return f"it has {len(st.reduction_indices)} reduction indices, not one"
    if not st.lhs or len(set(st.lhs)) != len(st.lhs):
        return "its left-hand side has no index or repeats one"
    if not _is_zero(st.range_of(st.lhs[0]).lo):
        return f"its first index {st.lhs[0]} does not start at 0"
    reads = [x for x in tc.walk(st.rhs) if isinstance(x, tc.Read)]
    if any(r.tensor == st.tensor for r in reads):
        return f"its right-hand side reads {st.tensor}"
    if any(isinstance(x, tc.Read) for r in reads for i in r.indices for x in tc.walk(i)):
        return "it reads through a gather"
    moved = {st.lhs[0], st.reduction_indices[0]}
    if any(isinstance(x, tc.Index) and x.name in moved for x in _value_nodes(st.rhs)):
        return f"it uses {' or '.join(sorted(moved))} as a value, not only as a tensor index"
    return None


def splittable_statements(fn: tc.Function) -> tuple[int, ...]:
    """The positions of the statements of ``fn`` that `split_k` splits."""
    return tuple(k for k, st in enumerate(fn.statements) if splittable(fn, st) is None)


def chunking(extent: int, ways: int, align: int = 1) -> tuple[int, int, int]:
    """``(KC, F, L)`` for a reduction of ``extent`` elements cut into at most ``ways``
    chunks: ``F`` full chunks of ``KC`` elements and a last one of ``L`` (0: none); ``KC``
    rounded up to a multiple of ``align`` (at most ``extent``)."""
    kc = -(-extent // max(1, min(ways, extent)))
    if align > 1:
        kc = min(extent, -(-kc // align) * align)
    full = extent // kc
    return kc, full, extent - full * kc


def split_k(fn: tc.Function, ways: int, sizes: Mapping[str, int], align: int = 1) -> tc.Function:
    """``fn`` with every splittable statement split into at most ``ways`` chunks at
    ``sizes`` (the same object when nothing is split: ``ways`` 1, or every splittable
    reduction shorter than 2); an `OptionsError` when ``fn`` has no splittable statement."""
    if ways < 1:
        raise OptionsError(f"split_k must be >= 1, got {ways}")
    if ways == 1:
        return fn
    targets = splittable_statements(fn)
    if not targets:
        why = "; ".join(f"S{k} ({st.tensor}): {splittable(fn, st)}"
                        for k, st in enumerate(fn.statements)) or "it has no statement"
        raise OptionsError(f"split_k={ways}: {fn.name} has no reduction to split (split-K "
                           f"needs a += statement with one reduction index); {why}")
    taken = {t.name for t in fn.tensors} | set(fn.sizes)
    statements: list[tc.Statement] = []
    temporaries = list(fn.temporaries)
    for k, st in enumerate(fn.statements):
        split = _split(fn, st, ways, sizes, taken, align) if k in targets else None
        if split is None:
            statements.append(st)
            continue
        partial, parts = split
        temporaries.append(partial)
        taken.add(partial.name)
        statements.extend(parts)
    if len(statements) == len(fn.statements):
        return fn
    return dataclasses.replace(fn, statements=tuple(statements), temporaries=tuple(temporaries))


def split_note(fn: tc.Function, pipeline: str, sizes: Mapping[str, int] | None) -> str | None:
    """What the dump's ``ir`` stage adds for a ``pipeline`` with `split-k`: the function the
    later passes compile (None without split-k)."""
    from .pipeline import parse_pipeline

    passes = [p for p in parse_pipeline(pipeline) if isinstance(p, SplitK) and p.ways > 1]
    if not passes:
        return None
    first = passes[0]
    name = f"split-k{{ways={first.ways}" + (f",align={first.align}}}" if first.align > 1 else "}")
    missing = [s for s in fn.sizes if s not in (sizes or {})]
    if missing:
        return (f"{name} rewrites the program at fixed sizes: give "
                f"{', '.join(missing)} with --sizes to see it")
    return f"after {name}:\n{split_k(fn, first.ways, sizes or {}, first.align)}".rstrip()


def _split(fn: tc.Function, st: tc.Statement, ways: int, sizes: Mapping[str, int],
           taken: set[str], align: int = 1) -> tuple[tc.Tensor, list[tc.Statement]] | None:
    red, row = st.reduction_indices[0], st.lhs[0]
    rng = st.range_of(red)
    lo = rng.lo.evaluate(sizes)
    extent = rng.hi.evaluate(sizes) - lo
    height = st.range_of(row).hi.evaluate(sizes)
    if extent < 2 or height < 1:
        return None
    kc, full, last = chunking(extent, ways, align)
    chunks = full + (last > 0)
    names = taken | set(st.index_names) | _RESERVED
    chunk = tc.fresh_name(f"{red}_s", names)
    red2 = tc.fresh_name(f"{red}_c", names | {chunk})
    out = fn.tensor(st.tensor)
    partial = tc.Tensor(tc.fresh_name(f"{st.tensor}_split", taken), out.dtype.compute,
                        (tc.SizeExpr.constant(chunks), *(st.range_of(i).hi for i in st.lhs)),
                        tc.Role.TEMP, out.span)

    def index(op: str, a: tc.Expr, b: tc.Expr) -> tc.Expr:
        return tc.Binary(op, a, b, DType.INT32)

    def const(v: int) -> tc.Expr:
        return tc.Const(v, DType.INT32)

    start = index("*", tc.Index(chunk), const(kc))
    if lo:
        start = index("+", const(lo), start)
    rhs = tc.replace_indices(st.rhs, lambda i: index("+", start, tc.Index(red2))
                             if i.name == red else i)
    lhs_ranges = tuple(st.range_of(i) for i in st.lhs)

    def part(first: int, stop: int, length: int) -> tc.Statement:
        ranges = (tc.IndexRange(chunk, tc.SizeExpr.constant(first), tc.SizeExpr.constant(stop)),
                  *lhs_ranges, tc.IndexRange(red2, tc.SizeExpr.constant(0),
                                             tc.SizeExpr.constant(length)))
        return tc.Statement(partial.name, (chunk, *st.lhs), tc.Reduction.ADD, True, rhs,
                            ranges, st.span)

    parts = [part(0, full, kc)] + ([part(full, full + 1, last)] if last else [])
    total: tc.Expr | None = None
    for s in range(chunks):
        rd = tc.Read(partial.name, (const(s), *(tc.Index(i) for i in st.lhs)),
                     partial.dtype.compute, st.span)
        total = rd if total is None else tc.Binary("+", total, rd, rd.dtype, st.span)
    assert total is not None
    fold = tc.Statement(st.tensor, st.lhs, None if st.init else tc.Reduction.ADD, False, total,
                        lhs_ranges, st.span)
    return partial, [*parts, fold]


@register
@dataclass(frozen=True)
class TileFolds(Pass):
    """Re-tile each top-level group that holds a split-k fold and only elementwise statements
    (the fold, fc's bias and ReLU) with ``sizes`` (aligned to the innermost band members),
    replacing the tiling `tile` gave it. The contraction's tiles, which suit the partial sums,
    would leave the fold with as few blocks as the unsplit contraction had; with ``sizes``
    equal to the thread block (`MappingOptions.to_pipeline` passes it) each thread of the
    fold folds one element and the grid has a block per ``sizes`` tile. Runs after `tile`:
    the group's band is rebuilt from its tile and point bands (``u = size * tile + point``,
    the size read from the point band's extent) and tiled again. Groups whose tile band and
    point band differ in members (an untiled member) are left alone."""

    name = "tile-folds"
    requires_schedule = True
    sizes: tuple[int, ...] = (16, 16)

    def __post_init__(self):
        if not self.sizes or any(s < 1 for s in self.sizes):
            raise ValueError(f"tile-folds sizes must be >= 1, got {self.sizes}")

    def run(self, state: CompileState) -> CompileState:
        schedule = state.schedule
        assert schedule is not None
        folds = {f"S{k}" for k in fold_statements(state.fn)}
        if not folds:
            return state
        elementwise = {f"S{k}" for k, st in enumerate(state.fn.statements)
                       if not st.reduction_indices}
        for path in reversed(outermost_band_paths(schedule)):
            tile = node_at(schedule, path)
            names = {s.get_tuple_name() for s in sets_of(tile.get_domain())}
            names = {n.removesuffix("_init") for n in names}
            if not names & folds or not names <= elementwise:
                continue
            band = _untile(tile)
            if band is not None:
                n = band.band_n_member()
                sizes = (0,) * max(0, n - len(self.sizes)) + self.sizes[-n:]
                schedule = tile_band(band, sizes).get_schedule()
        return dataclasses.replace(state, schedule=schedule)


def fold_statements(fn: tc.Function) -> tuple[int, ...]:
    """The positions of the split-k folds of ``fn``: elementwise statements that read a
    temporary `split_k` made for their tensor (named ``<tensor>_split``)."""
    temps = {t.name for t in fn.temporaries}
    out = []
    for k, st in enumerate(fn.statements):
        if st.reduction_indices:
            continue
        reads = {x.tensor for x in tc.walk(st.rhs) if isinstance(x, tc.Read)}
        if any(r in temps and r.startswith(f"{st.tensor}_split") for r in reads):
            out.append(k)
    return tuple(out)


def partial_statements(fn: tc.Function) -> tuple[int, ...]:
    """The positions of the split-k partial sums of ``fn``: the statements that write a
    temporary a fold (`fold_statements`) reads."""
    temps = {t.name for t in fn.temporaries}
    read: set[str] = set()
    for k in fold_statements(fn):
        read |= {x.tensor for x in tc.walk(fn.statements[k].rhs)
                 if isinstance(x, tc.Read) and x.tensor in temps}
    return tuple(k for k, st in enumerate(fn.statements) if st.tensor in read)


def chunk_member_band(band: isl.ScheduleNode, fn: tc.Function) -> bool:
    """Whether ``band`` schedules only split-k partial sums (`partial_statements`, and their
    initialisations) and its first member is their chunk index (their first dimension): `tile`
    leaves that member untiled and tiles the members after it with the contraction's sizes."""
    partial = {f"S{k}" for k in partial_statements(fn)}
    if not partial or band.band_n_member() < 2:
        return False
    first = isl.UnionMap.from_union_pw_aff(band.band_get_partial_schedule().get_at(0))
    for inst in sets_of(band.get_domain()):
        if inst.get_tuple_name().removesuffix("_init") not in partial:
            return False
        var = isl.Aff.var_on_domain(isl.LocalSpace.from_space(inst.get_space()),
                                    isl.dim_type.set, 0)
        want = isl.UnionMap.from_map(isl.Map.from_pw_aff(isl.PwAff.from_aff(var))
                                     .intersect_domain(inst))
        got = first.intersect_domain(isl.UnionSet.from_set(inst))
        want = want.align_params(got.get_space())
        if not got.align_params(want.get_space()).is_equal(want):
            return False
    return True


def _untile(tile: isl.ScheduleNode) -> isl.ScheduleNode | None:
    """Band ``tile`` and the point band below it merged back into the band they tiled."""
    band = isl.schedule_node_type.band
    if tile.n_children() != 1 or tile.child(0).get_type() != band:
        return None
    point = tile.child(0)
    n = tile.band_n_member()
    if point.band_n_member() != n:
        return None
    ctx = tile.get_ctx()
    outer, inner = tile.band_get_partial_schedule(), point.band_get_partial_schedule()
    lst = isl.UnionPwAffList.alloc(ctx, n)
    for i in range(n):
        size = point_extent(point, i)
        if size is None:
            return None
        val = isl.Val.int_from_si(ctx, size)
        u = outer.get_at(i).scale_val(val).add(inner.get_at(i))
        if not (_same(u.scale_down_val(val).floor(), outer.get_at(i))
                and _same(u.mod_val(val), inner.get_at(i))):
            return None  # not a tile band over its point band
        lst = lst.add(u)
    space = isl.Space.set_alloc(ctx, 0, n).align_params(outer.get_space().params())
    mupa = isl.MultiUnionPwAff.from_union_pw_aff_list(space, lst)
    permutable = tile.band_get_permutable()
    coincident = [tile.band_member_get_coincident(i) for i in range(n)]
    node = tile.delete().delete().insert_partial_schedule(mupa)
    node = node.band_set_permutable(permutable)
    for i, c in enumerate(coincident):
        node = node.band_member_set_coincident(i, c)
    return node


def _same(a: isl.UnionPwAff, b: isl.UnionPwAff) -> bool:
    return isl.UnionMap.from_union_pw_aff(a).is_equal(isl.UnionMap.from_union_pw_aff(b))


def _is_zero(e: tc.SizeExpr) -> bool:
    try:
        return e.evaluate({}) == 0
    except (KeyError, ValueError):  # depends on a size (or is undefined somewhere)
        return False


def _value_nodes(e: tc.Expr):
    """The nodes of ``e`` evaluated as values (everything outside tensor indices)."""
    yield e
    if isinstance(e, tc.Read):
        return
    for c in tc.children(e):
        yield from _value_nodes(c)
