"""Loops LLVM unrolls instead of isl (issue 31): register tiles and unrolled strips stay loops.

The passes ask isl to unroll a band by setting its members' AST loop type to ``unroll``
(`register-tile`'s register part, `unroll`'s strips, promotion's copies). isl then generates
one user node per iteration (an 8x8 register tile below a 16-step strip: 1024 calls of the
statement), and the AST build, the buffer access expressions of each call and the LLVM IR walk
all pay per node. For the bands of a GPU kernel that run only the program's own statements
(``S<k>``, ``S<k>_init``) directly below the ``kernel`` mark (no reduction, rows or mma mark
between), `for_llvm` instead gives those members the default loop type and puts a mark
``unroll`` (`UNROLL_MARK`) above the band: isl generates ordinary loops, and the code generator
(`codegen.lower`) emits each loop under such a mark as an LLVM loop with
``llvm.loop.unroll.full`` metadata, which LLVM's full unroller honours when it knows the trip
count. `poly.loops.build_ast` keeps a band as loops only when every loop under its ``unroll``
mark has a constant trip count (`trip_count`: constant step, ``it <= e`` / ``it < e`` with
``e - init`` a constant) and no ``if`` lies below the mark (`irregular_unroll_marks`), so that
the unrolled code is straight-line with constant register indices as isl's would be; the
other bands are unrolled by isl, as before (the AST is built again without them).

Bands of register copies (``cpin``/``cpout``/``cpinit`` of a ``_reg`` buffer) convert too,
their members first shifted to start at 0 at each prefix (`_from_zero`: they iterate over the
tensor's coordinates, from the thread's first element) and an interleaved tile's member split
into its groups and lanes (`_split_groups`), so that their loops are those of the register tile
and LLVM's unrolled copies index the registers by constants. Shared-memory copies, whose loops
start at thread-dependent positions with guards isl resolves per iteration, keep isl's
unrolling.
"""

from __future__ import annotations

import re
from collections.abc import Collection, Mapping

import islpy as isl

from .ast_annotation import annotation_of
from .scop import sets_of
from .tree import node_at

__all__ = ["PARTIAL_MARK", "UNROLLED_MARKS", "UNROLL_MARK", "WALK_MARK", "for_llvm",
           "indexes_registers", "irregular_unroll_marks", "trip_bound", "trip_count",
           "unrolled_calls"]

UNROLL_MARK = "unroll"
WALK_MARK = "unroll-walk"
# the partial tiles of an ``unroll`` mark's band (`poly.partial_tiles`): loops with a constant
# largest trip count (`trip_bound`), guards allowed
PARTIAL_MARK = "unroll-partial"
UNROLLED_MARKS = (UNROLL_MARK, WALK_MARK, PARTIAL_MARK)
# marks of row kernels (`map-rows`, `map-reduction`, `map-columns`) whose code generators
# (`codegen.gpu_rows`, `gpu_reduce`) take the unrolled iterations one by one: their bands get
# a `WALK_MARK`, whose loops the code generator unrolls itself
_ROW_MARK = re.compile(r"(rows |reduction |accumulate S\d+(,S\d+)* atomic$)")
_BAND = isl.schedule_node_type.band
_MARK = isl.schedule_node_type.mark
_OWN = re.compile(r"S\d+(_init)?$")
_REG_COPY = re.compile(r"cp(in|out|init)_(\w+)_reg\d+$")
_T = isl.ast_expr_op_type


def _convertible(band: isl.ScheduleNode, ranks: Mapping[str, int]) -> str | None:
    """``"own"`` for a band isl would unroll whole, in a kernel, below no mark but the
    kernel's, that runs the program's own statements only; ``"copy"`` for such a band of
    register copies (of tensors in ``ranks``); ``"walk"`` for a band of the program's
    statements in a row kernel (below ``rows``, ``reduction`` or ``accumulate`` marks, not
    ``over-rows``); else None."""
    n = band.band_n_member()
    if n == 0 or any(band.band_member_get_ast_loop_type(m) != isl.ast_loop_type.unroll
                     for m in range(n)):
        return None
    in_kernel = in_rows = False
    for k in range(1, band.get_tree_depth() + 1):
        up = band.ancestor(k)
        if up.get_type() == _MARK:
            name = up.mark_get_id().get_name()
            if _ROW_MARK.match(name):
                in_rows = True
            elif not name.startswith("kernel "):
                return None
            else:
                in_kernel = True
    if not in_kernel:
        return None
    # (the statements the band schedules: below extension nodes isl has no node domain)
    names = [s.get_tuple_name() for s in sets_of(band.band_get_partial_schedule().domain())]
    if names and all(_OWN.match(name) for name in names):
        return "walk" if in_rows else "own"
    if in_rows:
        return None
    copies = [_REG_COPY.match(name) for name in names]
    if names and all(c is not None and c.group(2) in ranks for c in copies):
        return "copy"
    return None


def _from_zero(band: isl.ScheduleNode, ranks: Mapping[str, int]) -> isl.ScheduleNode:
    """Register-copy band ``band`` with each member shifted by its least value over the copied
    box at the same prefix (a copy statement's dims: the prefix schedule, then the tensor's
    element indices), so its loops start at 0 like the register tile's: the copies of one
    thread's registers are independent, and a shift by prefix values keeps their order."""
    mupa = band.band_get_partial_schedule()
    members: list[isl.UnionPwAff] = []
    for m in range(band.band_n_member()):
        parts = []
        for pa in _pw_affs(mupa.get_at(m)):
            space = pa.get_domain_space()
            name = space.get_tuple_name(isl.dim_type.set)
            rank = ranks[_REG_COPY.match(name).group(2)]  # type: ignore[union-attr]
            npre = space.dim(isl.dim_type.set) - rank
            per_prefix = isl.Map.from_pw_aff(pa).project_out(isl.dim_type.in_, npre, rank)
            least = per_prefix.lexmin_pw_multi_aff().get_pw_aff(0)
            least = least.insert_dims(isl.dim_type.in_, npre, rank).set_tuple_id(
                isl.dim_type.in_, space.get_tuple_id(isl.dim_type.set))
            parts.append(pa.sub(least.intersect_domain(pa.domain())))
        upa = isl.UnionPwAff.from_pw_aff(parts[0])
        for pa in parts[1:]:
            upa = upa.union_add(isl.UnionPwAff.from_pw_aff(pa))
        members.extend(_split_groups(upa))
    ctx = band.get_ctx()
    space = isl.Space.set_alloc(ctx, 0, len(members)).align_params(mupa.get_space().params())
    lst = isl.UnionPwAffList.alloc(ctx, len(members))
    for u in members:
        lst = lst.add(u)
    return band.delete().insert_partial_schedule(
        isl.MultiUnionPwAff.from_union_pw_aff_list(space, lst))


def _split_groups(upa: isl.UnionPwAff) -> list[isl.UnionPwAff]:
    """``[upa]``, or ``[floor(upa / S), upa mod S]`` (the same order) when its values are
    ``G`` groups of ``V`` consecutive values ``S`` apart (an interleaved register tile's
    columns, `register-tile`'s ``interleave``: ``{0..3, 64..67}``): two loops of constant trip
    counts instead of one over ``0 .. S+V-1`` with a guard."""
    values = isl.UnionMap.from_union_pw_aff(upa).range()
    sets = sets_of(values)
    if len(sets) != 1:
        return [upa]
    # (the values over every parameter value: the split keeps the order of any values, and
    # the loops it gives are checked like the others, `irregular_unroll_marks`)
    free = sets[0].project_out(isl.dim_type.param, 0, sets[0].dim(isl.dim_type.param))
    if not free.is_bounded():
        return [upa]
    points: list[int] = []
    lo, hi = free.dim_min_val(0), free.dim_max_val(0)
    if not (lo.is_int() and hi.is_int()) or int(hi.to_python()) - int(lo.to_python()) > 4096:
        return [upa]
    free.foreach_point(lambda p: points.append(int(p.get_coordinate_val(isl.dim_type.set, 0)
                                                   .to_python())))
    points.sort()
    width = next((i for i in range(1, len(points)) if points[i] != points[i - 1] + 1),
                 len(points))
    if width == len(points) or points[0] != 0 or len(points) % width:
        return [upa]
    span = points[width]
    want = [g * span + v for g in range(len(points) // width) for v in range(width)]
    if points != want:
        return [upa]
    ctx = upa.get_ctx()
    s = isl.Val.int_from_si(ctx, span)
    return [upa.scale_down_val(s).floor(), upa.mod_val(s)]


def _pw_affs(upa: isl.UnionPwAff) -> list[isl.PwAff]:
    out: list[isl.PwAff] = []
    upa.foreach_pw_aff(out.append)
    return out


def for_llvm(schedule: isl.Schedule, ranks: Mapping[str, int] | None = None,
             keep: frozenset[tuple[int, ...]] = frozenset()
             ) -> tuple[isl.Schedule, list[tuple[int, ...]]]:
    """``schedule`` with each convertible band (module docstring) but those at the paths in
    ``keep`` given default loop types under an ``unroll`` mark (whose id's user object is the
    band's path), and the paths of the bands changed. ``ranks``: the tensors' ranks (register
    copies of the tensors named there count, their members shifted to start at 0)."""
    ranks = ranks or {}
    found: list[tuple[tuple[int, ...], str]] = []

    def visit(node: isl.ScheduleNode, path: tuple[int, ...]) -> None:  # (no isl callback)
        if node.get_type() == _BAND and path not in keep:
            kind = _convertible(node, ranks)
            if kind is not None:
                found.append((path, kind))
        for i in range(node.n_children()):
            visit(node.child(i), (*path, i))

    visit(schedule.get_root(), ())
    ctx = schedule.get_ctx()
    for path, kind in sorted(found, key=lambda f: len(f[0]), reverse=True):  # deepest first
        node = node_at(schedule, path)
        if kind == "copy":
            node = _from_zero(node, ranks)
        for m in range(node.band_n_member()):
            node = node.band_member_set_ast_loop_type(m, isl.ast_loop_type.default)
        mark = WALK_MARK if kind == "walk" else UNROLL_MARK
        schedule = node.insert_mark(isl.Id(mark, user=path, context=ctx)).get_schedule()
    return schedule, [path for path, _ in found]


def _affine(e: isl.AstExpr) -> dict[str, int] | None:
    """``e`` as {name: coefficient, "": constant} when it is affine in its ids, else None."""
    kind = e.get_type()
    if kind == isl.ast_expr_type.int:
        return {"": int(e.get_val().to_python())}
    if kind == isl.ast_expr_type.id:
        return {e.get_id().get_name(): 1}
    op = e.get_op_type()
    args = [_affine(e.get_op_arg(i)) for i in range(e.get_op_n_arg())]
    if any(a is None for a in args):
        return None
    if op == _T.minus:
        return {k: -v for k, v in args[0].items()}
    if op in (_T.add, _T.sub):
        out = dict(args[0])
        for k, v in args[1].items():
            out[k] = out.get(k, 0) + (v if op == _T.add else -v)
        return out
    if op == _T.mul:
        a, b = args
        if set(a) == {""}:
            a, b = b, a
        if set(b) == {""}:
            return {k: v * b[""] for k, v in a.items()}
    return None


def _loop_parts(loop: isl.AstNode) -> tuple[str, int, dict[str, int], list[isl.AstExpr], bool] | None:
    """(iterator, step, affine init, upper bound expressions, inclusive) of isl AST for-node
    ``loop`` when its step is a positive constant, its start affine and its condition
    ``it <= e`` / ``it < e`` with ``e`` an expression or a ``min`` of several (the iterator
    below every one of them), else None."""
    it = loop.for_get_iterator().get_id().get_name()
    inc = loop.for_get_inc()
    cond = loop.for_get_cond()
    if inc.get_type() != isl.ast_expr_type.int or cond.get_type() != isl.ast_expr_type.op:
        return None
    step = int(inc.get_val().to_python())
    if step < 1 or cond.get_op_type() not in (_T.le, _T.lt):
        return None
    lhs = cond.get_op_arg(0)
    if lhs.get_type() != isl.ast_expr_type.id or lhs.get_id().get_name() != it:
        return None
    init = _affine(loop.for_get_init())
    if init is None or it in init:
        return None
    bound = cond.get_op_arg(1)
    arms = ([bound.get_op_arg(i) for i in range(bound.get_op_n_arg())]
            if bound.get_type() == isl.ast_expr_type.op and bound.get_op_type() == _T.min
            else [bound])
    return it, step, init, arms, cond.get_op_type() == _T.le


def _trips(init: dict[str, int], arm: isl.AstExpr, it: str, step: int, inclusive: bool
           ) -> int | None:
    """The iterations from ``init`` while the iterator stays below ``arm``, when constant."""
    bound = _affine(arm)
    if bound is None or it in bound:
        return None
    diff = dict(bound)
    for k, v in init.items():
        diff[k] = diff.get(k, 0) - v
    if any(v for k, v in diff.items() if k):
        return None
    span = diff.get("", 0) + (1 if inclusive else 0)  # values init .. init+span-1
    return max(0, -(-span // step))


def trip_count(loop: isl.AstNode) -> int | None:
    """The number of iterations of isl AST for-node ``loop`` when it is the same constant for
    every value of the names in its bounds, else None."""
    parts = _loop_parts(loop)
    if parts is None:
        return None
    it, step, init, arms, inclusive = parts
    if len(arms) != 1:
        return None
    return _trips(init, arms[0], it, step, inclusive)


def trip_bound(loop: isl.AstNode) -> int | None:
    """The largest number of iterations of isl AST for-node ``loop`` when it is a constant:
    its start is affine and a term of its ``min`` upper bound is the start plus a constant (a
    partial tile: ``for (c = 0; c <= min(7, M - 8 * _ty - 1); c += 1)`` runs at most 8
    times); else None."""
    parts = _loop_parts(loop)
    if parts is None:
        return None
    it, step, init, arms, inclusive = parts
    trips = [t for t in (_trips(init, arm, it, step, inclusive) for arm in arms) if t is not None]
    return min(trips) if trips else None


def irregular_unroll_marks(ast: isl.AstNode) -> set[tuple[int, ...]]:
    """The band paths of the marks of ``ast`` whose loops the code generator cannot unroll
    as they are: an ``unroll`` mark below which a loop has no constant trip count, an
    ``unroll-partial`` mark below which a loop has no constant largest trip count
    (`trip_bound`), an ``unroll-walk`` mark below which a loop has no constant trip count or
    an ``if`` remains (the row code generators take the iterations one by one). An ``if``
    below an ``unroll`` mark stays a guard in each unrolled copy, as isl's unrolling kept it
    (partial tiles have gone under ``unroll-partial`` marks first, `poly.partial_tiles`:
    what is left are guards of statements that run at some iterations only, the
    initialisation of accumulators kept in memory at the first k step, say); LLVM folds those
    on the unrolled iterators alone."""
    bad: set[tuple[int, ...]] = set()

    def visit(n: isl.AstNode, mark: tuple[int, ...] | None, kind_of: str) -> None:
        kind = n.get_type()                                   # (no isl callback)
        if kind == isl.ast_node_type.mark:
            ident = n.mark_get_id()
            if ident.get_name() in UNROLLED_MARKS:
                mark, kind_of = ident.user, ident.get_name()
            visit(n.mark_get_node(), mark, kind_of)
        elif kind == isl.ast_node_type.for_:
            trips = trip_bound(n) if kind_of == PARTIAL_MARK else trip_count(n)
            if mark is not None and trips is None:
                bad.add(mark)
            visit(n.for_get_body(), mark, kind_of)
        elif kind == isl.ast_node_type.if_:
            if mark is not None and kind_of == WALK_MARK:
                bad.add(mark)
            visit(n.if_get_then_node(), mark, kind_of)
            if n.if_has_else_node():
                visit(n.if_get_else_node(), mark, kind_of)
        elif kind == isl.ast_node_type.block:
            kids = n.block_get_children()
            for i in range(kids.n_ast_node()):
                visit(kids.get_at(i), mark, kind_of)

    visit(ast, None, "")
    return bad


def _names(e: isl.AstExpr) -> set[str]:
    kind = e.get_type()
    if kind == isl.ast_expr_type.id:
        return {e.get_id().get_name()}
    if kind == isl.ast_expr_type.op:
        return set().union(*(_names(e.get_op_arg(i)) for i in range(e.get_op_n_arg())))
    return set()


def indexes_registers(loop: isl.AstNode, registers: Collection[str]) -> bool:
    """Whether a statement in the body of isl AST for-node ``loop`` indexes a buffer named in
    ``registers`` by the loop's iterator (through its `loops.build_ast` annotation): such a
    loop must be unrolled for the registers to be indexed by constants; a partial tile's other
    loops (its k strip) stay loops."""
    it = loop.for_get_iterator().get_id().get_name()
    hit: list[bool] = []

    def visit(n: isl.AstNode) -> bool:
        if n.get_type() == isl.ast_node_type.user:
            payload = annotation_of(n)
            accesses = (payload.values() if isinstance(payload, dict) else
                        [(payload.buffer, payload.local_index)] if payload is not None else [])
            if any(buf in registers and any(it in _names(e) for e in index)
                   for buf, index in accesses):
                hit.append(True)
        return not hit

    loop.for_get_body().foreach_descendant_top_down(visit)
    return bool(hit)


def unrolled_calls(node: isl.AstNode) -> tuple[int, int]:
    """(statement calls, loops) of ``node`` as the code generator emits it: a loop under an
    ``unroll``, ``unroll-walk`` or ``unroll-partial`` mark counts as its (largest) trip count
    times its body (isl would have unrolled it), any other loop once in ``loops``."""

    def visit(n: isl.AstNode, below: bool) -> tuple[int, int]:
        kind = n.get_type()
        if kind == isl.ast_node_type.user:
            return 1, 0
        if kind == isl.ast_node_type.mark:
            return visit(n.mark_get_node(), below or n.mark_get_id().get_name() in UNROLLED_MARKS)
        if kind == isl.ast_node_type.for_:
            calls, loops = visit(n.for_get_body(), below)
            if below:
                return calls * (trip_count(n) or trip_bound(n) or 0), loops
            return calls, loops + 1
        parts = []
        if kind == isl.ast_node_type.if_:
            parts.append(n.if_get_then_node())
            if n.if_has_else_node():
                parts.append(n.if_get_else_node())
        elif kind == isl.ast_node_type.block:
            kids = n.block_get_children()
            parts.extend(kids.get_at(i) for i in range(kids.n_ast_node()))
        counts = [visit(p, below) for p in parts]
        return sum(c for c, _ in counts), sum(lp for _, lp in counts)

    return visit(node, False)
