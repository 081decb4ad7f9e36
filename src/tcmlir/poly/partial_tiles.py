"""Full and partial tiles apart, so that LLVM unrolls both without isl unrolling either (issue 31).

`poly.llvm_unroll` keeps a band isl would unroll (a register tile, an unrolled strip, a
register copy) as loops under an ``unroll`` mark only when its loops have constant trip counts
and no ``if`` lies below the mark. At sizes the tiles do not divide, the tiles at the edges are
partial (a 3000x1000x2000 matmul with 128x128x16 tiles and 8x8 interleaved register tiles: the
last k strip has 8 steps, the last column block's threads 4..15 one of their two column
groups), isl puts ``min`` bounds and guards below the mark, and the band used to go back to
isl's unrolling: one AST per partial shape, ~1,000 user nodes per kernel and 8-15 s of
compile time.

`split_partial` instead splits the subtree of such a mark by its prefix (the values of the
schedule above it, the block and thread parameters included): a prefix is *full* when every
statement below the mark runs at it at every value of the subtree's schedule that it takes at
any prefix (`full_and_partial`), *partial* otherwise. A sequence node with the two filters goes
above the mark (all instances of one prefix are on the same side, so no order changes): the
full side keeps its ``unroll`` marks and, as in a size the tiles divide, has constant trip
counts and no guard (the inner loop of a full tile stays straight-line FMAs on registers); the
partial side's marks become ``unroll-partial`` (`PARTIAL_MARK`) and its bands ``atomic`` (one
loop nest for every partial shape), whose loops may have ``min`` bounds and guards: the code
generator (`codegen.lower`) runs each such loop over its largest trip count
(`llvm_unroll.trip_bound`) with the loop's own condition as a guard, and LLVM unrolls it
fully where it indexes registers (`llvm_unroll.indexes_registers`; a partial k strip stays a
loop), so the registers are still indexed by constants.
"""

from __future__ import annotations

import islpy as isl

from .llvm_unroll import PARTIAL_MARK
from .tree import node_at

__all__ = ["full_and_partial", "prefix_map", "split_partial"]

_T = isl.schedule_node_type
_PASS = (_T.mark, _T.sequence, _T.set, _T.context)


def _maps(umap: isl.UnionMap) -> list[isl.Map]:
    out: list[isl.Map] = []
    umap.foreach_map(out.append)
    return out


def prefix_map(schedule: isl.Schedule, path: tuple[int, ...]) -> isl.UnionMap | None:
    """The statement instances that reach the node at ``path`` mapped to the values of the
    bands above it (isl's prefix schedule, here also below extension nodes: an instance an
    extension introduces takes the prefix values the extension maps to it); None when an
    expansion or contraction node lies above."""
    node = schedule.get_root()
    if node.get_type() != _T.domain:
        return None
    dom = node.domain_get_domain()
    zero = isl.Set.universe(isl.Space.set_alloc(dom.get_ctx(), 0, 0)).align_params(dom.get_space())
    pfx = isl.UnionMap.from_domain_and_range(dom, isl.UnionSet.from_set(zero))
    for pos in path:
        kind = node.get_type()
        if kind == _T.band:
            pfx = pfx.flat_range_product(
                isl.UnionMap.from_multi_union_pw_aff(node.band_get_partial_schedule()))
        elif kind == _T.filter:
            pfx = pfx.intersect_domain(node.filter_get_filter())
        elif kind == _T.extension:
            pfx = pfx.union(node.extension_get_extension().reverse())
        elif kind not in _PASS and kind != _T.domain:
            return None
        node = node.child(pos)
    return pfx


def _plain_subtree(node: isl.ScheduleNode) -> bool:
    """No extension, expansion or contraction node in the subtree of ``node`` (its subtree
    schedule then covers the instances of the prefix map)."""
    bad: list[bool] = []

    def visit(n: isl.ScheduleNode) -> bool:
        if n.get_type() in (_T.extension, _T.expansion):
            bad.append(True)
        return not bad

    node.foreach_descendant_top_down(visit)
    return not bad


def _from_least(at: isl.Map) -> isl.Map:
    """``at`` (prefix -> values) with each value shifted by its least value at the same prefix:
    a loop over one thread's elements (``n = 16 * _bx + _tx``, a thread-strided loop) takes
    the same relative values in every thread; a partial tile, which the matrix's edge cuts,
    fewer."""
    d = at.dim(isl.dim_type.out)
    least = isl.PwAffList.alloc(at.get_ctx(), d)
    for j in range(d):
        one = at.project_out(isl.dim_type.out, j + 1, d - j - 1).project_out(isl.dim_type.out, 0, j)
        least = least.add(one.lexmin_pw_multi_aff().get_pw_aff(0))
    shift = isl.Map.from_multi_pw_aff(isl.MultiPwAff.from_pw_aff_list(at.get_space(), least))
    return at.sum(shift.neg())


def full_and_partial(schedule: isl.Schedule, path: tuple[int, ...]
                     ) -> tuple[isl.UnionSet, isl.UnionSet] | None:
    """(full, partial) instances of the subtree at ``path`` (module docstring), or None when
    the prefix schedule cannot be computed there."""
    node = node_at(schedule, path)
    pfx = prefix_map(schedule, path)
    if pfx is None or not _plain_subtree(node):
        return None
    sub = node.get_subtree_schedule_union_map().intersect_domain(pfx.domain())
    present: isl.Set | None = None
    partial: isl.Set | None = None
    for stmt in _maps(pfx):
        for values in _maps(sub.intersect_domain(isl.UnionSet.from_set(stmt.domain()))):
            at = _from_least(stmt.reverse().apply_range(values))  # prefix -> relative values
            # the values the statement takes at any prefix and any parameter value (a thread's
            # position is a parameter: the threads of a partial tile have fewer)
            box = at.range()
            box = box.project_out(isl.dim_type.param, 0, box.dim(isl.dim_type.param))
            box = box.align_params(at.get_space())
            where = at.domain()
            missing = isl.Map.from_domain_and_range(where, box).subtract(at).domain()
            present = where if present is None else present.union(where)
            partial = missing if partial is None else partial.union(missing)
    if present is None or partial is None:
        return None
    full = present.subtract(partial).coalesce()
    full_inst = pfx.intersect_range(isl.UnionSet.from_set(full)).domain()
    partial_inst = pfx.intersect_range(isl.UnionSet.from_set(partial.coalesce())).domain()
    return full_inst, partial_inst


def _rename_marks(node: isl.ScheduleNode, old: str, new: str) -> isl.ScheduleNode:
    """``node`` with the marks named ``old`` in its subtree (itself included) named ``new``
    (the same user object); returned at the same position."""
    if node.get_type() == _T.mark and node.mark_get_id().get_name() == old:
        ident = node.mark_get_id()
        node = node.delete()
        if node.get_type() == _T.band:
            for m in range(node.band_n_member()):
                node = node.band_member_set_ast_loop_type(m, isl.ast_loop_type.atomic)
        node = node.insert_mark(isl.Id(new, user=ident.user, context=node.get_ctx()))
    for i in range(node.n_children()):
        node = _rename_marks(node.child(i), old, new).parent()
    return node


def split_partial(schedule: isl.Schedule, mark: str) -> isl.Schedule | None:
    """``schedule`` with the subtree of each outermost mark named ``mark`` split into its full
    and partial tiles (module docstring); None when no such mark has partial tiles."""
    found: list[tuple[int, ...]] = []

    def visit(n: isl.ScheduleNode, path: tuple[int, ...]) -> None:  # (no isl callback)
        if n.get_type() == _T.mark and n.mark_get_id().get_name() == mark:
            found.append(path)
            return
        for i in range(n.n_children()):
            visit(n.child(i), (*path, i))

    visit(schedule.get_root(), ())
    changed = False
    for path in found:  # (a split changes paths below its mark only)
        parts = full_and_partial(schedule, (*path, 0))
        if parts is None or parts[1].is_empty():
            continue
        full, partial = parts
        node = node_at(schedule, path)
        if full.is_empty():  # every tile partial (a matrix smaller than one tile)
            schedule = _rename_marks(node, mark, PARTIAL_MARK).get_schedule()
        else:
            filters = isl.UnionSetList.alloc(node.get_ctx(), 2).add(full).add(partial)
            node = node.insert_sequence(filters)
            schedule = _rename_marks(node.child(1).child(0), mark, PARTIAL_MARK).get_schedule()
        changed = True
    return schedule if changed else None
